"""The node side: what runs inside each node (launch, roles, the training transport and its wire format)."""

"""edgebed-flower: FedAvg on MNIST, a Flower app run unmodified by edgebed."""

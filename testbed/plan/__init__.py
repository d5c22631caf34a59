"""The plan: what a scenario means as a cluster (nodes, profiles, addresses, links) and its topology of sites and WAN links."""

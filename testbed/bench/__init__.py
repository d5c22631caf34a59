"""Benchmarks: link fidelity, the suite against Mininet and Flower, soak runs."""

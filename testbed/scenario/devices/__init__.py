"""edgebed's device catalog (catalog.yaml, package data; its sources in README.md) and the code
that reads it and users' entries (catalog.py)."""

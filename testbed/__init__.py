"""edgebed: a containerized edge-cluster emulation testbed for distributed deep learning."""

__version__ = "0.1.0"

"""The docker runtime: one container per node on a bridge network of the run's own."""

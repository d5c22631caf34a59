"""The swarm runtime: a run's nodes as Docker Swarm services over several hosts, and the lab."""

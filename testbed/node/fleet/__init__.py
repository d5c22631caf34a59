"""A fleet host: many devices served by one container's process (runtime swarm's fleets)."""

"""The netns runtime: each node a network namespace plus a cgroup on this host (Mininet's host)."""

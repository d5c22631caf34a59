"""Kernel mechanisms the runtimes use: link shaping (HTB, TBF, IFB, netem), netlink, BPF classifiers, cgroups."""

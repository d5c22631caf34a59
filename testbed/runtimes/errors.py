"""What a runtime says when it cannot run here: a module that imports only the error root, so any
runtime module (engines, hosts) may raise it without importing the package's runtime registry."""

from testbed.errors import HostCannot


class RuntimeUnavailable(HostCannot):
    pass

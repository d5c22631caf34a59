"""What a runtime says when it cannot run here: its own module, which imports nothing, so any
runtime module (engines, hosts) may raise it without importing the package's runtime registry."""


class RuntimeUnavailable(RuntimeError):
    pass

"""An example edgebed plugin package (see ../pyproject.toml for how it registers)."""

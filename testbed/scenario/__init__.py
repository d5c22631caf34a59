"""The scenario: the YAML schema users write (schema.py) and its units (units.py). Validation is pure: it contacts no engine."""

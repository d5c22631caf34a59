"""The scenario: the YAML schema users write (models.py and its parts, checks.py, loading.py;
schema.py gathers their names) and its units (units.py). Validation is pure: it contacts no engine."""

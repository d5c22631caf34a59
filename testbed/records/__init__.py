"""A run's records: column names, the writer (metrics.py), the reader (reader.py) and the plots."""

"""Training data: datasets, partitions, models, data injection, and streaming through a broker."""

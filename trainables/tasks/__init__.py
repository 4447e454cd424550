"""Tasks: data generators, splits with roles, metrics. One module per task."""

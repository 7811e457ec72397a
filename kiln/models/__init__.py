"""kiln.models: a small bundled model zoo (being written)."""

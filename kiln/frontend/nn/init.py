"""kiln.nn.init (being written)."""

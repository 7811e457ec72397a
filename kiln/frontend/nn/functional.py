"""kiln.nn.functional (being written)."""

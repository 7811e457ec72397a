"""kiln.nn layers (being written)."""

__all__: list[str] = []

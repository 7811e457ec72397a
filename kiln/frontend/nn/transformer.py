"""kiln.nn transformer (being written)."""

__all__: list[str] = []

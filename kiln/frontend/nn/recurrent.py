"""kiln.nn recurrent (being written)."""

__all__: list[str] = []

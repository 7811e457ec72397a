"""kiln: export and compile ML models."""

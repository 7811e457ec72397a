"""Runtime for compiled artifacts: package format, loader, input validation (issue 7)."""

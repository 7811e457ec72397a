"""Regression cases the differential fuzzer (tests/fuzz) found, each shrunk by hypothesis to a small program and its
inputs, kept as a readable test that passes since the fix (or is marked xfail with the reason it is not fixed)."""

"""The C backend's attention fusion: kiln/codegen/attention.py's fused kernel, applied after scheduling unless FUSE is
off; render._attention renders it (a thread takes a batch entry and a block of KILN_MR queries, its score rows in a
cache-resident buffer: benchmarks/attention_fusion.py, docs/c-backend.md)."""

from __future__ import annotations

from kiln.codegen import attention
from kiln.codegen.kernels import Schedule

FUSE = True  # benchmarks/attention_fusion.py turns it off to time the separate kernels


def fuse_attention(schedule: Schedule) -> Schedule:
    """`schedule` with its attention chains fused (in place; returns it), or as it is when FUSE is off."""
    return attention.fuse_attention(schedule) if FUSE else schedule

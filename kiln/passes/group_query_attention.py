"""Grouped-query attention: attention over keys and values repeated per query head reads the unrepeated ones.

Hugging Face's decoders with fewer key/value heads than query heads (Llama, Mistral, Qwen: grouped-query attention)
repeat each key and value head for its group of query heads before `scaled_dot_product_attention` (`repeat_kv`:
`k[:, :, None].expand(b, kv, rep, s, e).reshape(b, kv * rep, s, e)`). Compiled as written, that reshape copies the
keys and values, the whole KV cache of every layer at every decode step. This pass gives the attention the
unrepeated keys and values with `enable_gqa=True` (torch's own flag for it, same function: query head h reads key
head h // rep), and the attention's decomposition multiplies each key head by the rows of its whole group of query
heads at once, so nothing is copied.
"""

from __future__ import annotations

from typing import Any

from kiln.ir.registry import ops
from kiln.passes.base import register_pass
from kiln.passes.rewrite import RewritePass, pattern, producer

aten = ops.aten


def _unrepeated(value: Any) -> tuple[Any, int] | None:
    """(x, repeats) when `value` is x [..., KV, S, E] with each head repeated `repeats` times in place, as
    `x.unsqueeze(-3).expand(..., KV, repeats, S, E).reshape(..., KV * repeats, S, E)` (a clone allowed before the
    reshape); else None."""
    reshape = producer(value, aten.view.default, aten.reshape.default, aten._unsafe_view.default)
    if reshape is None:
        return None
    inner = reshape.args[0]
    clone = producer(inner, aten.clone.default)
    expand = producer(clone.args[0] if clone is not None else inner, aten.expand.default)
    unsqueeze = producer(expand.args[0], aten.unsqueeze.default) if expand is not None else None
    if unsqueeze is None:
        return None
    x = unsqueeze.args[0]
    shape = list(x.type.shape)
    rank = len(shape)
    if rank < 3 or unsqueeze.args[1] % (rank + 1) != rank - 2:  # the new dim right after the heads
        return None
    sizes = list(expand.args[1])
    repeats = sizes[rank - 2] if len(sizes) == rank + 1 else None
    kept = sizes[:rank - 2] + sizes[rank - 1:]
    if not isinstance(repeats, int) or repeats < 1 or \
            not all(size == -1 or size is dim or size == dim for size, dim in zip(kept, shape)):
        return None
    heads = shape[-3]
    wanted = [*shape[:-3], heads * repeats, *shape[-2:]]
    target = list(reshape.args[1])
    if len(target) != rank or any(not (t is w or t == w or (t == -1 and k == rank - 3))
                                  for k, (t, w) in enumerate(zip(target, wanted))):
        return None
    return x, repeats


@register_pass
class GroupQueryAttention(RewritePass):
    """scaled_dot_product_attention(q, repeat_kv(k), repeat_kv(v)) -> scaled_dot_product_attention(q, k, v,
    enable_gqa=True)."""

    name = "group-query-attention"

    @pattern(aten.scaled_dot_product_attention.default)
    def unrepeat(self, query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                 is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:
        keys, values = _unrepeated(key), _unrepeated(value)
        if enable_gqa or keys is None or values is None or keys[1] != values[1] or keys[1] == 1:
            return None
        (key, repeats), (value, _) = keys, values
        query_shape, key_shape = list(query.type.shape), list(key.type.shape)
        if len(query_shape) != len(key_shape) or not isinstance(query_shape[-3], int) or \
                not isinstance(key_shape[-3], int) or query_shape[-3] != key_shape[-3] * repeats:
            return None
        return aten.scaled_dot_product_attention.default(query, key, value, attn_mask, dropout_p, is_causal,
                                                         scale=scale, enable_gqa=True)

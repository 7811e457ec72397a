"""group-query-attention: attention over keys and values repeated per query head (Hugging Face's repeat_kv) reads
the unrepeated ones with enable_gqa=True; the program computes what it did (interpreter, C) and torch's sdpa agrees,
and the C package then neither repeats nor transposes the keys and values (a KV cache read where it lies)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import kiln
from kiln.ir.program import GraphBuilder
from kiln.ir.types import TensorType
from kiln.ir import dtypes
from kiln.passes import run as run_passes
from kiln.testing import assert_close

torch = pytest.importorskip("torch")
aten = kiln.ops.aten
HEADS, KV_HEADS, LENGTH, SOURCE, DIM = 6, 2, 3, 5, 4


def _repeat_kv(x, repeats, clone=True):
    """Hugging Face's repeat_kv: x[:, :, None].expand(b, kv, repeats, s, e).reshape(b, kv * repeats, s, e)."""
    b, kv, s, e = x.type.shape
    grown = aten.expand.default(aten.unsqueeze.default(x, 2), [b, kv, repeats, s, e])
    return aten.view.default(aten.clone.default(grown) if clone else grown, [b, kv * repeats, s, e])


def _program(mask: bool = False, repeats: int = HEADS // KV_HEADS, kv_dim: int = 2, is_causal: bool = False):
    """sdpa(q, repeat_kv(k), repeat_kv(v)[, mask]) over inputs q [2, H, L, E], k and v [2, KV, S, E]."""
    builder = GraphBuilder()
    heads = HEADS if kv_dim == 2 else KV_HEADS  # repeated along the sequence, the heads stay as they are
    q = builder.add_input("q", TensorType.of([2, heads, LENGTH, DIM], dtypes.float32))
    k = builder.add_input("k", TensorType.of([2, KV_HEADS, SOURCE, DIM], dtypes.float32))
    v = builder.add_input("v", TensorType.of([2, KV_HEADS, SOURCE, DIM], dtypes.float32))
    m = builder.add_input("mask", TensorType.of([LENGTH, SOURCE], dtypes.bool_)) if mask else None
    with builder:
        if kv_dim == 2:
            keys, values = _repeat_kv(k, repeats), _repeat_kv(v, repeats, clone=False)
        else:  # repeated along the sequence instead: not repeat_kv
            grown, merged = [2, KV_HEADS, SOURCE, repeats, DIM], [2, KV_HEADS, SOURCE * repeats, DIM]
            keys, values = (aten.view.default(aten.clone.default(
                aten.expand.default(aten.unsqueeze.default(x, 3), grown)), merged) for x in (k, v))
        out = aten.scaled_dot_product_attention.default(q, keys, values, m, is_causal=is_causal)
    return builder.build([out])


def _inputs(mask: bool = False):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(shape).astype(np.float32)
              for shape in ([2, HEADS, LENGTH, DIM], [2, KV_HEADS, SOURCE, DIM], [2, KV_HEADS, SOURCE, DIM])]
    if mask:
        arrays.append(np.tril(np.ones((LENGTH, SOURCE), bool), k=1))
    return arrays


def _ops(program) -> list[str]:
    return [op.opdef.name for op in program.body.ops if hasattr(op, "opdef")]


@pytest.mark.parametrize("mask, is_causal", [(False, False), (True, False), (False, True)],
                         ids=["no mask", "bool mask", "causal"])
def test_repeated_keys_become_grouped_query_attention(mask, is_causal):
    program = _program(mask, is_causal=is_causal)
    rewritten = run_passes(program, "group-query-attention,dce")
    attention = next(op for op in rewritten.body.ops if getattr(op, "opdef", None) is not None
                     and op.opdef.name == "aten.scaled_dot_product_attention.default")
    assert attention.operands[1] is rewritten.body.args[1] and attention.operands[2] is rewritten.body.args[2]
    assert "aten.expand.default" not in _ops(rewritten)
    arrays = _inputs(mask)
    assert_close(rewritten(*arrays), program(*arrays))
    q, k, v = (torch.from_numpy(a) for a in arrays[:3])
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=torch.from_numpy(arrays[3]) if mask else None, is_causal=is_causal, enable_gqa=True)
    assert_close(rewritten(*arrays), expected.numpy())


@pytest.mark.parametrize("kwargs", [{"kv_dim": 3}, {"repeats": 1}], ids=["repeated along the sequence", "once"])
def test_other_repeats_are_left_alone(kwargs):
    program = _program(**kwargs) if kwargs.get("repeats") != 1 else None
    if program is None:  # one repeat: the heads already match, nothing to group
        builder = GraphBuilder()
        q, k, v = (builder.add_input(n, TensorType.of([2, KV_HEADS, LENGTH, DIM], dtypes.float32)) for n in "qkv")
        with builder:
            out = aten.scaled_dot_product_attention.default(q, _repeat_kv(k, 1), _repeat_kv(v, 1))
        program = builder.build([out])
    rewritten = run_passes(program, "group-query-attention")
    assert _ops(rewritten) == _ops(program)


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_compiled_grouped_attention_reads_the_keys_where_they_lie(tmp_path):
    """kiln.compile's pipeline groups the attention: one fused attention kernel reads the keys and values from the
    program's inputs as they lie (no kernel repeats or transposes them), and the result is the interpreter's."""
    from kiln.codegen.c.package import TARGET, plan
    from kiln.codegen.driver import DEFAULT_PIPELINE
    from kiln.codegen.legalize import legalize
    program = _program(mask=True)
    compiled = kiln.compile(program, output=tmp_path / "pkg")
    arrays = _inputs(mask=True)
    assert_close(compiled(*arrays), program(*arrays))
    schedule = plan(legalize(run_passes(program, DEFAULT_PIPELINE), TARGET))
    attention, = [kernel for kernel in schedule.kernels if kernel.kind == "attention"]
    assert [attention.detail.k[0].name, attention.detail.v[0].name] == ["k", "v"]
    assert {buf.kind for buf in (attention.detail.k[0], attention.detail.v[0])} == {"input"}

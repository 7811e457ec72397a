"""kiln.Tensor against torch: the same expression, written once for both namespaces, eager and exported."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir.errors import DataDependentError, KilnError

torch = pytest.importorskip("torch")


def _inputs(ns, *shapes_dtypes):
    """The same random inputs as kiln and torch tensors."""
    rng = np.random.default_rng(0)
    arrays = []
    for shape, dtype in shapes_dtypes:
        if dtype == "bool":
            arrays.append(rng.random(shape) < 0.5)
        elif dtype.startswith("int"):
            arrays.append(rng.integers(-5, 5, shape).astype(dtype))
        else:
            arrays.append(rng.standard_normal(shape).astype(dtype))
    if ns is torch:
        return [torch.from_numpy(a.copy()) for a in arrays]
    return [kiln.from_numpy(a.copy()) for a in arrays]


F32 = "float32"
# (id, inputs as (shape, dtype), expression over (namespace, *tensors))
CASES = [
    ("add_scalar", [((3, 4), F32)], lambda m, x: x + 1),
    ("radd_rsub_rmul", [((3, 4), F32)], lambda m, x: 2 - x * 3 + (1 + x)),
    ("rtruediv", [((3, 4), F32)], lambda m, x: 1.5 / (x.abs() + 1)),
    ("int_float_promotion", [((3, 4), "int32")], lambda m, x: x * 2.5 + 1),
    ("int_floordiv_mod", [((3, 4), "int64")], lambda m, x: (x // 3, x % 3, 7 // (x.abs() + 1))),
    ("pow", [((3, 4), F32)], lambda m, x: (x.abs() ** 0.5, 2 ** x, x.pow(2))),
    ("compare_logic", [((3, 4), F32), ((4,), F32)], lambda m, x, y: ((x > y) & (x < 1), ~(x >= 0), x == y)),
    ("broadcast_ops", [((2, 3, 4), F32), ((3, 1), F32)], lambda m, x, y: x * y - y),
    ("matmul", [((2, 3, 4), F32), ((4, 5), F32)], lambda m, x, y: x @ y),
    ("unary_chain", [((3, 4), F32)], lambda m, x: (x.exp().log1p().sqrt(), x.sigmoid(), x.tanh(), x.sin().cos())),
    ("view_permute", [((2, 3, 4), F32)], lambda m, x: x.view(6, 4).t().reshape(2, -1).permute(1, 0)),
    ("transpose_flatten", [((2, 3, 4), F32)], lambda m, x: x.transpose(0, 2).flatten(1).unsqueeze(0).squeeze(0)),
    ("expand_repeat", [((3, 1), F32)], lambda m, x: (x.expand(3, 4), x.repeat(2, 3), x.expand(2, -1, 5))),
    ("chunk_split", [((6, 4), F32)], lambda m, x: (*x.chunk(3), *x.split(4), *x.split([1, 5]))),
    ("unbind_stack_cat", [((3, 4), F32)], lambda m, x: (m.stack(x.unbind(0), 1), m.cat([x, x * 2], -1))),
    ("reductions", [((3, 4, 5), F32)],
     lambda m, x: (x.sum(), x.sum(1), x.mean((0, 2), keepdim=True), x.amax(-1), x.var(1), x.std(0),
                   x.max(1).values, x.max(1).indices, x.argmin(2), x.prod(0))),
    ("any_all", [((3, 4), "bool")], lambda m, x: (x.any(), x.all(1), x.any(0, keepdim=True))),
    ("softmax", [((3, 4), F32)], lambda m, x: (x.softmax(-1), x.log_softmax(0))),
    ("cumsum_topk_sort", [((3, 6), F32)], lambda m, x: (x.cumsum(1), x.topk(2).values, x.sort(1).values)),
    ("where_masked_fill_clamp", [((3, 4), F32)],
     lambda m, x: (m.where(x > 0, x, 0.5), x.masked_fill(x < 0, -1.0), x.clamp(-0.5, 0.5), x.clamp(min=0))),
    ("to_dtype", [((3, 4), F32)], lambda m, x: (x.to(m.float16), x.long(), x.double(), x.type_as(x.int()))),
    ("basic_indexing", [((4, 5, 6), F32)],
     lambda m, x: (x[1], x[:, 2], x[..., -1], x[1:3, ::2], x[None, :, 1], x[-1, 1:-1, 2:])),
    ("advanced_indexing", [((4, 5), F32)],
     lambda m, x: (x[m.tensor([0, 2, 3])], x[:, m.tensor([4, 0])], x[m.tensor([1, 2]), m.tensor([0, 3])])),
    ("bool_mask_indexing", [((4, 5), F32)], lambda m, x: x[x > 0]),
    ("factories", [((3, 4), F32)],
     lambda m, x: (m.zeros(2, 3) + m.ones(2, 3), m.full((2,), 3.0), m.arange(5), m.arange(1, 7, 2),
                   m.zeros_like(x), m.ones_like(x, dtype=m.int64), x.new_zeros(2))),
]


@pytest.mark.parametrize("name,specs,fn", CASES, ids=[c[0] for c in CASES])
def test_eager_matches_torch(name, specs, fn):
    kiln_out = fn(kiln, *_inputs(kiln, *specs))
    torch_out = fn(torch, *_inputs(torch, *specs))
    _assert_same(kiln_out, torch_out, name)


def _assert_same(kiln_out, torch_out, where):
    if isinstance(torch_out, (tuple, list)):
        assert len(kiln_out) == len(torch_out), where
        for a, b in zip(kiln_out, torch_out):
            _assert_same(a, b, where)
        return
    actual = torch.from_numpy(np.array(kiln_out.numpy(), copy=True, order="C"))
    torch.testing.assert_close(actual, torch_out, equal_nan=True, msg=lambda m: f"{where}: {m}")


class _Expression(kiln.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *inputs):
        return self.fn(kiln, *inputs)


DATA_DEPENDENT = {"bool_mask_indexing"}


@pytest.mark.parametrize("name,specs,fn", CASES, ids=[c[0] for c in CASES])
def test_exported_program_matches_eager(name, specs, fn):
    inputs = _inputs(kiln, *specs)
    program = kiln.export(_Expression(fn), tuple(inputs))
    expected = fn(kiln, *_inputs(kiln, *specs))
    got = program(*inputs)
    flat_expected = expected if isinstance(expected, (tuple, list)) else [expected]
    flat_got = got if isinstance(got, (tuple, list)) else [got]
    for a, b in zip(flat_got, flat_expected):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)
    assert not any(op.name.endswith("_") for op in program.nodes()), "in-place ops must be functionalized"


def test_in_place_ops_eager_and_traced():
    def body(m, x):
        y = x.clone()
        y.add_(1).mul_(2)
        y[0] = 0.0
        y[:, 1] += 5
        y.clamp_(max=6)
        return y

    inputs_k, inputs_t = _inputs(kiln, ((3, 4), F32)), _inputs(torch, ((3, 4), F32))
    _assert_same(body(kiln, *inputs_k), body(torch, *inputs_t), "in-place")
    program = kiln.export(_Expression(body), tuple(inputs_k))
    _assert_same(program(*inputs_k), body(torch, *inputs_t), "in-place exported")


def test_eager_in_place_updates_numpy_views():
    array = np.zeros(4, np.float32)
    tensor = kiln.from_numpy(array)
    tensor.add_(2)
    assert array.tolist() == [2, 2, 2, 2]


def test_data_dependent_python_values_are_refused_while_tracing():
    class Branchy(kiln.nn.Module):
        def forward(self, x):
            return x * x.sum().item()

    with pytest.raises(DataDependentError, match=r"(?s)Tensor.item\(\).*test_tensor.py:\d+.*kiln.cond"):
        kiln.export(Branchy(), (kiln.ones(3),))


def test_shape_properties_and_errors():
    x = kiln.zeros(2, 3, dtype=kiln.int32)
    assert x.shape == (2, 3) and x.size(-1) == 3 and x.dim() == 2 and x.numel() == 6 and x.dtype is kiln.int32
    assert kiln.tensor([1, 2]).dtype is kiln.int64 and kiln.tensor([1.5]).dtype is kiln.float32
    assert kiln.tensor([True]).dtype is kiln.bool
    with pytest.raises(KilnError):
        x.view(4, 4)
    with pytest.raises(KilnError):
        x[5]
    with pytest.raises(KilnError, match="ambiguous"):
        bool(x)


def test_manual_seed_makes_random_factories_reproducible():
    kiln.manual_seed(3)
    a = kiln.randn(4, 4)
    kiln.manual_seed(3)
    b = kiln.randn(4, 4)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert kiln.rand(1000).numpy().min() >= 0 and kiln.rand(1000).numpy().max() < 1


def test_data_aliases_and_reassigns_like_torch():
    torch = pytest.importorskip("torch")
    for module in (kiln.nn.Linear(3, 2), torch.nn.Linear(3, 2)):
        lib = kiln if isinstance(module, kiln.nn.Module) else torch
        with lib.no_grad():
            module.bias.data.zero_()  # in place through .data changes the parameter
            module.weight.data = lib.ones(2, 4)  # reassigning swaps the values, shape included
        assert list(module.weight.shape) == [2, 4] and float(module.weight.detach().sum()) == 8.0
        assert float(module.bias.detach().abs().sum()) == 0.0
        assert type(module.weight).__name__ == "Parameter"
    with pytest.raises(KilnError, match="data must be a Tensor"):
        kiln.nn.Linear(2, 2).weight.data = [[1.0, 2.0]]

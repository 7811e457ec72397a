"""float16 and bfloat16 in the C backend: stored as such, computed in float32 and rounded once per op, as ATen's CPU
kernels compute them (kiln/codegen/legalize.py `_in_float32`, kiln_math.h's conversions). Every op C claims, on
its registry samples made half precision, against torch eager at the dtype's default tolerances; the conversions on
every half value and on the float32 values around each rounding boundary, exactly; and a real model."""

from __future__ import annotations

import copy
import shutil

import numpy as np
import pytest

import kiln
from kiln.codegen.target import HALF_ARITHMETIC
from kiln.compiler import compile as compile_c
from kiln.ir import dtypes
from kiln.ir.errors import UnsupportedError
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import REGISTRY, ops
from kiln.ir.types import TensorType
from tests.ir.samples import SAMPLES
from tests.ir.test_ops import _torch_op, _trace_sample
from tests.runtime.test_c_backend import C_OPS
from tests.torch_oracle import assert_close_to_torch, requires_torch, to_numpy, to_torch, torch

pytestmark = [pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler"), requires_torch]
HALF = [dtypes.float16, dtypes.bfloat16]


def _in(dtype: dtypes.DType, value):
    """A sample's float32 and half-precision arrays in `dtype`; everything else as it is."""
    if isinstance(value, np.ndarray) and value.dtype in (np.float32, *[d.numpy for d in HALF]):
        return value.astype(dtype.numpy)
    if isinstance(value, list):
        return [_in(dtype, v) for v in value]
    if isinstance(value, tuple):
        return tuple(_in(dtype, v) for v in value)
    return value


def _half_samples(name: str, dtype: dtypes.DType):
    """The op's samples whose float tensors are float32 (made `dtype`), of dtypes C stores, and non-empty."""
    for sample in SAMPLES[name](np.random.default_rng(0)):
        arrays = [v for v in [*sample.args, *sample.kwargs.values(), *[x for a in sample.args if isinstance(a, list)
                                                                          for x in a]] if isinstance(v, np.ndarray)]
        if not sample.check_values or not any(a.dtype == np.float32 for a in arrays) or \
                any(a.dtype not in (np.float32, np.int64, np.bool_) or a.size == 0 for a in arrays):
            continue
        sample = copy.deepcopy(sample)
        sample.args = _in(dtype, sample.args)
        sample.kwargs = {k: _in(dtype, v) for k, v in sample.kwargs.items()}
        yield sample


# kiln's own meta rules take only float32 and float64 here (torch's half kernels exist for some argument forms only)
IR_REFUSES_HALF = {"aten._cdist_forward.default", "aten._pdist_forward.default"}
HALF_OPS = [name for name in C_OPS if name not in IR_REFUSES_HALF and any(True for _ in _half_samples(name, HALF[0]))]
# Ops whose half-precision ATen CPU kernel rounds inside (it accumulates or interpolates in the half dtype): C computes
# them in float32 and rounds once, as ATen's float32 kernel would, so eager half results differ from C's by a few of
# the dtype's ulps (C's are the nearer to the exact values).
EAGER_HALF_ROUNDS_INSIDE = {"aten._adaptive_avg_pool3d.default", "aten.grid_sampler_2d.default"}
# Ops C rounds inside as ATen's half kernel does (legalize.py's HALF_LEGALIZATIONS): they match eager, not float32
# rounded once
ROUNDS_AS_EAGER = {"aten._log_softmax.default"}


def _flat(value) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
@pytest.mark.parametrize("name", HALF_OPS)
def test_claimed_op_in_half_precision_matches_torch(name, dtype, tmp_path):
    """Up to two samples of each op C claims, with their float32 tensors made half precision, compiled for C, match
    torch's float32 kernel on the same values rounded to the half dtype once (the semantics C promises), and torch's
    own half kernel, but for ops that kernel rounds inside; both at the dtype's default tolerances. Refused forms
    are passed over; at least one must compile, but for the ops C refuses on purpose."""
    compiled, refusals = 0, []
    for sample in _half_samples(name, dtype):
        if compiled == 2:
            break
        op, args, kwargs = _torch_op(name), to_torch(sample.args), to_torch(sample.kwargs)
        try:
            eager = _flat(op(*copy.deepcopy(args), **copy.deepcopy(kwargs)))
        except (RuntimeError, NotImplementedError):  # torch has no CPU kernel of this op for the dtype (cdist)
            continue
        widened = op(*to_torch(_in(dtypes.float32, sample.args)), **to_torch(_in(dtypes.float32, sample.kwargs)))
        once = tuple(w.to(e.dtype) for w, e in zip(_flat(widened), eager))
        try:
            program, inputs = _trace_sample(REGISTRY[name], copy.deepcopy(sample), decompose=False)
            model = compile_c(program, output=tmp_path / f"sample{compiled}")
        except UnsupportedError as error:
            refusals.append(error.cause)
            continue
        got = _flat(model(*inputs))
        if name not in ROUNDS_AS_EAGER:
            assert_close_to_torch(got, once, where=f"{name} {dtype.name} {sample} (float32, rounded once)")
        if name not in EAGER_HALF_ROUNDS_INSIDE:
            assert_close_to_torch(got, eager, where=f"{name} {dtype.name} {sample} (torch's {dtype.name} kernel)")
        compiled += 1
    if name in HALF_ARITHMETIC:  # (a sample computing in another dtype, prod's dtype=float64, compiles)
        assert any(f"{dtype.name} is computed in float32 here" in r for r in refusals), refusals
    elif not compiled and not refusals:
        pytest.skip(f"torch has no {dtype.name} CPU kernel for any sample")
    else:
        assert compiled, f"no {dtype.name} sample of {name} compiled for C: {refusals[0]}"


def _conversion(source: dtypes.DType, target: dtypes.DType):
    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of([builder.shape_env.create_symbol(8, name="n")], source))
    with builder:
        y = ops.aten._to_copy.default(x, dtype=target)
    return compile_c(builder.build([y]))


def _torch_bits(values: np.ndarray, dtype: dtypes.DType) -> np.ndarray:
    """torch's conversion of `values` to `dtype`, as the result's bits."""
    source = torch.from_numpy(values.view(np.int16)).view(getattr(torch, values.dtype.name)) \
        if values.dtype.itemsize == 2 else torch.from_numpy(values)  # (bits as they are: to_torch's path quiets NaNs)
    converted = source.to(getattr(torch, dtype.name))
    return converted.view(torch.int16 if dtype.itemsize == 2 else torch.int32).numpy()


@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
def test_every_half_value_converts_to_float32_as_torch(dtype):
    """All 65,536 values, NaNs with their payloads and signs included: bit for bit."""
    values = np.arange(1 << 16, dtype=np.uint16).view(dtype.numpy)
    got = _conversion(dtype, dtypes.float32)(values)
    np.testing.assert_array_equal(got.view(np.int32), _torch_bits(values, dtypes.float32))


@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
def test_float32_rounds_to_half_precision_as_torch(dtype):
    """float32 values at and beside every rounding boundary of the half dtype (each half value and each midpoint
    between neighbours, and one float32 ulp either side), float32's extremes and subnormals, infinities and NaNs of
    both signs: bit for bit as torch rounds them."""
    halves = np.arange(1 << 16, dtype=np.uint16).view(dtype.numpy).astype(np.float32)
    halves = np.unique(halves[np.isfinite(halves)])
    midpoints = ((halves[:-1].astype(np.float64) + halves[1:]) / 2).astype(np.float32)
    extremes = np.array([3.4e38, -3.4e38, 1e-45, -1e-45, 1e-40, -1e-40], dtype=np.float32)
    centres = np.concatenate([halves, midpoints, extremes])
    values = np.concatenate([centres, np.nextafter(centres, np.float32(-np.inf)),
                             np.nextafter(centres, np.float32(np.inf)),
                             np.array([np.inf, -np.inf, np.nan, -np.nan], dtype=np.float32)])
    got = _conversion(dtypes.float32, dtype)(values)
    np.testing.assert_array_equal(got.view(np.int16), _torch_bits(values, dtype))


SCALAR_OPERANDS = {
    "add a scalar": lambda x: x + 0.1, "subtract from a scalar": lambda x: 0.7 - x,
    "add a float32 0-d tensor": lambda x: x + torch.tensor(0.1), "add with alpha": lambda x: torch.add(x, x, alpha=0.3),
    "multiply by a scalar": lambda x: x * 0.1, "divide by a scalar": lambda x: x / 0.3,
    "divide by a float32 0-d tensor": lambda x: x / torch.tensor(0.3),
    "floor-divide by a scalar": lambda x: torch.div(x, 0.3, rounding_mode="floor"),
    "log_softmax over the last dim": lambda x: torch.log_softmax(x, -1),
}


@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
@pytest.mark.parametrize("case", SCALAR_OPERANDS)
def test_rounds_where_aten_rounds(case, dtype):
    """ATen reads add's and sub's scalars (and alpha, and a float32 0-d tensor) in the half dtype but mul's and div's in
    float32, and keeps log_softmax's exp-sum and log in the half dtype: C reads and rounds them so, bit for bit equal
    to eager on 4,096 values (reading 0.1 unrounded changed x + 0.1 by up to 102 ulps where it cancels)."""
    class Module(torch.nn.Module):
        def forward(self, x):
            return SCALAR_OPERANDS[case](x)
    torch.manual_seed(0)
    x = (torch.randn(64, 64) * 2).to(getattr(torch, dtype.name))
    got = compile_c(kiln.from_torch(Module(), (x,)))(to_numpy(x))
    torch.testing.assert_close(torch.from_numpy(got.astype(np.float32)).to(x.dtype), Module()(x), rtol=0, atol=0)


@pytest.mark.parametrize("shape", [(2, 0), (0, 3)])
def test_log_softmax_of_empty_half_rows(shape):
    """log_softmax over empty rows: the rounding rewrite takes each row's max, which ATen refuses for an empty row
    (the legalization failed with a ShapeError); such rows hold nothing to round, and compile as they are."""
    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of(list(shape), dtypes.float16))
    with builder:
        y = ops.aten._log_softmax.default(x, -1, False)
    got = compile_c(builder.build([y]))(np.zeros(shape, np.float16))
    assert got.shape == shape and got.dtype == np.float16


@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
@pytest.mark.parametrize("beta", [1.5, 0])
def test_addmm_with_zero_alpha_multiplies_the_product_by_zero(beta, dtype):
    """ATen's half-precision addmm with alpha=0 multiplies the product by 0, so an infinity in it gives NaN (float32's
    BLAS skips the product, and C did for half precision too: fuzz seed 16161); beta=0 still ignores the bias."""
    class Module(torch.nn.Module):
        def forward(self, bias, a, b):
            return torch.addmm(bias, a, b, beta=beta, alpha=0.0)
    half = getattr(torch, dtype.name)
    bias, a, b = torch.randn(3), torch.randn(2, 4), torch.randn(4, 3)
    a[0, 1], bias[2] = float("inf"), float("nan")
    args = tuple(t.to(half) for t in (bias, a, b))
    got = compile_c(kiln.from_torch(Module(), args))(*[to_numpy(t) for t in args])
    torch.testing.assert_close(torch.from_numpy(got.astype(np.float32)).to(half), Module()(*args), rtol=0, atol=0,
                               equal_nan=True)

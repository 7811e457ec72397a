"""Registry-driven op tests: every registered op against its meta rule, torch eager, and its decomposition."""

from __future__ import annotations

import copy
import pathlib
import re

import numpy as np
import pytest

from kiln.ir import dtypes
from kiln.ir.core_ops import CORE_ATEN_OPS
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import REGISTRY, OpOverload, ops, run_eager, split_bound
from kiln.ir.sparse import SparseArray
from kiln.ir.types import ScalarType, SymIntType, TensorType
from kiln.ir.verifier import flatten_meta
from tests.ir.samples import SAMPLES, TORCH_EQUIVALENTS, TORCH_SKIPS
from tests.torch_oracle import assert_close_to_torch, requires_torch, to_numpy, to_torch, torch

import kiln.ir.ops  # noqa: F401

ALL_OPS = sorted(REGISTRY)
KERNEL_OPS = [name for name in ALL_OPS if REGISTRY[name].kernel is not None]
DECOMPOSED_OPS = [name for name in ALL_OPS if REGISTRY[name].decomposition is not None]

# The composite ops exported models commonly contain; each needs a decomposition into core ops.
REQUIRED_COMPOSITES = [
    "aten.linear.default", "aten.conv1d.default", "aten.conv2d.default", "aten.conv_transpose1d.default",
    "aten.conv_transpose2d.input", "aten.matmul.default", "aten.baddbmm.default", "aten.layer_norm.default",
    "aten.group_norm.default", "aten.batch_norm.default", "aten.rms_norm.default", "aten.softmax.int",
    "aten.log_softmax.int", "aten.silu.default", "aten.hardswish.default", "aten.hardsigmoid.default",
    "aten.mish.default", "aten.scaled_dot_product_attention.default", "aten.dropout.default",
    "aten.flatten.using_ints", "aten.reshape.default", "aten.transpose.int", "aten.t.default",
    "aten.contiguous.default", "aten.chunk.default", "aten.split.Tensor", "aten.unbind.int", "aten.stack.default",
    "aten.einsum.default", "aten.max_pool2d.default", "aten.adaptive_avg_pool2d.default", "aten.pad.default",
    "aten.repeat_interleave.self_int", "aten.masked_fill.Scalar", "aten.masked_fill.Tensor",
    "aten.clamp_min.default", "aten.clamp_max.default", "aten.zeros.default", "aten.ones.default",
    "aten.arange.default", "aten.arange.start", "aten.to.dtype", "aten.lstm_cell.default", "aten.gru_cell.default",
]


# torch's bfloat16/float16 result for these ops depends on its kernel's accumulation order, and torch picks the kernel
# per ISA (oneDNN and ATen's vectorized kernels differ between AVX2 and AVX-512), so torch does not agree with itself
# across machines. For that op and dtype only, the comparison takes the tolerance torch's own tests use
# ({op: {dtype: (rtol, atol)}}); every other op and dtype keeps torch.testing.assert_close's defaults.
#
# aten.convolution_backward, bfloat16: torch's OpInfo database (torch/testing/_internal/common_methods_invocations.py,
# nn.functional.conv2d / conv_transpose2d) has no bfloat16 override. torch's test of a grouped convolution's backward
# against per-group convolutions (test/nn/test_convolution.py::test_Conv2d_naive_groups, bfloat16 on CUDA) allows
# atol=dtype2prec_DONTUSE[torch.bfloat16] = 1e-1 (torch/testing/_internal/common_utils.py); rtol stays bfloat16's
# default 1.6e-2 so large elements keep a relative check. On the groups=4 sample kiln's grad_input is the float64
# answer correctly rounded, as is torch's under AVX-512; under AVX2 or torch's scalar kernels 82 of 144 elements are
# off by up to 0.006 * sum(|terms|) (under one bfloat16 eps, 0.09 at most), failing the default atol of 1e-5 where
# the terms cancel to ~0.
TORCH_REDUCED_PRECISION_TOLERANCES: dict[str, dict[str, tuple[float, float]]] = {
    "aten.convolution_backward.default": {"bfloat16": (1.6e-2, 1e-1)},
}


def _samples(name: str) -> list:
    generator = SAMPLES.get(name)
    assert generator is not None, f"{name} has no samples in tests/ir/samples/"
    return list(generator(np.random.default_rng(0)))


def test_every_core_aten_op_is_registered():
    listed = pathlib.Path(__file__).with_name("core_schemas_2_13.txt").read_text().split("\n")
    names = set()
    for line in filter(None, listed):
        match = re.match(r"aten::(\w+)(?:\.(\w+))?\(", line)
        names.add(f"aten.{match.group(1)}.{match.group(2) or 'default'}")
    assert names == CORE_ATEN_OPS and len(names) == 189
    missing = sorted(names - set(REGISTRY))
    assert not missing, f"{len(missing)} core ATen ops are not registered: {missing}"


@pytest.mark.parametrize("name", REQUIRED_COMPOSITES)
def test_required_composite_has_decomposition(name):
    assert name in REGISTRY, f"{name} is not registered"
    assert REGISTRY[name].decomposition is not None, f"{name} has no decomposition"


def test_registered_schemas_match_torch_core_schemas():
    """Core ops are registered with torch's exact schema text."""
    listed = pathlib.Path(__file__).with_name("core_schemas_2_13.txt").read_text().split("\n")
    for line in filter(None, listed):
        text = line.removeprefix("aten::")
        name = re.match(r"(\w+)(?:\.(\w+))?\(", text)
        key = f"aten.{name.group(1)}.{name.group(2) or 'default'}"
        if key in REGISTRY:
            assert REGISTRY[key].schema.text == text, f"{key}: {REGISTRY[key].schema.text} != {text}"


@pytest.mark.parametrize("name", ALL_OPS)
def test_op_has_samples(name):
    assert _samples(name), f"{name} has an empty sample list"


def _types_of(value):
    if isinstance(value, (np.ndarray, SparseArray)):
        return TensorType.of(value.shape, dtypes.dtype(value.dtype), getattr(value, "layout", None))
    if isinstance(value, list):
        return [_types_of(v) for v in value]
    return value


@pytest.mark.parametrize("name", KERNEL_OPS)
def test_meta_rule_matches_reference_kernel(name):
    """Meta on TensorTypes gives exactly the shapes and dtypes the kernel produces."""
    opdef = REGISTRY[name]
    for sample in _samples(name):
        bound = opdef.schema.bind(copy.deepcopy(sample.args), copy.deepcopy(sample.kwargs))
        typed = [_types_of(v) if a.type.is_tensor else v for a, v in zip(opdef.schema.arguments, bound)]
        meta = flatten_meta(opdef.meta(*typed))
        result = run_eager(opdef, opdef.schema.bind(copy.deepcopy(sample.args), copy.deepcopy(sample.kwargs)))
        flat = [result] if not isinstance(result, (list, tuple)) else list(_flatten(result))
        assert len(flat) == len(meta), f"{sample}: {len(flat)} results vs meta {len(meta)}"
        for produced, expected in zip(flat, meta):
            if isinstance(expected, TensorType):
                assert isinstance(produced, SparseArray if expected.is_sparse else np.ndarray), (
                    f"{sample}: expected a {expected.layout.kind} array")
                if expected.is_sparse:
                    assert produced.layout == expected.layout, f"{sample}: {produced.layout} vs {expected.layout}"
                assert dtypes.dtype(produced.dtype) is expected.dtype, f"{sample}: {produced.dtype} vs {expected}"
                if expected.is_static:
                    assert list(produced.shape) == list(expected.shape), f"{sample}: {produced.shape} vs {expected}"
            else:
                assert isinstance(expected, (SymIntType, ScalarType))


def _flatten(value):
    for item in value:
        if isinstance(item, (list, tuple)):
            yield from _flatten(item)
        else:
            yield item


def _torch_op(name: str):
    if name in TORCH_EQUIVALENTS:
        return TORCH_EQUIVALENTS[name](torch)
    namespace, op_name, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), op_name), overload)


@requires_torch
@pytest.mark.parametrize("name", ALL_OPS)
def test_against_torch(name):
    """Reference kernel (or, for meta-only ops, the meta rule) == torch.ops.aten on every sample."""
    if name in TORCH_SKIPS:
        pytest.skip(TORCH_SKIPS[name])
    opdef = REGISTRY[name]
    torch_op = _torch_op(name)
    for sample in _samples(name):
        expected = torch_op(*to_torch(copy.deepcopy(sample.args)), **to_torch(copy.deepcopy(sample.kwargs)))
        where = f"{name} {sample}"
        if opdef.kernel is None:
            bound = opdef.schema.bind(copy.deepcopy(sample.args), copy.deepcopy(sample.kwargs))
            typed = [_types_of(v) if a.type.is_tensor else v for a, v in zip(opdef.schema.arguments, bound)]
            meta = flatten_meta(opdef.meta(*typed))
            produced = [expected] if isinstance(expected, torch.Tensor) else list(_flatten(expected))
            for m, e in zip(meta, produced):
                if isinstance(m, TensorType) and isinstance(e, torch.Tensor):
                    assert list(m.shape) == list(e.shape) and m.dtype.name == str(e.dtype).removeprefix("torch."), (
                        f"{where}: meta {m} vs torch {e.dtype}{list(e.shape)}")
            continue
        actual = OpOverload(opdef)(*copy.deepcopy(sample.args), **copy.deepcopy(sample.kwargs))
        assert_close_to_torch(actual, expected, check_values=sample.check_values, rtol=sample.rtol,
                              atol=sample.atol, where=where,
                              dtype_tolerances=TORCH_REDUCED_PRECISION_TOLERANCES.get(name))


@pytest.mark.parametrize("name", DECOMPOSED_OPS)
def test_decomposition_matches_kernel(name):
    """Running the decomposition eagerly gives the op's own result."""
    opdef = REGISTRY[name]
    if opdef.kernel is None:
        pytest.skip("no reference kernel to compare with")
    for sample in _samples(name):
        if not sample.check_values:
            continue
        expected = OpOverload(opdef)(*copy.deepcopy(sample.args), **copy.deepcopy(sample.kwargs))
        # Decompositions receive arguments the way the decompose machinery passes them: bound to the schema.
        args, kwargs = split_bound(opdef, opdef.schema.bind(copy.deepcopy(sample.args), copy.deepcopy(sample.kwargs)))
        actual = opdef.decomposition(*args, **kwargs)
        if torch is not None:
            assert_close_to_torch(actual, to_torch(expected), rtol=sample.rtol, atol=sample.atol,
                                  where=f"{name} decomposition {sample}")
        else:
            np.testing.assert_allclose(np.asarray(actual, dtype=np.float64),
                                       np.asarray(expected, dtype=np.float64), rtol=1e-5, atol=1e-5)


def _trace_sample(opdef, sample, decompose: bool, real_boundary: bool = False):
    """Build a one-op (or decomposed) program whose inputs are the sample's tensors. With `real_boundary`, complex
    tensors enter as (real, imaginary) pairs and leave through view_as_real, as a model around the op would pass them
    to a backend without complex types."""
    builder = GraphBuilder()
    inputs = []

    def lift(value):
        if real_boundary and isinstance(value, np.ndarray) and np.iscomplexobj(value):
            inputs.append(np.stack([value.real, value.imag], -1))
            pair = builder.add_input(f"x{len(inputs) - 1}", _types_of(inputs[-1]))
            with builder:
                return ops.aten.view_as_complex.default(pair)
        if isinstance(value, (np.ndarray, SparseArray)):
            inputs.append(value)
            return builder.add_input(f"x{len(inputs) - 1}", _types_of(value))
        if isinstance(value, list):
            return [lift(v) for v in value]
        return value

    args = [lift(a) for a in copy.deepcopy(sample.args)]
    kwargs = {k: lift(v) for k, v in copy.deepcopy(sample.kwargs).items()}
    with builder:
        if decompose:
            args, kwargs = split_bound(opdef, opdef.schema.bind(args, kwargs))
            result = opdef.decomposition(*args, **kwargs)
        else:
            result = OpOverload(opdef)(*args, **kwargs)
        outputs = [result] if not isinstance(result, (list, tuple)) else list(_flatten(result))
        if real_boundary:
            outputs = [ops.aten.view_as_real.default(v) if v.type.dtype.is_complex else v for v in outputs]
    return builder.build(outputs), inputs


@pytest.mark.parametrize("name", DECOMPOSED_OPS)
def test_decomposition_reaches_core_ops(name):
    """A decomposition emits only core ops, ops that decompose further, or the complex prims (Core ATen has no
    form for complex values; torch's own references use prims there too)."""
    opdef = REGISTRY[name]
    for sample in _samples(name)[:2]:
        program, _ = _trace_sample(opdef, sample, decompose=True)
        for op in program.nodes():
            emitted = op.opdef
            assert emitted.is_core or emitted.decomposition is not None or emitted.is_complex_prim, (
                f"{name}'s decomposition emits {emitted.name}, which is neither core nor decomposable")
            assert emitted is not opdef, f"{name}'s decomposition emits itself"


@pytest.mark.parametrize("name", [n for n in KERNEL_OPS if "random" not in REGISTRY[n].tags])
def test_one_op_program_round_trips_and_interprets(name):
    """Per op: build a program, print → parse → print is identical, verify, and the interpreter == eager."""
    from kiln.ir.program import ExportedProgram
    opdef = REGISTRY[name]
    for sample in _samples(name)[:3]:
        program, inputs = _trace_sample(opdef, sample, decompose=False)
        program.verify()
        text = program.to_mlir()
        reparsed = ExportedProgram.from_mlir(text)
        assert reparsed.to_mlir() == text
        reparsed.verify()
        if not sample.check_values:
            continue
        expected = OpOverload(opdef)(*copy.deepcopy(sample.args), **copy.deepcopy(sample.kwargs))
        expected_flat = [expected] if not isinstance(expected, (list, tuple)) else list(_flatten(expected))
        got = reparsed(*inputs)
        got_flat = [got] if len(expected_flat) == 1 else list(got)
        for g, e in zip(got_flat, expected_flat):
            if isinstance(e, SparseArray):
                assert isinstance(g, SparseArray) and g.layout == e.layout
                g, e = g.to_dense(), e.to_dense()
            if isinstance(e, np.ndarray):
                assert g.dtype == e.dtype and g.shape == e.shape
                if e.dtype == dtypes.bfloat16.numpy:  # numpy's NaN-aware comparison needs a native float
                    g, e = g.astype(np.float32), e.astype(np.float32)
                np.testing.assert_array_equal(np.asarray(g), np.asarray(e), err_msg=f"{name} {sample}")
            else:
                assert g == pytest.approx(e, nan_ok=True)


def test_to_numpy_round_trip_helper():
    if torch is None:
        pytest.skip("torch is not installed")
    array = np.arange(6, dtype=np.float32).reshape(2, 3).astype(dtypes.bfloat16.numpy)
    assert to_numpy(to_torch(array)).dtype == array.dtype

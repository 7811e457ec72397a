"""The C backend: zoo models and per-op programs match the reference interpreter; bad inputs are refused."""

from __future__ import annotations

import copy
import itertools
import shutil

import numpy as np
import pytest

import kiln
import kiln.models
from kiln.codegen import LOWERINGS
from kiln.codegen.schedule import BIND_OPS
from kiln.ir import dtypes
from kiln.ir.errors import InputError, UnsupportedError
from kiln.ir.registry import REGISTRY
from kiln.compiler import compile as compile_c
from tests.ir.samples import SAMPLES
from tests.ir.test_ops import _trace_sample
from tests.runtime.support import use_capability, zoo_inputs

import kiln.codegen.c  # noqa: F401  (registers LOWERINGS["c"])

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
RTOL, ATOL = 1.3e-6, 1e-5
ALLOWED = {"float32", "bool", "int64", "int32", "int16", "int8", "uint8"}


def _array(value):
    return value.__kiln_array__() if hasattr(value, "__kiln_array__") else np.asarray(value)


def _check(got, expected):
    got = got if isinstance(got, tuple) else (got,)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    for g, e in zip(got, expected):
        e = _array(e)
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL, equal_nan=True)


@pytest.mark.parametrize("name", sorted(kiln.models.MODELS))
def test_zoo_model_matches_interpreter(name, tmp_path):
    entry = kiln.models.get(name)
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    model = compile_c(program, output=tmp_path / name)
    for x in zoo_inputs(entry):
        _check(model(x), program(x))


def _c_dtype(array: np.ndarray) -> str:
    """The dtype the C package sees: a complex tensor enters as its (real, imaginary) pairs."""
    dtype = dtypes.dtype(array.dtype)
    return (dtypes.complex_to_real(dtype) if dtype.is_complex else dtype).name


def _op_samples(name):
    for sample in SAMPLES[name](np.random.default_rng(0)):
        arrays = [v for v in itertools.chain(sample.args, sample.kwargs.values(), *[
            a for a in sample.args if isinstance(a, list)]) if isinstance(v, np.ndarray)]
        if not arrays or any(_c_dtype(a) not in ALLOWED or a.size == 0 for a in arrays):
            continue
        if sample.check_values:
            yield sample


# region ops: tests/runtime/test_c_loops.py; sizes read while running (BIND_OPS: an item() or nonzero result sizes
# other values, and a program returning one is refused): tests/runtime/test_c_data_dependent.py
C_OPS = sorted(name for name in LOWERINGS["c"] if name in REGISTRY and name not in BIND_OPS)


def check_claimed_op(name, tmp_path, target: str) -> None:
    """Up to three of the op's registry samples, compiled for `target`, match the interpreter (samples in argument
    forms outside what the target claims are skipped; at least one must compile)."""
    compiled = 0
    for sample in _op_samples(name):
        if compiled == 3:
            break
        program, inputs = _trace_sample(REGISTRY[name], copy.deepcopy(sample), decompose=False, real_boundary=True)
        try:
            model = compile_c(program, target=target, output=tmp_path / f"sample{compiled}")
        except UnsupportedError:
            continue  # an argument form outside the claimed subset (e.g. a non-last-dim reduction)
        _check(model(*inputs), program(*inputs))
        compiled += 1
    if not compiled and not any(a.type.is_tensor for a in REGISTRY[name].schema.arguments):
        pytest.skip("source op (no tensor inputs, so no program input to size it): covered through the zoo models "
                    "and the composites that produce it (full_like, empty_like, new_empty, arange)")
    assert compiled, f"no sample of {name} compiled for target {target}"


@pytest.mark.parametrize("name", C_OPS)
def test_claimed_op_matches_interpreter(name, tmp_path):
    check_claimed_op(name, tmp_path, "c")


# Composite ops reach C through their decompositions (kiln.compile's pipeline decomposes to Core ATen); RNG and
# backward ops are out of the C backend's scope, and quantized_decomposed ops wait for its integer kernels.
COMPOSITES = sorted(name for name, opdef in REGISTRY.items()
                    if opdef.decomposition is not None and not {"random", "backward"} & opdef.tags
                    and opdef.schema.namespace == "aten")


@pytest.mark.parametrize("name", COMPOSITES)
def test_composite_compiles_through_its_decomposition(name, tmp_path):
    opdef = REGISTRY[name]
    if not all(r.type.is_tensor for r in opdef.schema.returns):
        pytest.skip("returns a Python number: a C package returns arrays sized from its inputs")
    samples = list(_op_samples(name))
    if not samples:
        pytest.skip("no sample with tensor inputs of the C dtypes: source ops are covered through the zoo models")
    refused = []
    for sample in samples:  # the first sample in an argument form the C kernels take
        # complex values cross the package boundary as pairs (lower-complex runs them between real inputs/outputs)
        program, inputs = _trace_sample(opdef, copy.deepcopy(sample), decompose=False, real_boundary=True)
        try:
            compiled = compile_c(program, output=tmp_path / "composite")
        except UnsupportedError as error:
            refused.append(error.cause)
            continue
        _check(compiled(*inputs), program(*inputs))
        return
    raise AssertionError(f"no sample of {name} compiled for the C backend: {refused[0]}")


@pytest.fixture(scope="module")
def mlp_model(tmp_path_factory):
    entry = kiln.models.get("mlp")
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    return compile_c(program, output=tmp_path_factory.mktemp("mlp"))


def test_refuses_wrong_dtype(mlp_model):
    with pytest.raises(InputError, match="input 'x'.*dtype"):
        mlp_model(np.zeros((2, 32), np.float64))


def test_refuses_wrong_rank(mlp_model):
    with pytest.raises(InputError, match="input 'x'.*rank"):
        mlp_model(np.zeros((2, 32, 1), np.float32))


def test_refuses_wrong_static_dim(mlp_model):
    with pytest.raises(InputError, match="input 'x' dimension 1"):
        mlp_model(np.zeros((2, 31), np.float32))


def test_refuses_out_of_range_dim(mlp_model):
    with pytest.raises(InputError, match=r"x.shape\[0\] = 5000 is outside"):
        mlp_model(np.zeros((5000, 32), np.float32))


class _Related(kiln.nn.Module):
    def forward(self, x, y, z):  # x and y share `n`; z is n + 1 long
        return x + y + z[1:]


@pytest.fixture(scope="module")
def related_model(tmp_path_factory):
    n = kiln.Dim("n", min=2, max=64)
    program = kiln.export(_Related(), (kiln.randn(4), kiln.randn(4), kiln.randn(5)),
                          dynamic_shapes=({0: n}, {0: n}, {0: n + 1}))
    return program, compile_c(program, output=tmp_path_factory.mktemp("related"))


def test_related_dims_run_and_relation_breaks_are_refused(related_model):
    program, model = related_model
    for n in (2, 9, 64):
        args = [np.random.default_rng(n).standard_normal(size).astype(np.float32) for size in (n, n, n + 1)]
        _check(model(*args), program(*args))
    with pytest.raises(InputError, match="input 'y' dimension 0 is 5 but must equal n = 4"):
        model(np.zeros(4, np.float32), np.zeros(5, np.float32), np.zeros(5, np.float32))
    with pytest.raises(InputError, match="input 'z' dimension 0 is 4 but must equal"):
        model(np.zeros(4, np.float32), np.zeros(4, np.float32), np.zeros(4, np.float32))
    with pytest.raises(InputError, match=r"x.shape\[0\] = 1 is outside the range"):
        model(np.zeros(1, np.float32), np.zeros(1, np.float32), np.zeros(2, np.float32))


def test_unsupported_ops_rejected_at_compile_time_with_full_list():
    class Model(kiln.nn.Module):
        def forward(self, x):
            i = x.to(kiln.int64)  # an integer average pool and a float16 product: both refused, both listed
            return x + 1, kiln.nn.functional.avg_pool2d(i.reshape(1, 1, 3, 4), 2), x.to(kiln.float16).prod(1)

    with pytest.raises(UnsupportedError) as info:
        compile_c(Model(), example_args=(kiln.randn(3, 4),))
    message = str(info.value)
    for op in ("aten.prod.dim_int", "aten.avg_pool2d.default"):
        assert op in message


def test_concurrent_calls_give_identical_results(mlp_model):
    """Calls from many threads at once, with different inputs and batch sizes: each gets what it gets alone (a run
    borrows the model's workspace, which grows to the largest size seen, or allocates its own while another run
    holds it)."""
    from concurrent.futures import ThreadPoolExecutor
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((1 + 37 * (i % 13), 32)).astype(np.float32) for i in range(200)]
    expected = [mlp_model(x) for x in inputs]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(mlp_model, inputs))
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, want)


def test_package_layout_and_compile_from_module(tmp_path):
    import json
    entry = kiln.models.get("mlp")
    model = kiln.compile(entry.model, example_args=entry.args, dynamic_shapes=entry.dynamic_shapes,
                         output=tmp_path / "pkg")
    manifest = json.loads((tmp_path / "pkg" / "manifest.json").read_text())
    assert {"model.c", "model.so", "weights.bin", "manifest.json"} <= {p.name for p in (tmp_path / "pkg").iterdir()}
    assert manifest["abi_version"] == kiln.codegen.c.ABI_VERSION == 6
    assert manifest["inputs"][0]["shape"] == ["batch", "32"]
    assert manifest["symbols"] == [{"name": "batch", "lower": 1, "upper": 4096}]
    blob = np.memmap(tmp_path / "pkg" / "weights.bin", dtype=np.uint8, mode="r")
    for weight in manifest["weights"]:
        assert weight["offset"] % 64 == 0
        stored = np.frombuffer(blob, np.float32, weight["nbytes"] // 4, weight["offset"]).reshape(weight["shape"])
        if "packed_from" in weight:  # a linear's W^T in GEMM panels [panel, K, NR]: unpacked, W^T again
            source = entry.model.state_dict()[weight["packed_from"]].__kiln_array__()
            assert weight["layout"] == "panels"
            panels, k, width = stored.shape
            unpacked = stored.transpose(1, 0, 2).reshape(k, panels * width)
            np.testing.assert_array_equal(unpacked[:, :source.shape[0]], source.T)
            assert not unpacked[:, source.shape[0]:].any()
        else:
            np.testing.assert_array_equal(stored, entry.model.state_dict()[weight["name"]].__kiln_array__())
    assert {w.get("packed_from", w["name"]) for w in manifest["weights"]} == set(entry.model.state_dict())
    x = np.ones((3, 32), np.float32)
    _check(kiln.runtime.load(tmp_path / "pkg")(x), model(x))


@pytest.mark.parametrize("damage", ["truncated", "offset"])
def test_loader_refuses_weights_the_file_does_not_hold(damage, tmp_path):
    """A manifest whose weights overrun weights.bin is refused before any native code reads them."""
    import json
    entry = kiln.models.get("mlp")
    kiln.compile(entry.model, example_args=entry.args, dynamic_shapes=entry.dynamic_shapes, output=tmp_path / "pkg")
    blob, manifest_path = tmp_path / "pkg" / "weights.bin", tmp_path / "pkg" / "manifest.json"
    if damage == "truncated":
        blob.write_bytes(blob.read_bytes()[:-100])
    else:
        manifest = json.loads(manifest_path.read_text())
        manifest["weights"][0]["offset"] = blob.stat().st_size
        manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(kiln.KilnError, match="does not fit"):
        kiln.runtime.load(tmp_path / "pkg")


# ---------------------------------------------------------------------------------------------
# GEMM and convolution tiling, CPU capabilities, threads

class _LinearRelu(kiln.nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.fc = kiln.nn.Linear(k, n)

    def forward(self, x):
        return kiln.relu(self.fc(x)) + 1.0


class _Attention(kiln.nn.Module):
    def forward(self, q, k, v):  # bmm with a transposed (strided) B, then a contiguous one
        return kiln.softmax(q @ k.transpose(-1, -2), dim=-1) @ v


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 5, 31), (12, 64, 32), (13, 33, 33), (25, 100, 100), (3, 300, 65)])
def test_gemm_tiles_and_remainders(m, k, n, tmp_path):
    """Rows past the 12-row register tile, columns past the 32-wide panel, odd K; B packed at create (one output
    column: the matrix-vector kernel, tests/runtime/test_c_matrix_vector.py)."""
    model = _LinearRelu(k, n).eval()
    program = kiln.export(model, (kiln.randn(m, k),))
    compiled = compile_c(program, output=tmp_path / "linear")
    x = np.random.default_rng(m * n).standard_normal((m, k)).astype(np.float32)
    _check(compiled(x), program(x))
    assert ("kiln_gemv4(rows, K, " if n == 1 else "packed at create") in (tmp_path / "linear" / "model.c").read_text()


def test_bmm_with_strided_operands(tmp_path):
    seq = kiln.Dim("seq", max=128)
    args = tuple(kiln.randn(2, 9, 16) for _ in range(3))
    program = kiln.export(_Attention(), args, dynamic_shapes=({1: seq}, {1: seq}, {1: seq}))
    compiled = compile_c(program, output=tmp_path / "attention")
    for length in (1, 9, 40, 77):
        q, k, v = (np.random.default_rng(length + i).standard_normal((2, length, 16)).astype(np.float32)
                   for i in range(3))
        _check(compiled(q, k, v), program(q, k, v))


# Images of <= 128 output pixels pack their whole im2col matrix at once (conv.whole_im2col); larger ones go
# panel by panel; few pixels with output channels that fill the KILN_NR-wide panels better than the pixels do take
# the pixels as the GEMM's rows (packing.conv_weight_layout: 128 channels, 4 groups of 32). Every configuration runs
# all three ways: (height, width), output channels, and the marker of the path in model.c.
_CONV_IMAGES = {"whole im2col": ((9, 10), 12, "packed_image"), "panels": ((40, 29), 12, None),
                "pixel rows": ((7, 9), 128, "packed_unit")}
_CONV_MARKERS = ("packed_image", "packed_unit")


@pytest.mark.parametrize("image", _CONV_IMAGES)
@pytest.mark.parametrize("config", [dict(stride=1, padding=1), dict(stride=2, padding=3, dilation=2),
                                    dict(stride=1, padding=0, groups=4), dict(stride=3, padding=2, bias=False)])
def test_conv_as_gemm(config, image, tmp_path):
    size, channels, marker = _CONV_IMAGES[image]
    conv = kiln.nn.Conv2d(8, channels, 3, **config).eval()
    batch = kiln.Dim("batch", max=16)
    program = kiln.export(conv, (kiln.randn(2, 8, *size),), dynamic_shapes={"input": {0: batch}})
    compiled = compile_c(program, output=tmp_path / "conv")
    source = (tmp_path / "conv" / "model.c").read_text()
    assert [m for m in _CONV_MARKERS if m in source] == ([marker] if marker else [])
    for n in (1, 2, 5):
        x = np.random.default_rng(n).standard_normal((n, 8, *size)).astype(np.float32)
        _check(compiled(x), program(x))


@pytest.mark.parametrize("size", [(30, 30), (23, 41)])
def test_strided_rgb_stem_convolution(size, tmp_path):
    """ResNet's stem, 7x7 stride 2 over 3 channels: with AVX2 its im2col rows are copied as every other element
    (loads and shuffles, one at a time near the ends of the input's buffer), with padding masked to zeros."""
    conv = kiln.nn.Conv2d(3, 10, 7, stride=2, padding=3).eval()
    program = kiln.export(conv, (kiln.randn(2, 3, *size),), dynamic_shapes={"input": {0: kiln.Dim("batch", max=8)}})
    compiled = compile_c(program, output=tmp_path / "stem")
    for n in (1, 3):
        x = np.random.default_rng(n).standard_normal((n, 3, *size)).astype(np.float32)
        _check(compiled(x), program(x))


def _torch_conv3d():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    return torch.nn.Conv3d(4, 32, 3, padding=1, stride=(1, 2, 1)).eval()


@pytest.mark.parametrize("build,size", [(lambda: kiln.nn.Conv1d(16, 64, 3, padding=1), (20,)),
                                        (_torch_conv3d, (4, 5, 6)), (lambda: kiln.nn.Conv2d(24, 96, 1), (5, 5))],
                         ids=["conv1d", "conv3d", "conv2d 1x1"])
def test_conv_with_pixels_as_rows_in_any_dimension(build, size, tmp_path):
    """1-D, 3-D and 1x1 convolutions whose output channels fill their panels better than their pixels do: pixels as
    the GEMM's rows (row blocks of the im2col packed per image), weights as B panels of output channels."""
    conv = build().eval()
    example = np.random.default_rng(0).standard_normal((2, conv.in_channels, *size)).astype(np.float32)
    batch = {"input": {0: kiln.Dim("batch", max=8)}}
    if isinstance(conv, kiln.nn.Module):
        program = kiln.export(conv, (kiln.tensor(example),), dynamic_shapes=batch)
    else:
        import torch
        program = kiln.from_torch(conv, (torch.from_numpy(example),),
                                  dynamic_shapes={"input": {0: torch.export.Dim("batch", max=8)}})
    compiled = compile_c(program, output=tmp_path / "conv")
    assert "packed_unit" in (tmp_path / "conv" / "model.c").read_text()
    for n in (1, 3):
        x = np.random.default_rng(n).standard_normal((n, conv.in_channels, *size)).astype(np.float32)
        _check(compiled(x), program(x))


class _ConvTransposedResidual(kiln.nn.Module):
    """A residual read transposed: the fused epilogue indexes it by (row, column), not by flat pixel."""

    def __init__(self, channels):
        super().__init__()
        self.conv = kiln.nn.Conv2d(5, channels, 3, padding=1)

    def forward(self, x, residual):
        return kiln.relu(self.conv(x) + residual.transpose(2, 3))


@pytest.mark.parametrize("image", _CONV_IMAGES)
def test_conv_epilogue_with_a_transposed_operand(image, tmp_path):
    (height, width), channels, marker = _CONV_IMAGES[image]
    args = (kiln.randn(2, 5, height, width), kiln.randn(2, channels, width, height))
    program = kiln.export(_ConvTransposedResidual(channels).eval(), args)
    compiled = compile_c(program, output=tmp_path / "conv")
    source = (tmp_path / "conv" / "model.c").read_text()
    positions = "p % INT64_C(9)" if image == "pixel rows" else "out1[c]"  # a pixel's column, by division or table
    assert positions in source and [m for m in _CONV_MARKERS if m in source] == ([marker] if marker else [])
    rng = np.random.default_rng(0)
    x, residual = (rng.standard_normal(a.shape).astype(np.float32) for a in args)
    _check(compiled(x, residual), program(x, residual))


def test_cpu_capability_is_detected_and_validated(monkeypatch):
    from kiln.codegen.c import get_cpu_capability, supported_capabilities
    from kiln.ir.errors import KilnError
    available = supported_capabilities()
    # Detection is what's under test, so a KILN_CPU_CAPABILITY set by whoever runs the suite must not answer.
    monkeypatch.delenv("KILN_CPU_CAPABILITY", raising=False)
    assert available[0] == "DEFAULT" and get_cpu_capability() == available[-1]
    monkeypatch.setenv("KILN_CPU_CAPABILITY", "DEFAULT")
    assert get_cpu_capability() == "DEFAULT"
    monkeypatch.setenv("KILN_CPU_CAPABILITY", "SSE9")
    with pytest.raises(KilnError, match="SSE9"):
        get_cpu_capability()


@pytest.mark.parametrize("capability", ["DEFAULT", "AVX2", "AVX512"])
def test_every_capability_builds_and_matches(capability, monkeypatch, tmp_path):
    """The portable kernels (DEFAULT, AVX2) and the AVX-512 intrinsics give the interpreter's values."""
    use_capability(capability, monkeypatch)
    for name in ("mlp", "cnn"):
        entry = kiln.models.get(name)
        program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
        compiled = compile_c(program, output=tmp_path / name)
        assert compiled.manifest["cpu_capability"] == capability
        x = np.random.default_rng(3).standard_normal((3, *_array(entry.args[0]).shape[1:])).astype(np.float32)
        _check(compiled(x), program(x))


@pytest.mark.parametrize("cpus", [1, 2, 3, 4])
def test_large_model_builds_in_parallel_parts_or_whole_alike(cpus, monkeypatch, tmp_path):
    """A model with enough kernel code builds as one compiler process per part (its kernel bodies dealt into build
    groups), then links; the same model.c built whole, as the C runner's sanitizer build does, runs the same."""
    from kiln.codegen.c import build
    entry = kiln.models.get("transformer")
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))  # a cold build, not one cached by another test
    monkeypatch.setattr(build, "usable_cpus", lambda: cpus)
    compiled = compile_c(program, output=tmp_path / "pkg")
    source = (tmp_path / "pkg" / "model.c").read_text()
    assert "#define KILN_GROUPS 4" in source
    assert build.build_parts(source) == {1: 1, 2: 2, 3: 2, 4: 4}[cpus]
    tokens = np.random.default_rng(5).integers(0, int(_array(entry.args[0]).max()) + 1, (2, 7)).astype(np.int64)
    _check(compiled(tokens), program(tokens))


def test_small_model_builds_whole(mlp_model):
    """Below the threshold a second compiler process would parse the same headers for little code: one part."""
    from kiln.codegen.c import build
    source = (mlp_model.path / "model.c").read_text()
    assert "#define KILN_GROUPS 1" in source and build.build_parts(source) == 1


def test_package_for_another_cpu_is_refused(tmp_path):
    import json
    from kiln.ir.errors import KilnError
    entry = kiln.models.get("mlp")
    compile_c(kiln.export(entry.model, entry.args), output=tmp_path / "pkg")
    manifest_path = tmp_path / "pkg" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["cpu_capability"] = "NEON"
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(KilnError, match="built for NEON"):
        kiln.runtime.load(tmp_path / "pkg")


def test_num_threads_gives_identical_results(tmp_path):
    """Work splits differ with the team size, but every output element is summed in the same order."""
    entry = kiln.models.get("cnn")
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    compile_c(program, output=tmp_path / "cnn")
    x = np.random.default_rng(0).standard_normal((5, 3, 16, 16)).astype(np.float32)
    results = []
    for threads in (1, 2, 3):
        model = kiln.runtime.load(tmp_path / "cnn", num_threads=threads)
        assert model.num_threads == threads
        results.append(model(x))
    default = kiln.runtime.load(tmp_path / "cnn")
    assert default.num_threads is None
    for result in results[1:] + [default(x)]:
        np.testing.assert_array_equal(result, results[0])
    _check(results[0], program(x))
    from kiln.ir.errors import KilnError
    for bad in (0, -1, 1.5, True):
        with pytest.raises(KilnError, match="num_threads"):
            default.num_threads = bad


class _RowOps(kiln.nn.Module):
    def forward(self, x):
        return kiln.amax(x, dim=-1), kiln.softmax(x, dim=-1), kiln.log_softmax(x, dim=1), x.sum(-1), x.mean(0)


def test_row_kernels_keep_nan_and_inf_semantics(tmp_path):
    """The vectorized reductions still propagate NaN, and softmax of +-inf rows matches the reference."""
    program = kiln.export(_RowOps(), (kiln.randn(6, 40),))
    compiled = compile_c(program, output=tmp_path / "rows")
    x = np.random.default_rng(0).standard_normal((6, 40)).astype(np.float32) * 30
    x[1, 7] = np.nan
    x[2, :] = -np.inf
    x[3, 5] = np.inf
    x[4, 0] = -np.inf
    _check(compiled(x), program(x))


@pytest.mark.parametrize("name", ["exp", "tanh", "sigmoid", "erf", "gelu"])
def test_vectorized_float_math_matches_reference(name, tmp_path):
    """kiln_math.h's float exp/tanh/erf across the float range, with non-finite values, against the interpreter."""
    function = {"gelu": kiln.nn.functional.gelu}.get(name) or getattr(kiln, name)

    class Unary(kiln.nn.Module):
        def forward(self, x):
            return function(x)

    x = np.concatenate([np.linspace(-110, 100, 20001), np.geomspace(1e-30, 10, 500), -np.geomspace(1e-30, 10, 500),
                        [np.nan, np.inf, -np.inf, 0.0, -0.0]]).astype(np.float32)
    program = kiln.export(Unary(), (kiln.randn(x.size),))
    _check(compile_c(program, output=tmp_path / name)(x), program(x))


def test_profile_reports_every_kernel(tmp_path):
    entry = kiln.models.get("cnn")
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    model = compile_c(program, output=tmp_path / "cnn")
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    timings = model.profile(x, runs=5)
    source = (tmp_path / "cnn" / "model.c").read_text()
    kernels = source.count("\nstatic void kernel_") - source.count("\nstatic void kernel_body_")  # bodies are shared
    assert len(timings) == kernels and all(seconds > 0 for _, seconds in timings)
    assert [t for _, t in timings] == sorted((t for _, t in timings), reverse=True)
    assert all(f"static void {name}(" in source for name, _ in timings)
    _check(model(x), program(x))  # profiling is off again and the model still runs


def test_recompiling_into_a_loaded_package_keeps_the_loaded_model_working(tmp_path):
    """Package files are replaced, never rewritten in place: the mapped model.so and weights.bin stay valid."""
    entry = kiln.models.get("cnn")
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    first = compile_c(program, output=tmp_path / "pkg", num_threads=1)
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    before = first(x)
    second = compile_c(program, output=tmp_path / "pkg", num_threads=2)
    np.testing.assert_array_equal(first(x), before)
    np.testing.assert_array_equal(second(x), before)
    assert not [p for p in (tmp_path / "pkg").iterdir() if p.name.startswith(".")]


def test_manifest_reports_packed_panels_and_scratch(tmp_path, capsys):
    """MLP 32->64->64->10: every B is a weight, packed by the compiler into KILN_NR-wide zero-padded panels in
    weights.bin (nothing is packed at create); the per-thread scratch holds A (the activations) in 12-row blocks,
    for K = 32 and K = 64, capped at 4 MB."""
    from kiln.cli.main import main
    from kiln.codegen.c.packing import tile_sizes
    entry = kiln.models.get("mlp")
    compile_c(kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes), output=tmp_path / "mlp")
    manifest = kiln.runtime.load(tmp_path / "mlp").manifest
    memory = manifest["memory"]
    assert memory["packed_weight_bytes"] == 0
    _, nr = tile_sizes(manifest["cpu_capability"])
    panels = {entry["packed_from"]: entry["nbytes"] for entry in manifest["weights"] if "packed_from" in entry}
    assert panels == {name: k * -(-n // nr) * nr * 4  # 10 outputs pad to one panel
                      for name, k, n in [("layers.0.weight", 32, 64), ("layers.1.weight", 64, 64),
                                         ("head.weight", 64, 10)]}
    assert memory["scratch_bytes_per_thread"] == [f"4*Min(1048576, {12 * k}*ceiling(batch/12))" for k in (32, 64)]
    # The GPT's fused attention (head dim 16) packs Kᵀ into 32-key panels (32*ceil(seq/32) x 16 floats), V into one
    # 32-wide panel (seq x 32) and keeps 12 rows of scores (12 x 32*ceil(seq/32)); its linears pack A.
    entry = kiln.models.get("gpt")
    compile_c(kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes), output=tmp_path / "gpt")
    scratch = kiln.runtime.load(tmp_path / "gpt").manifest["memory"]["scratch_bytes_per_thread"]
    attention = "128*seq + 3584*ceiling(seq/32)"
    assert scratch[0] == attention and all(s.startswith("4*Min(1048576, ") for s in scratch[1:])
    assert main(["inspect", str(tmp_path / "gpt")]) == 0
    out = capsys.readouterr().out
    assert f"per-thread GEMM scratch: max({attention}, 4*Min(1048576, " in out and "packed weight panels" not in out
    assert "packed by the compiler for " + kiln.runtime.load(tmp_path / "gpt").manifest["cpu_capability"] in out


class _MaskedSoftmax(kiln.nn.Module):
    def forward(self, scores, mask):
        masked = kiln.where(mask, scores * 0.25, kiln.full((), float("-inf")))
        normed = kiln.nn.functional.layer_norm(scores * 2.0, (scores.shape[-1],))
        return kiln.softmax(masked, dim=-1), (scores - 1.0).sum(1), normed


def test_row_kernels_fuse_cheap_producers(tmp_path):
    """Scale + mask fuse into softmax, shift into sum, doubling into layer norm: no pointwise kernel is left."""
    seq = kiln.Dim("seq", max=64)
    args = (kiln.randn(2, 8, 8), kiln.randn(8, 8) > 0)
    program = kiln.export(_MaskedSoftmax(), args, dynamic_shapes=({1: seq, 2: seq}, {0: seq, 1: seq}))
    compiled = compile_c(program, output=tmp_path / "rows")
    source = (tmp_path / "rows" / "model.c").read_text()
    kernels = [line for line in source.splitlines() if line.startswith("/* ") and ": aten." in line]
    assert sorted(kernels) == [  # the 0-d -inf constant is inlined too
        "/* rows: aten.mul.Scalar, aten.full.default, aten.where.self, aten._softmax.default */",
        "/* rows: aten.mul.Scalar, aten.native_layer_norm.default */",
        "/* rows: aten.sub.Scalar, aten.sum.dim_IntList */"], kernels
    for length in (1, 8, 33):
        rng = np.random.default_rng(length)
        scores = rng.standard_normal((2, length, length)).astype(np.float32)
        mask = np.tril(np.ones((length, length), bool))
        _check(compiled(scores, mask), program(scores, mask))


class _ReshapeEpilogues(kiln.nn.Module):
    """linear on [B, T, C] (addmm between views) -> gelu -> residual add; bmm -> view -> per-head bias (a
    broadcast that cannot be indexed in the bmm's merged batch dim, so that chain falls back)."""

    def __init__(self):
        super().__init__()
        self.fc = kiln.nn.Linear(16, 16)
        self.head_bias = kiln.nn.Parameter(kiln.randn(1, 4, 1, 1))

    def forward(self, x, q):
        y = kiln.nn.functional.gelu(self.fc(x)) + x
        heads = q.reshape(q.shape[0] * 4, 4, 8)
        scores = heads @ heads.transpose(1, 2)
        return y, scores.reshape(q.shape[0], 4, 4, 4) + self.head_bias


def test_pointwise_consumers_fuse_through_reshapes(tmp_path):
    batch, seq = kiln.Dim("batch", max=16), kiln.Dim("seq", max=64)
    args = (kiln.randn(2, 8, 16), kiln.randn(2, 16, 8))
    program = kiln.export(_ReshapeEpilogues(), args, dynamic_shapes=({0: batch, 1: seq}, {0: batch}))
    compiled = compile_c(program, output=tmp_path / "reshape")
    source = (tmp_path / "reshape" / "model.c").read_text()
    kernels = [line for line in source.splitlines() if line.startswith("/* ") and ": aten." in line]
    assert "/* matmul: aten.addmm.default, aten.gelu.default, aten.add.Tensor */" in kernels, kernels
    assert "/* matmul: aten.bmm.default */" in kernels, kernels  # head bias: materialized, then a pointwise add
    for b, t in ((1, 1), (3, 8), (5, 33)):
        rng = np.random.default_rng(b * t)
        x = rng.standard_normal((b, t, 16)).astype(np.float32)
        q = rng.standard_normal((b, 16, 8)).astype(np.float32)
        _check(compiled(x, q), program(x, q))


def test_run_sizes_its_team_by_work(tmp_path):
    """kiln_run uses one thread per ~0.6 MFLOP of estimated work (capped by num_threads): tiny runs stay serial."""
    from kiln.codegen.c.target import TARGET
    from kiln.codegen.schedule import schedule
    from kiln.passes import run as run_passes
    batch = kiln.Dim("batch", max=64)
    program = kiln.export(kiln.nn.Linear(64, 48), (kiln.randn(4, 64),), dynamic_shapes={"input": {0: batch}})
    plan = schedule(run_passes(program, "decompose,canonicalize,cse,dce"), TARGET)
    (gemm,) = [k for k in plan.kernels if k.kind == "matmul"]
    assert TARGET.work(gemm) == 2 * 64 * 48 * sorted(plan.symbols, key=str)[0]
    compile_c(program, output=tmp_path / "linear")
    assert "const double work = (double)(INT64_C(6144) * sym_batch);" in (tmp_path / "linear" / "model.c").read_text()


@pytest.mark.parametrize("module", [
    lambda: kiln.nn.ConvTranspose2d(6, 4, 3, stride=2, padding=1, output_padding=1),
    lambda: kiln.nn.ConvTranspose2d(6, 9, (2, 3), stride=(1, 2), padding=(0, 1), dilation=2, groups=3, bias=False),
    lambda: kiln.nn.ConvTranspose1d(6, 5, 4, stride=3, padding=2),
])
def test_transposed_convolution(module, tmp_path):
    layer = module().eval()
    spatial = (7, 5) if isinstance(layer, kiln.nn.ConvTranspose2d) else (9,)
    batch = kiln.Dim("batch", max=16)
    program = kiln.export(layer, (kiln.randn(2, 6, *spatial),), dynamic_shapes={"input": {0: batch}})
    compiled = compile_c(program, output=tmp_path / "deconv")
    for n in (1, 2, 5):
        x = np.random.default_rng(n).standard_normal((n, 6, *spatial)).astype(np.float32)
        _check(compiled(x), program(x))


class _Float64Conv(kiln.nn.Module):
    def forward(self, x, w, b, w_transposed):
        return (kiln.relu(kiln.nn.functional.conv2d(x, w, b, stride=2, padding=1, groups=2)),
                kiln.nn.functional.conv_transpose2d(x, w_transposed, None, stride=2, padding=1))


def test_float64_convolutions_take_the_direct_loops(tmp_path):
    """float64 convolution (direct loops, double accumulator) and transposed convolution with a fused epilogue."""
    rng = np.random.default_rng(0)
    args = (rng.standard_normal((2, 4, 9, 7)), rng.standard_normal((6, 2, 3, 3)), rng.standard_normal(6),
            rng.standard_normal((4, 3, 3, 3)))
    program = kiln.export(_Float64Conv(), tuple(kiln.tensor(a) for a in args))
    compiled = compile_c(program, output=tmp_path / "f64")
    assert "/* conv: aten.convolution.default, aten.relu.default */" in (tmp_path / "f64" / "model.c").read_text()
    _check(compiled(*args), program(*args))


def test_kernels_with_the_same_text_over_different_dtypes_keep_their_own_types():
    """Two casts to float64, one of an int32 buffer and one of a float32 input, render to the same text; sharing one
    C function between them read the float32 bits as int32 (found by the learnable fake-quant decomposition)."""
    from kiln.ir.program import GraphBuilder
    from kiln.ir.registry import ops
    from kiln.ir.types import TensorType
    aten = ops.aten
    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of([4, 3, 2], "f32"))
    scale = builder.add_input("scale", TensorType.of([4], "f32"))
    zero_point = builder.add_input("zero_point", TensorType.of([4], "f32"))
    with builder:
        codes = aten.view.default(aten._to_copy.default(aten.round.default(zero_point), dtype=dtypes.int32), [4, 1, 1])
        shifted = aten.add.Tensor(aten.round.default(x), codes)
        as_double = [aten._to_copy.default(v, dtype=dtypes.float64)
                     for v in (shifted, codes, aten.view.default(scale, [4, 1, 1]))]
        out = aten.mul.Tensor(aten.sub.Tensor(as_double[0], as_double[1]), as_double[2])
    program = builder.build([out])
    rng = np.random.default_rng(0)
    inputs = [(rng.standard_normal((4, 3, 2)) * 5).astype(np.float32), rng.uniform(0.1, 1, 4).astype(np.float32),
              rng.uniform(-3, 3, 4).astype(np.float32)]
    np.testing.assert_array_equal(compile_c(program)(*inputs), program(*inputs))


def test_pointwise_ops_after_a_flattened_convolution_read_the_right_elements():
    """conv → relu → flatten → pointwise (a quantize before a linear layer): the pointwise ops used to fuse into the
    convolution's epilogue through the reshape, indexed in the flat shape against the conv's tile order."""
    class Model(kiln.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = kiln.nn.Conv2d(2, 4, 3, padding=1)

        def forward(self, x):
            return (self.conv(x).relu().flatten(1) * 3.0).round().clamp(0, 255).to(kiln.uint8)

    kiln.manual_seed(0)
    program = kiln.export(Model(), (kiln.randn(8, 2, 4, 4),))
    x = np.random.default_rng(0).standard_normal((8, 2, 4, 4)).astype(np.float32)
    np.testing.assert_array_equal(compile_c(program)(x), program(x))


class _Extrema(kiln.nn.Module):
    def forward(self, x):
        return kiln.amax(x), kiln.amin(x * 2.0)


@pytest.mark.parametrize("special", ["none", "nan late", "nan early", "inf", "equal"])
def test_whole_tensor_extrema_are_shared_across_threads(special, tmp_path):
    """A whole tensor's amin / amax (dynamic quantization's choose_qparams) is split across the team, each thread's
    share combined by one: the interpreter's value exactly, NaN anywhere in any share included."""
    x = np.random.default_rng(4).standard_normal((512, 4096)).astype(np.float32)  # work for two threads
    if special == "nan late":
        x[-1, -1] = np.nan
    elif special == "nan early":
        x[0, 3] = np.nan
    elif special == "inf":
        x[300, 5], x[2, 2] = np.inf, -np.inf
    elif special == "equal":
        x[:] = -0.0
    program = kiln.export(_Extrema(), (kiln.tensor(x),))
    compiled = compile_c(program, output=tmp_path / "pkg", num_threads=2)
    assert (tmp_path / "pkg" / "model.c").read_text().count("share[0] = m;") == 2
    for got, expected in zip(compiled(x), program(x)):
        np.testing.assert_array_equal(got, _array(expected))

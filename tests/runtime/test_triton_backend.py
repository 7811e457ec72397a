"""The Triton backend on CPU through Triton's interpreter (TRITON_INTERPRET=1): every op it claims against the
reference interpreter (registry-driven, as the C backend's sweep), the zoo, symbolic sizes, and the package."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # tests/conftest.py sets it before triton's first import
pytest.importorskip("torch")
pytest.importorskip("triton")

import kiln  # noqa: E402
from kiln.codegen import LOWERINGS  # noqa: E402
from kiln.compiler import compile as compile_program  # noqa: E402
from tests.modules import LambdaModule  # noqa: E402
from tests.runtime.support import zoo_inputs  # noqa: E402
from kiln.ir.registry import REGISTRY  # noqa: E402
from tests.runtime.test_c_backend import _check, check_claimed_op  # noqa: E402

import kiln.codegen.triton  # noqa: E402,F401  (registers LOWERINGS["triton"])

TRITON_OPS = sorted(name for name in LOWERINGS["triton"] if name in REGISTRY)  # region ops: test_triton_loops.py


def _compile(program, path):
    return compile_program(program, target="triton", output=path)


@pytest.mark.parametrize("name", TRITON_OPS)
def test_claimed_op_matches_interpreter(name, tmp_path):
    check_claimed_op(name, tmp_path, "triton")


@pytest.mark.parametrize("name", sorted(kiln.models.MODELS))
def test_zoo_model_matches_interpreter(name, tmp_path):
    """Every zoo model at two sizes of each dynamic dim (and the example's)."""
    entry = kiln.models.get(name)
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    model = _compile(program, tmp_path / name)
    for x in zoo_inputs(entry):
        _check(model(x), program(x))


class ConvNet(kiln.nn.Module):
    """Convolutions in every form the implicit GEMM takes: strided and padded, dilated, grouped, 1x1, 1-D; pools
    with padding and NaN inputs."""

    def __init__(self):
        super().__init__()
        nn = kiln.nn
        self.stem = nn.Conv2d(3, 16, 5, stride=2, padding=2)
        self.dilated = nn.Conv2d(16, 16, 3, padding=2, dilation=2, groups=4, bias=False)
        self.pointwise = nn.Conv2d(16, 8, 1)
        self.line = nn.Conv1d(8, 4, 3, padding=1)

    def forward(self, x):
        y = kiln.nn.functional.max_pool2d(kiln.relu(self.stem(x)), 3, stride=2, padding=1)
        y = self.pointwise(self.dilated(y) + y)
        pooled = kiln.nn.functional.avg_pool2d(y, 2, count_include_pad=False, padding=1)
        return self.line(y.flatten(2)), pooled, kiln.nn.functional.adaptive_avg_pool2d(y, (3, 2))


def test_convolutions_and_pools(tmp_path):
    kiln.manual_seed(0)
    batch = kiln.Dim("batch", max=8)
    program = kiln.export(ConvNet().eval(), (kiln.randn(2, 3, 17, 13),), dynamic_shapes={"x": {0: batch}})
    model = _compile(program, tmp_path / "conv")
    for size in (1, 3):
        x = np.random.default_rng(size).standard_normal((size, 3, 17, 13)).astype(np.float32)
        x[0, 1, 2:4, 5] = np.nan  # max_pool's NaN rule
        _check(model(x), program(x))


def test_convolutions_read_through_zero_pads(tmp_path):
    """A zero pad feeding a convolution is never made (schedule._pads_a_convolution): the convolution's masked loads
    read the unpadded input with its leading padding grown, TF-style (0, 1) pads included."""
    kiln.manual_seed(0)
    depthwise, dense = kiln.nn.Conv2d(4, 4, 3, stride=2, groups=4), kiln.nn.Conv2d(4, 6, 3, stride=2, padding=1)

    def fn(x):
        return depthwise(kiln.nn.functional.pad(x, (0, 1, 0, 1))), dense(kiln.nn.functional.pad(x, (2, 1, 0, 3)))
    program = kiln.export(LambdaModule(fn), (kiln.randn(2, 4, 10, 9),))
    model = _compile(program, tmp_path / "pads")
    x = np.random.default_rng(0).standard_normal((2, 4, 10, 9)).astype(np.float32)
    _check(model(x), program(x))
    assert model.manifest["kernels"] == 2 and "constant_pad_nd" not in (tmp_path / "pads" / "model.py").read_text()


def test_torch_tensors_in_and_out(tmp_path):
    """Torch tensors run on their device and come back as torch tensors; numpy arrays come back as numpy."""
    import torch
    entry = kiln.models.get("mlp")
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    model = _compile(program, tmp_path / "mlp")
    x = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    result = model(torch.from_numpy(x))
    assert isinstance(result, torch.Tensor) and result.device.type == "cpu"
    _check(result.numpy(), program(x))
    assert isinstance(model(x), np.ndarray)


def test_bad_inputs_and_indices_are_clear_errors(tmp_path):
    entry = kiln.models.get("mlp")
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    model = _compile(program, tmp_path / "mlp")
    with pytest.raises(kiln.KilnError, match="dtype float64 but the program expects float32"):
        model(np.zeros((2, 32)))
    with pytest.raises(kiln.KilnError, match="takes 1 input"):
        model()

    class Lookup(kiln.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = kiln.nn.Embedding(10, 4)

        def forward(self, tokens):
            return self.table(tokens)
    lookup = _compile(kiln.export(Lookup(), (kiln.tensor(np.array([[1, 2]])),)), tmp_path / "lookup")
    with pytest.raises(kiln.KilnError, match="index 10 is out of bounds for dimension 0 with size 10 in "
                                             "aten.embedding.default"):
        lookup(np.array([[3, 10]]))


def test_package_is_checked_before_its_code_runs(tmp_path):
    entry = kiln.models.get("mlp")
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    path = tmp_path / "mlp"
    _compile(program, path)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format"] == "kiln-triton-package" and manifest["source"] == "model.py"
    source = (path / "model.py").read_text()
    assert source.count("@triton.jit") >= manifest["kernels"]
    (path / "model.py").write_text(source + "\nraise SystemExit('must never run')\n")
    with pytest.raises(kiln.KilnError, match="model.py is not the one this manifest was written with"):
        kiln.runtime.load(path)
    (path / "model.py").write_text(source)
    manifest["source"] = "../elsewhere.py"
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(kiln.KilnError, match="names source '../elsewhere.py'"):
        kiln.runtime.load(path)


def test_missing_torch_is_one_clear_line(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def without_torch(name, *args, **kwargs):
        if name == "torch":
            raise ImportError("No module named 'torch'", name="torch")
        return real_import(name, *args, **kwargs)
    from kiln.runtime import triton as triton_runtime
    monkeypatch.setattr(builtins, "__import__", without_torch)
    with pytest.raises(kiln.KilnError, match="the Triton target needs torch and triton at run time"):
        triton_runtime._torch()


def test_cli_compiles_and_inspects_a_triton_package(tmp_path, capsys):
    from kiln.cli.main import main
    assert main(["compile", "kiln.models:mlp", "--target", "triton", "-o", str(tmp_path / "pkg"), "-q"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "pkg")]) == 0
    text = capsys.readouterr().out
    assert "kiln-triton-package" in text and "0. matmul: aten.addmm.default, aten.relu.default" in text
    assert "loading this package runs its code" in text


def test_cpu_tensors_without_the_interpreter_are_a_clear_error(tmp_path):
    """A process that imported triton without TRITON_INTERPRET=1 cannot run kernels on CPU tensors: one line says
    how to fix it, instead of Triton's own error from inside a kernel."""
    import subprocess
    import sys
    entry = kiln.models.get("mlp")
    _compile(kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes), tmp_path / "mlp")
    probe = ("import numpy as np, kiln\n"
             f"model = kiln.runtime.load({str(tmp_path / 'mlp')!r})\n"
             "try:\n    model(np.zeros((2, 32), np.float32))\n"
             "except kiln.KilnError as error:\n    print(error)\n")
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=environment)
    assert "only through its interpreter, which is off in this process" in result.stdout, result.stderr[-2000:]


def test_row_kernels_across_blocks_and_nan_rules(tmp_path):
    """Rows longer than one block (1024): argmax/argmin/max.dim with ATen's NaN and tie rules carried from block to
    block, cumsum's running sum, prod (of exact values: 2500 roundings in float32 differ by order), softmax, var."""
    from kiln.frontend.tensor import dispatch as call
    from tests.modules import LambdaModule
    aten = kiln.ops.aten

    def fn(x):
        return (call(aten.argmax.default, x, 1), call(aten.argmin.default, x, 1), *call(aten.max.dim, x, 1),
                *call(aten.min.dim, x, 1), call(aten.cumsum.default, x, 1), call(aten.prod.dim_int, x * 0 + 1, 1),
                call(aten._softmax.default, x, 1, False), call(aten.var.correction, x, [1]))
    x = np.random.default_rng(0).standard_normal((5, 2500)).astype(np.float32)
    x[1, 1500] = x[1, 2400] = np.nan  # the first NaN (in the second block) wins
    x[2, 100] = np.inf
    x[2, 2000] = np.inf  # ties: the first occurrence
    x[3, :] = -np.inf
    x[4, 3] = np.nan  # a NaN in the first block beats a larger value later
    x[4, 2000] = 1e30
    program = kiln.export(LambdaModule(fn), (kiln.tensor(x),))
    model = _compile(program, tmp_path / "rows")
    _check(model(x), program(x))


def test_lowering_coverage_matches_c():
    """Every op the C backend lowers has a Triton lowering too (each is then checked above against the interpreter;
    the loops in test_triton_loops.py), but the sizes C reads while running, which Triton refuses by name
    (tests/runtime/test_c_data_dependent.py)."""
    from kiln.codegen.c.target import TARGET as C
    from kiln.codegen.schedule import BIND_OPS
    from kiln.codegen.triton.target import TARGET as TRITON
    assert sorted(C.ops - TRITON.ops) == sorted(BIND_OPS)

"""Differential runs: programs through the reference interpreter (the oracle) and every backend, compared at
torch.testing.assert_close's default tolerances per dtype, NaN where the oracle has NaN.

Backends: ONNX in onnxruntime, C at every CPU capability this machine runs, Triton through its interpreter on CPU
(where TRITON_INTERPRET=1 and triton and torch import), the .pt2 round trip (kiln.save, then
kiln.load and the interpreter), and torch eager through the .pt2 (torch.export.load, then the module). A batch of
cases builds into one program per backend (one C compile for many DAGs); when a backend fails on a batch, halves
are retried until the failing case is alone. A backend's documented refusal (UnsupportedError) is counted, not
failed; any other exception is a crash.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import functools
import multiprocessing
import os
import pathlib
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterator, Sequence

import numpy as np
from xdsl.ir import OpResult

from kiln.ir import dtypes
from kiln.ir.closeness import closeness, default_tolerances
from kiln.ir.errors import KilnError, UnsupportedError, VerificationError
from kiln.ir.dialect import bound_arguments
from kiln.ir.interpreter import SQUEEZES, bind_symbols, run_program, watching
from kiln.ir.program import ExportedProgram, OutputKind
from kiln.ir.types import TensorType

from tests.fuzz.programs import Case, build_program

# -- backends


def _onnx(program: ExportedProgram, inputs: list[np.ndarray], workdir: pathlib.Path) -> list[np.ndarray]:
    from kiln.codegen.onnx import export_program
    return export_program(program).run(inputs)


def _planning(target: str) -> Callable[[ExportedProgram], None]:
    """What kiln.compile does before rendering, which raises UnsupportedError for what `target` refuses."""
    def precheck(program: ExportedProgram) -> None:
        from kiln.codegen.driver import DEFAULT_PIPELINE, backend
        from kiln.codegen.legalize import legalize
        from kiln.passes import run as run_passes
        emitter = backend(target)
        emitter.plan(legalize(run_passes(program, DEFAULT_PIPELINE), emitter.TARGET))
    return precheck


@contextlib.contextmanager
def _capability(capability: str) -> Iterator[None]:
    saved = os.environ.get("KILN_CPU_CAPABILITY")
    os.environ["KILN_CPU_CAPABILITY"] = capability
    try:
        yield
    finally:
        if saved is None:
            del os.environ["KILN_CPU_CAPABILITY"]
        else:
            os.environ["KILN_CPU_CAPABILITY"] = saved


def _c(capability: str) -> Callable[..., list[np.ndarray]]:
    def run(program: ExportedProgram, inputs: list[np.ndarray], workdir: pathlib.Path) -> list[np.ndarray]:
        from kiln.compiler import compile as compile_c
        with _capability(capability):
            model = compile_c(program, output=workdir / f"c_{capability}")
        outputs = model(*inputs)
        return list(outputs) if isinstance(outputs, tuple) else [outputs]
    return run


def _triton(program: ExportedProgram, inputs: list[np.ndarray], workdir: pathlib.Path) -> list[np.ndarray]:
    """Triton's interpreter on CPU tensors (TRITON_INTERPRET=1, set before triton's first import)."""
    from kiln.compiler import compile as compile_program
    model = compile_program(program, target="triton", output=workdir / "triton")
    outputs = model(*inputs)
    return list(outputs) if isinstance(outputs, tuple) else [outputs]


def _pt2(program: ExportedProgram, inputs: list[np.ndarray], workdir: pathlib.Path) -> list[np.ndarray]:
    import kiln
    kiln.save(program, workdir / "program.pt2")
    loaded = kiln.load(workdir / "program.pt2")
    # the user outputs (an op like batch_norm in training mode also writes in place to an input: torch's file says
    # so with an output of its own, which kiln reads back)
    return [value for value, spec in zip(run_program(loaded, inputs), loaded.graph_signature.output_specs)
            if spec.kind is OutputKind.USER_OUTPUT]


# torch eager's errors about strides, which a functional program (no strides) cannot be held to, and its kernels'
# refusals of dtypes and of empty dims that its own shape rules accept (topk of bools; convolution and pooling over
# an empty spatial dim; batch norm over zero channels reads channel 0; the learnable fake-quantize kernels take the
# min() of an empty zero-point tensor; its MKL FFTs over a tensor with an empty batch dim), and of sparse layouts it
# has no CPU kernel for (a linear layer's BSR weight with non-square blocks goes to MKL, which refuses it)
TORCH_KERNEL_REFUSALS = ("requires contiguous input", "view size is not compatible with input tensor's size and stride",
                         "does not support bool dtypes on CPU", "Only zero batch or zero channel inputs are supported",
                         "out of range for tensor of size [0]",
                         "Expected reduction dim to be specified for input.numel() == 0",
                         "MKL Sparse doesn't support matrices with non-square blocks",
                         "MKL FFT error: Intel oneMKL DFTI ERROR: Inconsistent configuration parameters")


def _squeezes_a_data_dependent_dim(program: ExportedProgram) -> bool:
    """Whether a squeeze meets a dim sized by a data-dependent symbol (`u0`): the trace keeps it unless it is
    known to be 1, but torch eager decides on the run-time size."""
    return any(getattr(getattr(op, "opdef", None), "name", "") in SQUEEZES and any(
        not isinstance(d, int) and any(str(s).startswith("u") for s in d.free_symbols)
        for d in op.operands[0].type.shape) for op in program.walk_nodes())


class TorchRefused(Exception):
    """torch.export.load could not load the file (the torch path is skipped for it)."""


@contextlib.contextmanager
def _without_onednn(torch: Any) -> Iterator[None]:
    """torch's native kernels inside, not oneDNN's: its bfloat16 convolution lets a NaN reach outputs whose window
    does not hold it (torch 2.13 on an AVX-512 BF16 Xeon: a NaN in input column 3 made output column 0 NaN; fuzz seed
    12000). (torch.backends.mkldnn.flags also sets oneDNN's TF32 switch, which warns on a CPU build.)"""
    enabled = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = enabled


def _torch(program: ExportedProgram, inputs: list[np.ndarray], workdir: pathlib.Path) -> list[np.ndarray]:
    import kiln
    import torch
    from tests.torch_oracle import to_numpy, to_torch
    path = workdir / "torch.pt2"
    kiln.save(program, path)
    try:
        module = torch.export.load(path).module()
    except Exception as error:  # noqa: BLE001  (torch's own refusal, of any type)
        raise TorchRefused(f"{type(error).__name__}: {error}") from error
    if _squeezes_a_data_dependent_dim(program):
        raise TorchRefused("torch eager drops a data-dependent dim that is 1 at run time, which its export kept "
                           "(guard_or_false), so its eager run and its own program's shapes disagree")
    with torch.no_grad(), _without_onednn(torch):
        try:
            outputs = module(*[to_torch(np.asarray(x)) for x in inputs])
        except (NotImplementedError, RuntimeError, IndexError) as error:
            if str(error).startswith("Expected input at") and 0 in bind_symbols(program, inputs).values():
                # torch's backed sizes are positive: its guards simplify size expressions assuming so (Min(1, s1)
                # is 1), so a size symbol that is 0 at run time fails them
                raise TorchRefused(f"a size symbol is 0 at run time, which torch assumes never happens: {error}") \
                    from error
            if not isinstance(error, NotImplementedError) and not any(
                    pattern in str(error) for pattern in TORCH_KERNEL_REFUSALS):
                raise
            # torch eager has no kernel for the dtype ("max_pool1d_impl" not implemented for 'Long'), wants a
            # memory layout kiln's functional IR has no notion of, or has no kernel for the empty dims its shape
            # rules accept: torch's limit, not a wrong answer of kiln's
            raise TorchRefused(f"{type(error).__name__}: {error}") from error
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    return [np.asarray(to_numpy(o)) for o in outputs]


@dataclass(frozen=True)
class Backend:
    name: str
    run: Callable[[ExportedProgram, list[np.ndarray], pathlib.Path], list[np.ndarray]]
    precheck: Callable[[ExportedProgram], None] | None = None  # cheap: raises UnsupportedError where run would


def available_backends() -> list[Backend]:
    found = [Backend("onnx", _onnx)]
    if shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc"):
        from kiln.codegen.c import supported_capabilities
        found += [Backend(f"c[{cap}]", _c(cap), _planning("c")) for cap in supported_capabilities()]
    if os.environ.get("TRITON_INTERPRET") == "1":
        try:
            import triton  # noqa: F401
            import torch  # noqa: F401  (the Triton target launches kernels on torch tensors)
            found.append(Backend("triton", _triton, _planning("triton")))
        except ImportError:
            pass
    found.append(Backend("pt2", _pt2))
    try:
        import torch  # noqa: F401
        found.append(Backend("torch", _torch))
    except ImportError:
        pass
    return found


def select_backends(names: Sequence[str] | None) -> list[Backend]:
    """Backends by name; "c" names every capability (`c[AVX2]`, ...)."""
    every = available_backends()
    if names is None:
        return every
    return [b for b in every if b.name in names or b.name.split("[")[0] in names]


# -- comparing


def compare(got: Any, want: Any, computed_in: Sequence[dtypes.DType] = ()) -> str | None:
    """Why `got` is not `want` (None when close): dtype, shape, or values at the default tolerances of the loosest of
    its dtype and the floating dtypes it was `computed_in` (a float64 sum of float32 results is as exact as they)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"got {dtypes.dtype(got.dtype).name}{list(got.shape)}, expected " \
               f"{dtypes.dtype(want.dtype).name}{list(want.shape)}"
    kind = dtypes.dtype(want.dtype)
    if kind is dtypes.bfloat16 or kind is dtypes.float16:  # numpy's comparisons want a native float
        got, want = got.astype(np.float32), want.astype(np.float32)
    rtol, atol = default_tolerances(kind, *(d for d in computed_in if d.is_floating_point)) \
        if kind.is_floating_point else default_tolerances(kind)
    close = closeness(got, want, rtol, atol, equal_nan=True)
    if close.ok:
        return None
    (absolute, at), _ = close.greatest(mismatches_only=True)
    return (f"{close.mismatched}/{close.close.size} elements differ ({kind.name}, rtol {rtol}, atol {atol}); "
            f"greatest difference {absolute} at {list(at)}: got {got[at]!r}, expected {want[at]!r}")


# How far a backend may be from the oracle, in multiples of the oracle's own spread under 1-ulp changes of its float
# inputs, for a mismatch to count as ill-conditioned rather than wrong (see ill_conditioned).
SPREAD_FACTOR = 4


def _nudged(inputs: list[np.ndarray], direction: str, rng: np.random.Generator) -> list[np.ndarray]:
    """The inputs with every finite float element moved one ulp: away from zero, toward it (a zero stays), or either
    way at random."""
    moved = []
    for x in map(np.asarray, inputs):
        if not dtypes.dtype(x.dtype).is_floating_point or x.size == 0:
            moved.append(x)
            continue
        values = x.astype(np.float64)
        up = {"away": values >= 0, "toward": values < 0, "random": rng.random(x.shape) < 0.5}[direction]
        still = ~np.isfinite(values) | ((values == 0) & (direction == "toward"))
        moved.append(np.where(still, x, _next_float(x, up)))
    return moved


def _next_float(x: np.ndarray, up: np.ndarray) -> np.ndarray:
    """The neighbouring float of x's own dtype, toward +inf where `up`, else toward -inf (numpy's nextafter has the
    native floats only: a 16-bit one steps its bit pattern, whose magnitude grows by one per step)."""
    if x.dtype.itemsize >= 4:
        return np.nextafter(x, np.where(up, np.inf, -np.inf).astype(x.dtype))
    values, bits = x.astype(np.float32), x.view(np.uint16).astype(np.int32)
    stepped = np.where(values == 0, np.where(up, 0x0001, 0x8001), bits + np.where(up == (values > 0), 1, -1))
    return stepped.astype(np.uint16).view(x.dtype)


# Ops that sum products or elements: a backend may add their terms in another order, which moves the result by
# about one ulp of the sum of the terms' magnitudes, far more than one ulp of the result where terms cancel. An
# interpolation is such a sum too (onnxruntime's Resize computes a lerp, ATen a weighted sum: seed 9191's logit of a
# bilinear upsample near 0), and so is an average pool. (The op on |operands| is that magnitude for weights >= 0;
# bicubic's few negative weights make it smaller: conservative. grid_sampler is left out: |grid| moves the samples.)
ACCUMULATING = {f"aten.{name}" for name in (
    "mm.default", "bmm.default", "matmul.default", "addmm.default", "baddbmm.default", "addbmm.default",
    "addmv.default", "mv.default", "dot.default", "linear.default", "einsum.default", "bilinear.default",
    "sum.default", "sum.dim_IntList", "mean.default", "mean.dim", "cumsum.default", "conv1d.default",
    "conv2d.default", "conv3d.default", "convolution.default", "tensordot.default", "conv1d.padding",
    "conv2d.padding", "conv3d.padding", "conv_transpose1d.default", "conv_transpose2d.input",
    "conv_transpose3d.input", "upsample_linear1d.default", "upsample_linear1d.vec", "upsample_bilinear2d.default",
    "upsample_bilinear2d.vec", "upsample_bicubic2d.vec", "avg_pool1d.default", "avg_pool2d.default",
    "avg_pool3d.default", "adaptive_avg_pool1d.default", "adaptive_avg_pool2d.default", "adaptive_avg_pool3d.default",
    "_adaptive_avg_pool2d.default", "_adaptive_avg_pool3d.default")}


def _backend_float(arguments: Any) -> type:
    """The float type a backend computes an op in: float64 for float64 operands, else float32 (the interpreter hands
    some float32 results on in float64)."""
    def has_float64(value: Any) -> bool:
        if isinstance(value, (list, tuple)):
            return any(map(has_float64, value))
        return isinstance(value, np.ndarray) and value.dtype == np.float64
    return np.float64 if has_float64(list(arguments)) else np.float32


def _reordering(opdef: Any, arguments: Any, result: np.ndarray, direction: str, exact: Any,
                rng: np.random.Generator) -> np.ndarray:
    """`result` of an accumulating op moved by one ulp of its terms' summed magnitudes (the op on |operands|), an ulp
    of the dtype a backend sums in: float64 for float64 operands, else float32 (or the result's, if coarser). The
    interpreter hands some float32 sums on in float64 (a convolution's), whose ulp is no backend's."""
    def magnitudes(value: Any) -> Any:  # float operands (and lists of them, einsum's) made non-negative
        if isinstance(value, list):
            return [magnitudes(v) for v in value]
        return np.abs(value) if isinstance(value, np.ndarray) and value.dtype.kind == "f" else value

    summed = _backend_float(arguments)
    magnitude = exact(opdef, [magnitudes(a) for a in arguments])
    step = np.abs(np.asarray(magnitude, np.float64)) * max(np.finfo(result.dtype).eps, np.finfo(summed).eps)
    return _moved(result, step, direction, rng)


def _moved(result: np.ndarray, step: np.ndarray, direction: str, rng: np.random.Generator) -> np.ndarray:
    """`result` moved by `step` (float64, per element) away from zero, toward it, or either way at random."""
    sign = {"away": np.sign(result), "toward": -np.sign(result),
            "random": np.where(rng.random(result.shape) < 0.5, 1.0, -1.0)}[direction]
    with np.errstate(invalid="ignore", over="ignore"):
        return (result.astype(np.float64) + sign * step).astype(result.dtype)


# Normalizations ATen's CPU kernels (and onnxruntime's) compute folded, y = x * alpha + (b - mean * alpha) with
# alpha = w / sqrt(var + eps): where x is close to the mean, the two terms cancel, and the result is off by an ulp of
# their magnitudes, not of y (a channel of one element: y = b exactly, folded 4e-4 from it). Each maps the op's
# arguments to (x, weight, bias, the dims its batch statistics reduce over or None, the running mean and variance
# where it takes those, eps[, False for a layer norm's weight and bias over the normalized dims, not the channels]).
def _norm_arguments(name: str, a: list[Any]) -> tuple[Any, ...] | None:
    def spatial() -> tuple[int, ...]:  # (a norm's input only: another op's first argument may be a list, cat's)
        return tuple(range(2, np.ndim(a[0])))
    if name == "aten.instance_norm.default":
        return (a[0], a[1], a[2], spatial(), None, a[7]) if a[5] else (a[0], a[1], a[2], None, (a[3], a[4]), a[7])
    if name in ("aten.batch_norm.default", "aten.native_batch_norm.default", "aten._native_batch_norm_legit.default"):
        return (a[0], a[1], a[2], (0, *spatial()), None, a[7]) if a[5] else \
            (a[0], a[1], a[2], None, (a[3], a[4]), a[7])
    if name == "aten._native_batch_norm_legit.no_stats":
        return (a[0], a[1], a[2], (0, *spatial()), None, a[5])
    if name == "aten._native_batch_norm_legit_no_training.default":
        return (a[0], a[1], a[2], None, (a[3], a[4]), a[6])
    if name in ("aten.layer_norm.default", "aten.native_layer_norm.default"):
        rank = np.ndim(a[0])
        return (a[0], a[2], a[3], tuple(range(rank - len(a[1]), rank)), None, a[4], False)
    return None


def _folded_norm_step(x: np.ndarray, weight: Any, bias: Any, axes: tuple[int, ...] | None, running: Any,
                      eps: float, on_channels: bool = True) -> np.ndarray:
    """One ulp (of float32, or of float64 for float64 x) of |x * alpha| + |b| + |mean * alpha|, the folded form's
    terms, per element of x (non-empty): the mean and variance over `axes`, else the `running` pair; the weight and
    bias per channel (dim 1), else over the trailing dims (a layer norm's)."""
    x64 = x.astype(np.float64)
    channel = (1, -1) + (1,) * (x.ndim - 2)
    if axes is not None:
        mean, var = x64.mean(axis=axes, keepdims=True), x64.var(axis=axes, keepdims=True)
    else:
        mean, var = (np.asarray(s, np.float64).reshape(channel) for s in running)

    def affine(value: Any, default: float) -> Any:
        if value is None:
            return default
        value = np.asarray(value, np.float64)
        return value.reshape(channel) if on_channels else value
    w, b = affine(weight, 1.0), affine(bias, 0.0)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        alpha = np.abs(w / np.sqrt(var + eps))
        ulp = np.finfo(np.float64 if x.dtype == np.float64 else np.float32).eps
        return (np.abs(x64) * alpha + np.abs(b) + np.abs(mean) * alpha) * ulp


# Ops a backend computes to an ulp of a bound of their values rather than of the result: per op, from its arguments,
# that bound for each result. onnxruntime's Sigmoid is exact to about an ulp of 1 (6e-8 at x = -16, where the result
# is 1.1e-7; 0 below -18, where ATen's is 1.5e-8 and under), and so are the gates of its recurrent cells; silu is
# x * sigmoid(x) there (torch.onnx's form, and kiln's).
ABSOLUTE_ULP: dict[str, Callable[[list[Any]], list[np.ndarray]]] = {
    "aten.sigmoid.default": lambda a: [np.ones_like(a[0])],
    "aten.silu.default": lambda a: [np.abs(a[0])],
    # h' = (1 - z) * n + z * h, off by an ulp of 1 times |n - h| <= 1 + |h| for z's (n's adds up to 1 - z of one)
    "aten.gru_cell.default": lambda a: [2 + np.abs(a[1])],
    # c' = f * c + i * g, off by an ulp of 1 times |c| + 1 for f and i (and g's), and h' = o * tanh(c') by 1 more
    # for o, 1 for tanh and c's error
    "aten.lstm_cell.default": lambda a: [4 + np.abs(a[1][1]), 2 + np.abs(a[1][1])],
}


# Ops ATen computes as 0.5 x (1 + f) with f going to -1 in the negative tail (gelu: f = tanh(...) or erf(x / sqrt 2)):
# a libm whose f is one ulp off near -1 (of the float the op computes in: float32 for half precision too) makes an
# absolute difference of 0.5 |x| such ulps, however small the result (gelu(-5) is 1e-6).
TAIL_CANCELLING: dict[str, Callable[[list[Any]], np.ndarray]] = {
    "aten.gelu.default": lambda a: 0.5 * np.abs(np.asarray(a[0], np.float64)),
}


@contextlib.contextmanager
def _rounding_noise(direction: str, rng: np.random.Generator) -> Iterator[None]:
    """Inside, the interpreter moves every float result of every op one ulp (the rounding a backend may differ by),
    an accumulating op's result one ulp of its terms' summed magnitudes (another order of the sum), a sigmoid's or a
    recurrent cell's one ulp of 1 times a bound of its terms (ABSOLUTE_ULP), a gelu's by its tail's cancellation
    too (TAIL_CANCELLING), and a normalization's one ulp of its folded form's terms (`_folded_norm_step`)."""
    from kiln.ir import interpreter
    exact = interpreter.run_kernel

    def noisy(opdef: Any, arguments: Any) -> Any:
        result = exact(opdef, arguments)
        if opdef.name in ACCUMULATING and isinstance(result, np.ndarray) and result.dtype.kind == "f" \
                and result.size:
            return _reordering(opdef, arguments, result, direction, exact, rng)
        tail = TAIL_CANCELLING.get(opdef.name)
        if tail is not None and isinstance(result, np.ndarray) and dtypes.dtype(result.dtype).is_floating_point \
                and result.size:
            step = tail(list(arguments)) * np.finfo(_backend_float(arguments)).eps
            return _moved(_nudged([result], direction, rng)[0], step, direction, rng)
        results = list(result) if isinstance(result, (list, tuple)) else [result]
        bounds = ABSOLUTE_ULP.get(opdef.name)
        if bounds is not None and all(isinstance(r, np.ndarray) and r.dtype.kind == "f" and r.size for r in results):
            moved = []
            unit = max([np.finfo(_backend_float(arguments)).eps] + [np.finfo(value.dtype).eps for value in results])
            for value, bound in zip(results, bounds(list(arguments))):
                step = np.abs(np.asarray(bound, np.float64)) * unit
                shifted = _moved(value, step, direction, rng)
                if direction == "toward":  # down to zero, not past it: onnxruntime's Sigmoid flushes its tail to 0
                    shifted = np.where(np.abs(value) <= step, np.copysign(np.zeros_like(value), value), shifted)
                moved.append(shifted)
            return type(result)(moved) if isinstance(result, (list, tuple)) else moved[0]
        norm = _norm_arguments(opdef.name, list(arguments))
        out = result[0] if isinstance(result, (list, tuple)) else result
        if norm is not None and isinstance(out, np.ndarray) and out.dtype.kind == "f" and out.size:
            moved = _moved(out, _folded_norm_step(*norm), direction, rng)
            if not isinstance(result, (list, tuple)):
                return moved
            rest = [_nudged([r], direction, rng)[0] if isinstance(r, np.ndarray) else r for r in result[1:]]
            return type(result)([moved, *rest])
        if isinstance(result, (list, tuple)):
            return type(result)(_nudged([r], direction, rng)[0] if isinstance(r, np.ndarray) else r for r in result)
        return _nudged([result], direction, rng)[0] if isinstance(result, np.ndarray) else result
    interpreter.run_kernel = noisy
    try:
        yield
    finally:
        interpreter.run_kernel = exact


# How ill_conditioned moves the inputs and the op results one ulp: together (away from zero, toward it, at random), and
# apart, so that a result computed from an input and from an op on other inputs (remainder(exp(i), b): both move up
# together, and the shift cancels) shows its spread too
MOVES = [("away", "away"), ("toward", "toward"), ("random", "random"), ("away", "toward"), ("toward", "away")]


def ill_conditioned(program: ExportedProgram, inputs: list[np.ndarray], expected: list[Any], got: list[Any],
                    outputs: list[int]) -> bool:
    """Whether the mismatching `outputs` are rounding amplified by an ill-conditioned computation (exp of a large
    dot product, a softmax down to subnormals, a float a ulp below an integer converted to int): each differing
    element of a float output lies within SPREAD_FACTOR times the oracle's own spread when its float inputs and every
    op's float results move one ulp (away from zero, toward it, at random, and the inputs one way and the results
    the other: MOVES; rounding, as a backend's order of operations or libm differs), plus the dtype's tolerance;
    each differing element of an integer or bool output is a value one of those moved runs gives it. A conservative
    test: cancellation can hide the spread, and then the mismatch stays a mismatch."""
    rng = np.random.default_rng(0)
    try:
        runs = []
        for inputs_move, results_move in MOVES:
            with _rounding_noise(results_move, rng):
                runs.append(run_program(program, _nudged(inputs, inputs_move, rng)))
    except Exception:  # noqa: BLE001  (the nudged values leave the program's domain)
        return False
    for index in outputs:
        want, have = np.asarray(expected[index]), np.asarray(got[index])
        if want.shape != have.shape or have.dtype != want.dtype:
            return False
        if any(np.shape(run[index]) != want.shape for run in runs):  # (a data-dependent shape moved)
            return False
        if not dtypes.dtype(want.dtype).is_floating_point:
            reached = functools.reduce(np.logical_or, [np.asarray(run[index]) == have for run in runs])
            if not ((have == want) | reached).all():
                return False
            continue
        want, have = want.astype(np.float64), have.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            moved = [np.asarray(run[index], np.float64) for run in runs]
            spread = np.max([np.where(m == want, 0.0, np.abs(m - want)) for m in moved], axis=0)  # inf - inf: none
            rtol, atol = default_tolerances(dtypes.dtype(np.asarray(expected[index]).dtype))
            spread = np.nan_to_num(spread, nan=np.inf, posinf=np.inf)  # a nudged run reached NaN or inf: unbounded
            difference = np.abs(have - want)
            within = (have == want) | (np.isnan(have) & np.isnan(want)) | np.isinf(spread) | \
                (np.isfinite(difference) & (difference <= atol + rtol * np.abs(want) + SPREAD_FACTOR * spread))
        if not within.all():
            return False
    return True


# Ops that return indices ATen leaves unspecified among equal values, by the position of that index result: topk,
# and sort / argsort unless stable=True.
TIE_ORDERED = {"aten.topk.default": 1, "aten.sort.default": 1, "aten.sort.stable": 1, "aten.argsort.default": 0,
               "aten.argsort.stable": 0}


def tie_dependent(program: ExportedProgram, inputs: list[np.ndarray], outputs: list[int]) -> bool:
    """Whether each mismatching output in `outputs` is computed from the indices a topk or an unstable sort chose
    among equal values (its operand, as the oracle computes it, holds a repeated value): which of the tied
    positions comes first is the kernel's choice, so a backend may choose another and be right."""
    orders = {}  # index result -> the op's operand
    for op in program.body.walk():
        position = TIE_ORDERED.get(getattr(getattr(op, "opdef", None), "name", ""))
        if position is not None and not dict(zip((a.name for a in op.opdef.schema.arguments),
                                                 bound_arguments(op))).get("stable"):
            orders[op.results[position]] = op.operands[0]
    if not orders:
        return False
    reached = [_feeding(program, index, orders) for index in outputs]
    if not all(reached):
        return False
    operands = _values(program, inputs, {orders[v] for found in reached for v in found})
    if operands is None:
        return False

    def tied(value: Any) -> bool:
        array = np.asarray(operands.get(orders[value], []))
        if array.dtype.kind not in "biu":
            array = array.astype(np.float64)
        return array.size > np.unique(array).size  # (NaNs count as equal)
    return all(any(tied(v) for v in found) for found in reached)


# Ops whose float32 ONNX form is `Resize`, which leaves out a tap of weight 0 where ATen multiplies it, so an infinity
# beside an on-grid sample is NaN in ATen and inf in onnxruntime (a documented divergence, docs/onnx.md; float64 takes
# ATen's taps and agrees).
RESIZED = ("aten.upsample_bilinear", "aten.upsample_bicubic")


def resize_dropped_infinity(program: ExportedProgram, inputs: list[np.ndarray], expected: list[Any], got: list[Any],
                            outputs: list[int]) -> bool:
    """Whether each mismatching output in `outputs` is onnxruntime's `Resize` leaving out a weight-0 tap (RESIZED): a
    bilinear or bicubic upsampling whose non-float64 operand holds an infinity, in the oracle's run, feeds it, and
    every element that differs is NaN in the oracle (inf x 0) and a number in the backend's result."""
    upsamplings = {}  # result -> operand
    for op in program.body.walk():
        if getattr(getattr(op, "opdef", None), "name", "").startswith(RESIZED) and \
                op.operands[0].type.dtype != dtypes.float64:
            upsamplings[op.results[0]] = op.operands[0]
    reached = [_feeding(program, index, upsamplings) for index in outputs]
    if not upsamplings or not all(reached):
        return False
    operands = _values(program, inputs, {upsamplings[v] for found in reached for v in found})
    if operands is None:
        return False
    for index, found in zip(outputs, reached):
        if not any(np.isinf(np.asarray(operands.get(upsamplings[v], []), np.float64)).any() for v in found):
            return False
        want, have = np.asarray(expected[index]), np.asarray(got[index])
        if want.shape != have.shape or want.dtype.kind != "f" or have.dtype.kind != "f":
            return False
        with np.errstate(invalid="ignore"):
            differs = ~((want == have) | (np.isnan(want) & np.isnan(have)))
        if not (np.isnan(want) & ~np.isnan(have))[differs].all():
            return False
    return True


def _feeding(program: ExportedProgram, index: int, candidates: Any) -> set[Any]:
    """The values among `candidates` that output `index` of the program is computed from."""
    seen, pending, found = set(), [program.body.last_op.operands[index]], set()
    while pending:
        value = pending.pop()
        if value in seen:
            continue
        seen.add(value)
        if value in candidates:
            found.add(value)
        if isinstance(value, OpResult):
            pending += list(value.op.operands)
    return found


def _values(program: ExportedProgram, inputs: list[np.ndarray], wanted: set[Any]) -> dict[Any, np.ndarray] | None:
    """The `wanted` values of the program as the interpreter computes them on `inputs` (None when it fails)."""
    values: dict[Any, np.ndarray] = {}
    try:
        with watching(lambda value, array: values.__setitem__(value, array) if value in wanted else None):
            run_program(program, inputs)
    except Exception:  # noqa: BLE001
        return None
    return values


# -- outcomes and the report


@dataclass
class Failure:
    backend: str
    kind: str  # "mismatch" or "crash"
    message: str
    case: Case

    def __str__(self) -> str:
        return f"{self.backend} {self.kind}: {self.message}"

    @property
    def signature(self) -> tuple[str, str, str]:
        """What makes two failures the same bug, roughly: the backend, the kind, and the message without its numbers
        (for a mismatch, up to the dtype)."""
        message = re.sub(r"\b[su]\d+\b", "s#", self.message)  # symbols
        message = re.sub(r"(?<![A-Za-z_\d])-?\d+(\.\d+)?(e[-+]?\d+)?", "#", message)  # numbers; float32 stays
        return self.backend, self.kind, message.split(", rtol")[0] if self.kind == "mismatch" else message[:200]


@dataclass
class Report:
    """Figures of a fuzz run: programs the oracle ran, ops they covered, and per backend the cases that matched,
    mismatched, crashed, were refused, or differed only as float rounding through an ill-conditioned computation
    (ill_conditioned), by a choice among tied values (tie_dependent) or by onnxruntime's Resize at an infinity
    (resize_dropped_infinity)."""

    programs: int = 0
    rejected: collections.Counter = field(default_factory=collections.Counter)  # oracle refusals by reason
    ops: collections.Counter = field(default_factory=collections.Counter)
    outcomes: dict[str, collections.Counter] = field(default_factory=lambda: collections.defaultdict(
        collections.Counter))
    refusals: dict[str, collections.Counter] = field(default_factory=lambda: collections.defaultdict(
        collections.Counter))
    failures: list[Failure] = field(default_factory=list)

    def record(self, backend: str, outcome: str, detail: str = "") -> None:
        self.outcomes[backend][outcome] += 1
        if outcome == "unsupported":
            self.refusals[backend][detail] += 1

    def summary(self, scope: Collection[str] = ()) -> str:
        """The figures; with `scope`, the ops the generator draws, also how many of them ran and which did not."""
        covered = f"{len(self.ops)}" + (f" of {len(scope)} in scope" if scope else "")
        missed = sorted(set(scope) - set(self.ops))
        lines = [f"programs: {self.programs} (oracle refused {sum(self.rejected.values())} more)",
                 f"ops covered: {covered}, {sum(self.ops.values())} op applications"]
        if missed:
            lines.append(f"ops in scope that no program ran: {', '.join(missed)}")
        lines += [f"mismatches: {sum(c['mismatch'] for c in self.outcomes.values())}",
                  f"crashes: {sum(c['crash'] for c in self.outcomes.values())}",
                  f"ill-conditioned (float rounding amplified, within {SPREAD_FACTOR}x the oracle's spread under 1-ulp "
                  f"input changes): {sum(c['ill-conditioned'] for c in self.outcomes.values())}",
                  f"tie-dependent (indices a topk or unstable sort chose among equal values): "
                  f"{sum(c['tie-dependent'] for c in self.outcomes.values())}",
                  f"resize-infinity (onnxruntime's Resize leaves out a weight-0 tap, ATen multiplies inf by it: "
                  f"docs/onnx.md): {sum(c['resize-infinity'] for c in self.outcomes.values())}"]
        lines.append(f"{'backend':<14}{'programs':>9}{'matched':>9}{'mismatch':>9}{'crash':>7}{'unsupported':>12}"
                     f"{'ill-cond.':>10}{'ties':>6}{'resize':>8}")
        for name, counts in self.outcomes.items():
            lines.append(f"{name:<14}{sum(counts.values()):>9}{counts['matched']:>9}{counts['mismatch']:>9}"
                         f"{counts['crash']:>7}{counts['unsupported']:>12}{counts['ill-conditioned']:>10}"
                         f"{counts['tie-dependent']:>6}{counts['resize-infinity']:>8}")
        shown: set[tuple] = set()
        for name, reasons in self.refusals.items():  # what each backend refused most (once for alike backends)
            top = tuple(reasons.most_common(3))
            if top and top not in shown:
                shown.add(top)
                lines.append(f"{name} refused most: " + "; ".join(f"{count} x {reason[:150]}" for reason, count in top))
        return "\n".join(lines)


def _first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"[:300]


def _refusal(error: BaseException) -> str | None:
    """A backend's documented refusal (its first line), or None for a crash."""
    if isinstance(error, (UnsupportedError, TorchRefused)) or isinstance(error, BackendFailed) and error.refused:
        return _first_line(error)
    return None


# -- the worker process backends run in

BACKEND_SECONDS = 600  # for one program (a batch of cases)


def _run_in_worker(name: str, text: str, inputs: list[np.ndarray], state_dict: dict[str, np.ndarray],
                   constants: dict[str, np.ndarray]) -> tuple[str, Any]:
    """In the worker: ("ok", outputs), or ("refused" or "crash", the error's first line)."""
    import warnings

    import onnxruntime
    warnings.filterwarnings("ignore")
    onnxruntime.set_default_logger_severity(3)  # a failing session's log lines repeat the failure
    backend = {b.name: b for b in available_backends()}[name]
    with tempfile.TemporaryDirectory(prefix="kiln_fuzz_") as workdir:
        try:
            program = ExportedProgram.from_mlir(text, state_dict, constants)
            outputs = backend.run(program, inputs, pathlib.Path(workdir))
            return "ok", [np.asarray(o) for o in outputs]
        except Exception as error:  # noqa: BLE001
            refusal = _refusal(error)
            return ("refused", refusal) if refusal else ("crash", _first_line(error))


class BackendFailed(Exception):
    """A backend's failure in the worker, as its first line."""

    def __init__(self, message: str, refused: bool = False):
        super().__init__(message)
        self.refused = refused


class Worker:
    """The process backends run in, so that a crash in native code (a compiled model, onnxruntime or torch reading out
    of bounds) or a hang is a recorded crash instead of the end of the run. The program travels as MLIR text, which
    round-trips exactly, with its weights beside it. Started on first use, and replaced after it dies."""

    def __init__(self) -> None:
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def run(self, backend: Backend, program: ExportedProgram, inputs: list[np.ndarray],
            seconds: float = BACKEND_SECONDS) -> list[np.ndarray]:
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        future = self._pool.submit(_run_in_worker, backend.name, program.to_mlir(), inputs, program.state_dict,
                                   program.constants)
        try:
            status, payload = future.result(timeout=seconds)
        except concurrent.futures.TimeoutError:
            self.stop()
            raise BackendFailed(f"Timeout: no result after {seconds}s") from None
        except concurrent.futures.process.BrokenProcessPool:
            self.stop()
            raise BackendFailed("WorkerDied: the backend's process died (a crash in native code)") from None
        if status != "ok":
            raise BackendFailed(payload, refused=status == "refused")
        return payload

    def stop(self) -> None:
        if self._pool is not None:
            for process in list(self._pool._processes.values()):  # the executor has no kill of its own
                process.kill()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


WORKER = Worker()


# -- running


def computed_in(program: ExportedProgram) -> list[set[dtypes.DType]]:
    """Per output, the dtypes of the values it is computed from."""
    found = []
    for output in program.body.last_op.operands:
        seen, kinds, pending = set(), set(), [output]
        while pending:
            value = pending.pop()
            if value in seen:
                continue
            seen.add(value)
            if isinstance(value.type, TensorType):
                kinds.add(value.type.dtype)
            if isinstance(value, OpResult):
                pending += list(value.op.operands)
        found.append(kinds)
    return found


def oracle(case: Case, report: Report) -> tuple[list[Any], list[set[dtypes.DType]]] | Failure | None:
    """The interpreter's outputs for `case` and the dtypes each is computed from; None when it refuses the inputs (a
    data-dependent error, like an index out of range), a Failure when it crashes."""
    program = build_program([case.dag])
    try:
        return run_program(program, case.inputs), computed_in(program)
    except VerificationError as error:  # a kernel disagreeing with its meta rule
        return Failure("interpreter", "crash", _first_line(error), case)
    except KilnError as error:
        report.rejected[_first_line(error)[:120]] += 1
        return None
    except Exception as error:  # noqa: BLE001
        return Failure("interpreter", "crash", _first_line(error), case)


def run_backend(backend: Backend, items: list[tuple[Case, list[Any]]], report: Report) -> list[Failure]:
    """`backend` on the cases of `items` (each with the oracle's outputs): the cases its precheck takes, as one
    program, halved on failure until the failing case is alone."""
    failures = []
    if backend.precheck is not None and len(items) > 1:
        kept = []
        for item in items:
            verdict = _precheck(backend, item, report)
            if verdict is None:
                kept.append(item)
            failures += verdict or []
        items = kept
    return failures + _run_group(backend, items, report)


def _run_group(backend: Backend, items: list[tuple[Case, list[Any]]], report: Report) -> list[Failure]:
    if not items:
        return []
    program = build_program([case.dag for case, _ in items])
    inputs = [x for case, _ in items for x in case.inputs]
    try:
        outputs = WORKER.run(backend, program, inputs)
    except Exception as error:  # noqa: BLE001
        if len(items) > 1 and not str(error).startswith("Timeout"):
            half = len(items) // 2
            return _run_group(backend, items[:half], report) + _run_group(backend, items[half:], report)
        refusal = _refusal(error)
        report.record(backend.name, "unsupported" if refusal else "crash", refusal or "")
        return [] if refusal else [Failure(backend.name, "crash", _first_line(error), items[0][0])]
    failures, start = [], 0
    for case, (expected, kinds) in items:
        got = outputs[start:start + len(expected)]
        start += len(expected)
        differing = [i for i, (g, e, k) in enumerate(zip(got, expected, kinds)) if compare(g, e, k)]
        problems = [f"output {i}: {compare(got[i], expected[i], kinds[i])}" for i in differing]
        if len(got) != len(expected):
            problems.append(f"{len(got)} outputs, expected {len(expected)}")
        elif problems and ill_conditioned(build_program([case.dag]), case.inputs, expected, got, differing):
            report.record(backend.name, "ill-conditioned")
            continue
        elif problems and tie_dependent(build_program([case.dag]), case.inputs, differing):
            report.record(backend.name, "tie-dependent")
            continue
        elif problems and backend.name == "onnx" and resize_dropped_infinity(
                build_program([case.dag]), case.inputs, expected, got, differing):
            report.record(backend.name, "resize-infinity")
            continue
        report.record(backend.name, "mismatch" if problems else "matched")
        if problems:
            failures.append(Failure(backend.name, "mismatch", "; ".join(problems), case))
    return failures


def _precheck(backend: Backend, item: tuple[Case, list[Any]], report: Report) -> list[Failure] | None:
    """None when the backend takes the case, [] when it refuses it, a crash otherwise."""
    try:
        backend.precheck(build_program([item[0].dag]))
    except Exception as error:  # noqa: BLE001
        refusal = _refusal(error)
        report.record(backend.name, "unsupported" if refusal else "crash", refusal or "")
        return [] if refusal else [Failure(backend.name, "crash", _first_line(error), item[0])]
    return None


def run_cases(cases: Sequence[Case], report: Report, backends: Sequence[Backend] | None = None) -> list[Failure]:
    """Every case through the oracle, then through each backend; the failures, and the figures in `report`."""
    backends = available_backends() if backends is None else backends
    failures, items = [], []
    for case in cases:
        expected = oracle(case, report)
        if isinstance(expected, Failure):
            failures.append(expected)
        elif expected is not None:
            items.append((case, expected))
            report.programs += 1
            report.ops.update(step.op for step in case.dag.steps)
    for backend in backends:
        failures += run_backend(backend, items, report)
    report.failures += failures
    return failures


def check_program(program: ExportedProgram, inputs: list[np.ndarray], backends: Sequence[str] | None = None) -> None:
    """Assert that every backend (or those named) computes what the interpreter computes for `program` on
    `inputs`; a refusal fails too (a regression case must keep running where it once failed)."""
    expected, kinds = run_program(program, inputs), computed_in(program)
    problems = []
    for backend in select_backends(backends):
        try:
            got = WORKER.run(backend, program, inputs)
        except Exception as error:  # noqa: BLE001
            problems.append(f"{backend.name}: {_first_line(error)}")
            continue
        problems += [f"{backend.name} output {i}: {why}" for i, (g, e, k) in enumerate(zip(got, expected, kinds))
                     if (why := compare(g, e, k))]
        if len(got) != len(expected):
            problems.append(f"{backend.name}: {len(got)} outputs, expected {len(expected)}")
    assert not problems, "\n".join(problems)

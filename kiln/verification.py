"""`kiln.verify`: find the first op where a backend (ONNX, C, Triton) disagrees with the reference interpreter.

The program goes through the target's own pipeline, then every used tensor result of a top-level op (a region op
such as kiln.scan counts as one op) also becomes an output, which makes the backend materialize it. Both sides run
on the same inputs; the first op in program order whose result differs beyond tolerance is the one whose lowering
is wrong, since everything it reads matched.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import sympy
from xdsl.dialects import func
from xdsl.dialects.builtin import FunctionType

from kiln.ir import dtypes
from kiln.ir.closeness import closeness, default_tolerances
from kiln.ir.errors import InputError, KilnError
from kiln.ir.program import ExportedProgram, InputKind, OutputKind, OutputSpec, format_value, value_names
from kiln.ir.symbolic import evaluate_dim
from kiln.ir.types import TensorType

TARGETS = ("onnx", "c", "triton")


@dataclass
class TensorStats:
    """A value's shape, dtype and range: min, max and mean over its non-NaN elements (None when there are none)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    min: float | None
    max: float | None
    mean: float | None
    nans: int

    @staticmethod
    def of(name: str, value: Any) -> "TensorStats":
        array = np.asarray(value)
        numbers = (np.abs(array) if np.iscomplexobj(array) else array).astype(np.float64)
        nans = int(np.count_nonzero(np.isnan(numbers)))
        finite = numbers[~np.isnan(numbers)]
        summary = (float(finite.min()), float(finite.max()), float(finite.mean())) if finite.size else (None,) * 3
        return TensorStats(name, tuple(int(d) for d in array.shape), dtypes.dtype(array.dtype).name, *summary, nans)

    def __str__(self) -> str:
        figures = ("min {:.4g}  max {:.4g}  mean {:.4g}".format(self.min, self.max, self.mean)
                   if self.min is not None else "no numbers")
        return f"{self.name}: {self.dtype}{list(self.shape)}  {figures}  nans {self.nans}"


@dataclass
class VerifyResult:
    """What `kiln.verify` found. With `ok` False, the `op_*` fields describe the first divergent op: its position
    among the top-level ops of `program` (the program as the target compiled it, after its pipeline), its name
    (`aten.relu.default`), the op as printed, its source line, its inputs' statistics (they matched) and the error of
    its result."""

    target: str
    ok: bool
    checked: int  # ops whose results were compared
    op_index: int | None = None
    op_name: str | None = None
    op_text: str | None = None
    source: str | None = None
    inputs: list[TensorStats] = field(default_factory=list)
    expected: TensorStats | None = None  # the reference interpreter's result
    actual: TensorStats | None = None  # the target's result
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    mismatched: int = 0  # elements beyond tolerance
    worst: tuple[tuple[int, ...], Any, Any] | None = None  # (index, expected, actual) of the largest difference
    rtol: float | None = None
    atol: float | None = None
    problem: str | None = None  # a shape or dtype that differs, instead of values
    diverged: int = 0  # ops whose results differ, this one and those downstream of it
    program: ExportedProgram | None = field(default=None, repr=False)

    def __str__(self) -> str:
        if self.ok:
            return f"ok: {self.checked} ops agree (target {self.target})"
        lines = [f"{self.target} diverges from the reference interpreter at op {self.op_index}: {self.op_name}",
                 f"  op:        {self.op_text}",
                 f"  source:    {self.source or '<no source line>'}"]
        if self.problem is not None:
            lines.append(f"  error:     {self.problem}")
        else:
            lines.append(f"  error:     {self.mismatched} of {int(np.prod(self.expected.shape))} elements beyond "
                         f"rtol {self.rtol:g}, atol {self.atol:g}; max abs error {self.max_abs_error:.4g}, "
                         f"max rel error {self.max_rel_error:.4g}")
            if self.worst is not None:
                at, expected, actual = self.worst
                lines.append(f"  worst:     at {list(at)}: expected {_number(expected)}, got {_number(actual)}")
        lines.append("  inputs:" + ("" if self.inputs else "    none"))
        lines += [f"    {stats}" for stats in self.inputs]
        lines.append(f"  expected:  {self.expected}")
        lines.append(f"  got:       {self.actual}")
        lines.append(f"  {self.diverged} of the {self.checked} ops compared differ; this is the first")
        return "\n".join(lines)


def _number(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, (int, float, complex)) and not isinstance(value, bool) else str(value)


def verify(program_or_module: Any, inputs: Any = None, *, target: str = "onnx", example_args: Any = None,
           dynamic_shapes: Any = None, seed: int = 0, rtol: float | None = None, atol: float | None = None,
           pipeline: str | None = None, opset_version: int | None = None) -> VerifyResult:
    """Run a program (or a module, exported with `example_args`) on the reference interpreter and on `target`
    ("onnx", "c" or "triton") with every intermediate value exposed, and name the first op whose result differs.

    `inputs`: the positional arguments the model takes, a dict from user-input name to array, or None: a module's
    `example_args`, or for a program random values drawn with `seed` (floats standard normal, integers zero,
    dynamic dims at their example sizes). A torch.nn.Module is exported through `kiln.from_torch`. Tolerances
    default to torch.testing.assert_close's per dtype; NaNs compare equal. `pipeline` replaces the compile
    pipeline (C, Triton); `opset_version` is the ONNX opset.
    """
    if target not in TARGETS:
        raise KilnError(f"unknown verify target {target!r}", fix="choose one of " + ", ".join(TARGETS))
    if (rtol is None) != (atol is None):
        raise KilnError("pass both rtol and atol, or neither", fix="e.g. rtol=1e-4, atol=1e-5")
    program = program_or_module
    if not isinstance(program, ExportedProgram):
        if example_args is None:
            raise KilnError("verifying a module needs example_args to export it", fix="pass example_args=(x,)")
        program = _export(program, tuple(example_args), dynamic_shapes)
        if inputs is None:
            inputs = tuple(example_args)
    flat = user_inputs(program, inputs, seed)
    prepared = _prepare(program, target, pipeline)
    debug, watched = debug_program(prepared)
    if not debug_outputs(debug):  # no op computes a tensor: nothing to compare, nothing to build
        return VerifyResult(target, True, 0, program=prepared)
    expected = _run_reference(debug, flat)
    actual = _run_target(debug, target, flat, opset_version)
    return _compare(prepared, target, watched, expected, dict(zip(debug_outputs(debug), actual)), rtol, atol)


def _export(module: Any, example_args: tuple, dynamic_shapes: Any) -> ExportedProgram:
    """A kiln.nn.Module through kiln.export, a torch.nn.Module through kiln.from_torch."""
    from kiln.frontend import nn
    if not isinstance(module, nn.Module) and any(c.__module__.startswith("torch.") for c in type(module).__mro__):
        from kiln.frontend.bridge import from_torch
        return from_torch(module, example_args, dynamic_shapes=dynamic_shapes)
    from kiln.frontend.export import export
    return export(module, example_args, dynamic_shapes=dynamic_shapes)


# ---------------------------------------------------------------------------------------------
# The debug program


def debug_program(program: ExportedProgram) -> tuple[ExportedProgram, list[tuple[int, Any]]]:
    """A copy of `program` whose outputs are the used tensor results of its top-level ops, in order, and the
    (index, op) of each top-level op of the copy. Nothing else changes, so the ops compute what they did."""
    from kiln.passes.base import clone_program

    debug = clone_program(program)
    body = debug.body
    returned = body.last_op
    if not isinstance(returned, func.ReturnOp):
        raise KilnError("the program's forward has no return")
    watched: list[tuple[int, Any]] = []
    values = []
    for index, op in enumerate(debug.nodes()):
        watched.append((index, op))
        # A result nothing reads (layer norm's mean) may never be computed by a backend, and can mislead no one.
        values += [r for r in op.results if _comparable(r) and r.first_use is not None]
    body.insert_op_before(func.ReturnOp(*values), returned)
    body.erase_op(returned)
    debug.graph.function_type = FunctionType.from_lists([a.type for a in body.args], [v.type for v in values])
    names = value_names(body)
    debug.graph_signature.output_specs = [OutputSpec(OutputKind.USER_OUTPUT, names[v]) for v in values]
    debug.out_spec = None
    return debug, watched


def debug_outputs(debug: ExportedProgram) -> list[Any]:
    """The SSA values a debug program returns, in order."""
    return list(debug.body.last_op.operands)


def _comparable(value: Any) -> bool:
    return isinstance(value.type, TensorType) and not value.type.is_sparse


# ---------------------------------------------------------------------------------------------
# Inputs


def user_inputs(program: ExportedProgram, inputs: Any, seed: int = 0) -> list[np.ndarray]:
    """The program's flat user inputs: from positional arguments, a name -> array mapping, or drawn at random."""
    names = program.graph_signature.user_inputs
    if inputs is None:
        return random_inputs(program, seed)
    if isinstance(inputs, Mapping):
        unknown = sorted(set(inputs) - set(names))
        if unknown:
            raise InputError(f"inputs {unknown} are not inputs of the program",
                             fix=f"its inputs are {', '.join(names)}")
        missing = [n for n in names if n not in inputs]
        if missing:
            raise InputError(f"no value for input(s) {', '.join(missing)}", fix="give a value for every input")
        return [_array(inputs[n]) for n in names]
    if not isinstance(inputs, (tuple, list)):
        inputs = (inputs,)
    from kiln.codegen.onnx.program import flat_user_inputs
    return [_array(value) for value in flat_user_inputs(program, tuple(inputs), {})]


def _array(value: Any) -> np.ndarray:
    if hasattr(value, "__kiln_array__"):
        value = value.__kiln_array__()
    return np.asarray(value)


def random_inputs(program: ExportedProgram, seed: int = 0) -> list[np.ndarray]:
    """Random user inputs that fit the program: each symbol at its example size (or the smallest size above 1 in its
    range), floats standard normal, booleans fair coins, integers zero (a valid index anywhere)."""
    sizes: dict[sympy.Symbol, int] = {}
    for symbol, allowed in program.range_constraints.items():
        if isinstance(symbol, sympy.Symbol):
            hint = program.hints.get(symbol)
            sizes[symbol] = hint if hint is not None and hint in allowed else int(min(max(2, allowed.lower),
                                                                                       allowed.upper))
    rng = np.random.default_rng(seed)
    arrays = []
    for spec, arg in zip(program.graph_signature.input_specs, program.body.args):
        if spec.kind is not InputKind.USER_INPUT:
            continue
        if not isinstance(arg.type, TensorType):
            raise InputError(f"input {spec.name!r} is not a tensor, so no random value can be drawn for it",
                             fix="pass the inputs")
        shape = [d if isinstance(d, int) else evaluate_dim(d, {s: sizes.get(s, 2) for s in d.free_symbols})
                 for d in arg.type.shape]
        dtype = arg.type.dtype
        if dtype.is_floating_point or dtype.is_complex:
            arrays.append(rng.standard_normal(shape).astype(np.float32).astype(dtype.numpy))
        elif dtype == dtypes.bool_:
            arrays.append(rng.random(shape) < 0.5)
        else:
            arrays.append(np.zeros(shape, dtype.numpy))
    return arrays


# ---------------------------------------------------------------------------------------------
# The two runs


def _prepare(program: ExportedProgram, target: str, pipeline: str | None) -> ExportedProgram:
    """The program as the target's lowering sees it: after its pipeline, decompositions and legalization."""
    from kiln.passes import run as run_passes
    if target == "onnx":
        from kiln.codegen.onnx.export import prepare_program
        from kiln.passes.sparsity import sparse_weights
        if pipeline is not None:
            program = run_passes(program, pipeline)
        if sparse_weights(program):
            program = run_passes(program, "densify-weights")
        return prepare_program(program)
    from kiln.codegen.driver import DEFAULT_PIPELINE, backend
    from kiln.codegen.legalize import legalize
    return legalize(run_passes(program, pipeline or DEFAULT_PIPELINE), backend(target).TARGET)


def _run_reference(debug: ExportedProgram, flat: list[np.ndarray]) -> dict[Any, Any]:
    """Every top-level value of the debug program (arguments and op results) on the reference interpreter."""
    from kiln.ir.interpreter import run_program, watching
    top_level = set(debug.body.args) | {r for op in debug.nodes() for r in op.results}
    values: dict[Any, Any] = {}

    def record(value: Any, array: Any) -> None:
        if value in top_level:
            values[value] = array
    with watching(record):
        run_program(debug, flat)
    return values


def _run_target(debug: ExportedProgram, target: str, flat: list[np.ndarray], opset: int | None) -> list[Any]:
    if target == "onnx":
        from kiln.codegen.onnx.export import DEFAULT_OPSET, lower_to_model
        from kiln.codegen.onnx.program import ONNXProgram
        model = lower_to_model(debug, opset=opset or DEFAULT_OPSET)
        return ONNXProgram(model).run(flat)
    from kiln.codegen.driver import build_package
    from kiln.runtime import load
    with tempfile.TemporaryDirectory(prefix="kiln_verify_") as folder:
        # The pipeline already ran: dce alone leaves the debug program as it is.
        model = load(build_package(debug, target, pipeline="dce", output=folder))
        arguments: list[Any] = list(flat)
        device = _triton_device() if target == "triton" else None
        if device is not None:
            import torch
            arguments = [torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in flat]
        outputs = model(*arguments)
        outputs = list(outputs) if isinstance(outputs, tuple) else [outputs]
        if device is not None:
            from kiln.runtime.triton import _to_numpy
            import torch
            outputs = [_to_numpy(torch, o) for o in outputs]
        del model
    return outputs


def _triton_device() -> str | None:
    """A GPU when torch has one; else None: CPU tensors, which Triton runs through its interpreter."""
    try:
        import torch
    except ImportError:
        return None
    return "cuda" if torch.cuda.is_available() else None


# ---------------------------------------------------------------------------------------------
# Comparing


def _compare(program: ExportedProgram, target: str, watched: list[tuple[int, Any]], expected: dict[Any, Any],
             actual: dict[Any, Any], rtol: float | None, atol: float | None) -> VerifyResult:
    """Walk the ops in program order: the first whose result differs read only values that matched."""
    debug_names = value_names(watched[0][1].parent_block()) if watched else {}
    result: VerifyResult | None = None
    checked = diverged = 0
    for index, op in watched:
        compared = [r for r in op.results if r in actual]
        if not compared:
            continue
        checked += 1
        findings = [_difference(expected[r], actual[r], rtol, atol) for r in compared]
        bad = [(r, f) for r, f in zip(compared, findings) if f is not None]
        if not bad:
            continue
        diverged += 1
        if result is not None:
            continue
        value, finding = bad[0]
        operands = [v for v in dict.fromkeys(op.operands) if _comparable(v) and v in expected]
        source = op.attributes.get("kiln.source")
        result = VerifyResult(
            target, False, 0, op_index=index, op_name=op.name, op_text=_op_text(op, debug_names),
            source=source.data if source is not None else None,
            inputs=[TensorStats.of(debug_names.get(v, "?"), expected[v]) for v in operands],
            expected=TensorStats.of(debug_names.get(value, "?"), expected[value]),
            actual=TensorStats.of(debug_names.get(value, "?"), actual[value]), **finding)
    if result is None:
        return VerifyResult(target, True, checked, program=program)
    result.checked, result.diverged, result.program = checked, diverged, program
    return result


def _difference(expected: Any, actual: Any, rtol: float | None, atol: float | None) -> dict[str, Any] | None:
    """None when `actual` is close to `expected` (NaNs equal); else the VerifyResult fields describing how not."""
    expected, actual = np.asarray(expected), np.asarray(actual)
    kind = dtypes.dtype(expected.dtype)
    if rtol is None:
        rtol, atol = default_tolerances(kind)
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return {"problem": f"got {dtypes.dtype(actual.dtype).name}{list(actual.shape)}, expected "
                           f"{kind.name}{list(expected.shape)}", "max_abs_error": float("inf"),
                "max_rel_error": float("inf"), "rtol": rtol, "atol": atol}
    found = closeness(actual, expected, rtol, atol, equal_nan=True)
    if found.ok:
        return None
    (max_abs, at), (max_rel, _) = found.greatest(mismatches_only=True)
    return {"max_abs_error": float(max_abs), "max_rel_error": float(max_rel), "mismatched": found.mismatched,
            "worst": (at, expected[at].item(), actual[at].item()), "rtol": rtol, "atol": atol}


def _op_text(op: Any, names: dict[Any, str]) -> str:
    """`relu = aten.relu.default(addmm)`: the op as the printed program shows it (trailing defaults left out)."""
    results = ", ".join(names.get(r, "?") for r in op.results)
    if hasattr(op, "opdef"):
        from kiln.ir.dialect import bound_arguments
        arguments, values = op.opdef.schema.arguments, bound_arguments(op)
        last = len(arguments)
        while last and arguments[last - 1].has_default and _same(values[last - 1], arguments[last - 1].default):
            last -= 1
        pieces = ", ".join(format_value(v, names) for v in values[:last])
    else:  # a region op: its operands
        pieces = ", ".join(names.get(v, "?") for v in op.operands)
    return f"{results} = {op.name}({pieces})"


def _same(value: Any, default: Any) -> bool:
    if type(value) is bool or type(default) is bool:
        return type(value) is type(default) and value == default
    try:
        return bool(value == default)
    except (TypeError, ValueError):
        return False


__all__ = ["TARGETS", "TensorStats", "VerifyResult", "debug_outputs", "debug_program", "random_inputs",
           "user_inputs", "verify"]

"""Random valid kiln programs for differential fuzzing: hypothesis strategies that draw DAGs of registry ops.

A `Dag` is a recipe (symbols with ranges, inputs, and steps that each apply one registry op to earlier values) that
`build_program` replays into a GraphBuilder, several DAGs side by side in one program when a backend is costly to
build. Ops come from the registry, weighted toward what models use. An op's non-tensor arguments come from one of its
samples (tests/ir/samples); each tensor argument is an earlier value of the DAG where one fits, else a new input
shaped like the sample's. Shape ops take arguments computed from the symbolic shapes they see
(tests/fuzz/shape_ops.py), so views, reshapes and broadcasting carry symbolic dims through the DAG. A step whose
meta rule refuses its arguments, or that would narrow a symbol (record a guard), is drawn again.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import sympy
from hypothesis import strategies as st

import kiln.ir.ops  # noqa: F401  (registers the ops)
from kiln.codegen.c.target import TARGET as C_TARGET
from kiln.ir import dtypes
from kiln.ir.errors import KilnError
from kiln.ir.program import ExportedProgram, GraphBuilder
from kiln.ir.registry import REGISTRY, OpDef, call_op, emitting, run_meta, split_bound
from kiln.ir.sparse import SparseArray
from kiln.ir.symbolic import INF, ShapeEnv, active_shape_env, symbol
from kiln.ir.types import TensorType
from tests.ir.samples import SAMPLES

# ---------------------------------------------------------------------------------------------
# Recipes


@dataclass(frozen=True)
class Ref:
    """A tensor value of a DAG by name: `x3` is its fourth input, `v7` the eighth result of its steps."""

    name: str

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class SymbolSpec:
    name: str
    lower: int
    upper: int | None  # None: unbounded
    hint: int


@dataclass
class InputSpec:
    dtype: dtypes.DType
    shape: tuple[Any, ...]  # ints and sympy expressions over the DAG's symbols
    fixed: np.ndarray | None = None  # values taken from a registry sample (indices, divisors), else random


@dataclass
class Step:
    op: str
    bound: list[Any]  # the op's arguments in schema order, Refs in place of tensors
    results: list[Ref]


@dataclass
class Dag:
    symbols: list[SymbolSpec] = field(default_factory=list)
    inputs: list[InputSpec] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    outputs: list[Ref] = field(default_factory=list)

    @property
    def ops(self) -> set[str]:
        return {step.op for step in self.steps}


@dataclass
class Case:
    """A DAG and the inputs it runs on (symbol sizes, then one array per input)."""

    dag: Dag
    sizes: dict[str, int]
    inputs: list[np.ndarray]

    def __repr__(self) -> str:
        from tests.fuzz.reproduce import case_source
        return case_source(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # how hypothesis shows a falsifying example
        printer.text(repr(self))


def flat(result: Any) -> list[Any]:
    """An op's results in order, lists of tensors spread out."""
    if isinstance(result, (list, tuple)):
        return [value for item in result for value in flat(item)]
    return [result]


def _map(value: Any, leaf: Callable[[Any], Any]) -> Any:
    if isinstance(value, list):
        return [_map(v, leaf) for v in value]
    if isinstance(value, tuple):
        return tuple(_map(v, leaf) for v in value)
    return leaf(value)


def _substitute(value: Any, symbols: dict[sympy.Symbol, Any]) -> Any:
    return _map(value, lambda v: v.xreplace(symbols) if isinstance(v, sympy.Basic) else v)


def emit_dag(builder: GraphBuilder, dag: Dag, prefix: str = "") -> list[Any]:
    """Replay `dag` into `builder` with symbols of its own; return its output values."""
    env = builder.shape_env
    symbols = {}
    for spec in dag.symbols:  # the DAG's own names where they are free (DAGs side by side get fresh ones)
        name = spec.name if symbol(spec.name) not in env.symbols else None
        symbols[symbol(spec.name)] = env.create_symbol(spec.hint, name=name, min=spec.lower,
                                                       max=INF if spec.upper is None else spec.upper)
    values: dict[str, Any] = {}
    for index, spec in enumerate(dag.inputs):
        shape = _substitute(list(spec.shape), symbols)
        values[f"x{index}"] = builder.add_input(f"{prefix}x{index}", TensorType.of(shape, spec.dtype))
    with builder:
        for step in dag.steps:
            opdef = REGISTRY[step.op]
            bound = _substitute(_map(step.bound, lambda v: values[v.name] if isinstance(v, Ref) else v), symbols)
            args, kwargs = split_bound(opdef, bound)
            for ref, value in zip(step.results, flat(call_op(opdef, tuple(args), kwargs))):
                values[ref.name] = value
    return [values[ref.name] for ref in dag.outputs]


def prune(case: Case, outputs: list[Ref]) -> Case:
    """`case` computing only `outputs`: the steps, inputs and symbols they depend on, renumbered in order."""
    dag = case.dag
    needed, steps = set(outputs), []
    for step in reversed(dag.steps):
        if needed & set(step.results):
            needed |= {leaf for leaf in _leaves(step.bound) if isinstance(leaf, Ref)}
            steps.insert(0, step)
    renamed: dict[Ref, Ref] = {}
    kept = [index for index in range(len(dag.inputs)) if Ref(f"x{index}") in needed]
    for position, index in enumerate(kept):
        renamed[Ref(f"x{index}")] = Ref(f"x{position}")
    results = [ref for step in steps for ref in step.results]
    renamed.update({ref: Ref(f"v{position}") for position, ref in enumerate(results)})

    def rename(value: Any) -> Any:
        return renamed[value] if isinstance(value, Ref) else value
    inputs = [dag.inputs[index] for index in kept]
    dims = [d for spec in inputs for d in spec.shape] + [leaf for step in steps for leaf in _leaves(step.bound)]
    used = {str(s) for d in dims if isinstance(d, sympy.Basic) for s in d.free_symbols}
    pruned = Dag([s for s in dag.symbols if s.name in used], inputs,
                 [Step(step.op, _map(step.bound, rename), [rename(r) for r in step.results]) for step in steps],
                 [rename(ref) for ref in outputs])
    return Case(pruned, {k: v for k, v in case.sizes.items() if k in used}, [case.inputs[index] for index in kept])


def build_program(dags: list[Dag]) -> ExportedProgram:
    """One program computing every DAG side by side: their inputs, then their outputs, in order."""
    builder = GraphBuilder()
    outputs = []
    for index, dag in enumerate(dags):
        outputs += emit_dag(builder, dag, prefix=f"d{index}_" if len(dags) > 1 else "")
    return builder.build(outputs)


# ---------------------------------------------------------------------------------------------
# Which ops, how often, and their argument templates


# The registry's tags say which ops are out of scope: random values, sparse layouts and quantization have their own
# suites; backward ops appear only in training programs.
# Ops that convert their first operand to a dtype another argument names: from floats to integers, the generator makes
# the operand representable first (DagDrawer._representable).
CONVERSIONS = frozenset({name for name, opdef in REGISTRY.items()
                         if any(a.type.base == "ScalarType" for a in opdef.schema.arguments)}
                        | {"aten.type_as.default", "aten.to.other"})
# Ops that convert floats to integers inside (fake quantization rounds x / scale to an integer, then clamps; grid
# sampling turns coordinates into pixel indices): NaN and inf are undefined there as in a conversion (torch eager
# gives quant_min for NaN, by the C conversion's accident, and a NaN grid coordinate samples pixel 0 or NaN by
# padding mode), so their operands are made representable too, and a fake quantization's scale positive (x / 0 is
# such a NaN or inf).
INTERNAL_CONVERSIONS = frozenset(name for name in REGISTRY if "fake_quantize_" in name or "grid_sampler" in name)
# Ops whose ATen result for an infinity depends on the kernel path (torch 2.13), not on the values: float32
# gelu(+inf) is inf on the scalar path and NaN on the vectorized one (any tensor of 5 or more elements); a bfloat16
# convolution gives NaN where float32 gives inf (oneDNN's blocked layouts multiply padding zeros with it); and the
# statistics ATen computes with Welford's algorithm (var_mean, layer and group norm) give a NaN mean for a row
# holding an infinity, where the mean is +-inf (as mean() and batch norm give it). Their operands are made finite
# (DagDrawer._finite; NaN stays).
PATH_DEPENDENT_AT_INFINITY = frozenset(
    {"aten.gelu.default", "aten.var_mean.correction", "aten.native_layer_norm.default",
     "aten.native_group_norm.default"}
    | {name for name in REGISTRY if name.startswith("aten.conv") and "backward" not in name})
# Ops whose ONNX form is MaxPool without indices, which skips NaN where ATen returns it, as torch.onnx's files do
# (a documented divergence, docs/onnx.md): their operand gets no NaN (DagDrawer._nan_free).
NAN_SKIPPED_IN_ONNX = frozenset(name for name in REGISTRY if "max_pool" in name and "backward" not in name)
# Views that read the operand's storage (as_strided's sizes and strides): torch eager's intermediate values keep
# their operands' strides (relu of a transposed value is transposed in memory), kiln's functional IR reads a value as
# contiguous, so the generator gives them a program input, contiguous in both.
STORAGE_VIEWS = frozenset(name for name in REGISTRY if name.startswith("aten.as_strided"))
# No value grows past this many elements (chains of cat, repeat or expand double sizes at each step).
MAX_ELEMENTS = 4096
EXCLUDED_TAGS = frozenset({"random", "sparse", "quantize", "backward"})


def _usable_sample(sample: Any) -> bool:
    """Samples whose values every backend must reproduce (the sample table marks uninitialized memory, random values
    and tie-dependent indices with check_values=False), with dense tensors only."""
    def dense(value: Any) -> bool:
        if isinstance(value, (list, tuple)):
            return all(dense(v) for v in value)
        return not isinstance(value, SparseArray) and not (isinstance(value, str) and value.startswith("sparse"))
    return sample.check_values and dense(list(sample.args)) and dense(list(sample.kwargs.values()))


def _in_scope(opdef: OpDef) -> bool:
    schema = opdef.schema
    return (schema.namespace == "aten" and not EXCLUDED_TAGS & opdef.tags and opdef.kernel is not None
            and all(r.type.is_tensor for r in schema.returns) and not any(a.type.mutable for a in schema.arguments))


def _templates() -> dict[str, list[Any]]:
    rng = np.random.default_rng(0)
    found = {}
    for name, opdef in sorted(REGISTRY.items()):
        if _in_scope(opdef) and name in SAMPLES:
            usable = [s for s in SAMPLES[name](rng) if _usable_sample(s)]
            if usable:
                found[name] = usable
    return found


TEMPLATES: dict[str, list[Any]] = _templates()

# What exported models are mostly made of (kiln.models, Hugging Face transformers, torchvision CNNs): each is drawn
# MODEL_WEIGHT times as often as an op outside this list, view ops (the registry's `view` tag) VIEW_WEIGHT times.
MODEL_OPS = (
    "aten.add.Tensor", "aten.mul.Tensor", "aten.linear.default", "aten.relu.default", "aten.view.default",
    "aten.sub.Tensor", "aten.div.Tensor", "aten.matmul.default", "aten.transpose.int", "aten.permute.default",
    "aten.reshape.default", "aten.softmax.int", "aten.layer_norm.default", "aten.gelu.default", "aten.silu.default",
    "aten.sigmoid.default", "aten.tanh.default", "aten.unsqueeze.default", "aten.cat.default", "aten.slice.Tensor",
    "aten.mean.dim", "aten.sum.dim_IntList", "aten.expand.default", "aten.where.self", "aten.pow.Tensor_Scalar",
    "aten.rsqrt.default", "aten.exp.default", "aten.neg.default", "aten._to_copy.default", "aten.to.dtype",
    "aten.add.Scalar", "aten.mul.Scalar", "aten.scaled_dot_product_attention.default", "aten.embedding.default",
    "aten.conv2d.default", "aten.batch_norm.default", "aten.max_pool2d.default", "aten.flatten.using_ints",
    "aten.split.Tensor", "aten.chunk.default", "aten.select.int", "aten.clone.default", "aten.masked_fill.Scalar",
    "aten.log_softmax.int", "aten.bmm.default", "aten.addmm.default", "aten.mm.default", "aten.stack.default",
    "aten.squeeze.dim", "aten.amax.default", "aten.gt.Scalar", "aten.eq.Tensor", "aten.clamp.default",
    "aten.hardtanh.default", "aten.rms_norm.default", "aten.adaptive_avg_pool2d.default", "aten.cumsum.default",
)
MODEL_WEIGHT, VIEW_WEIGHT = 6, 3


def ops_in_scope() -> list[str]:
    """The ops the generator draws: those with argument templates, and the shape ops it builds by hand."""
    from tests.fuzz.shape_ops import HANDLERS
    return sorted(set(TEMPLATES) | {n for n in HANDLERS if _in_scope(REGISTRY[n])})


def _weighted_ops() -> list[str]:
    names = ops_in_scope()

    def weight(name: str) -> int:
        return MODEL_WEIGHT if name in MODEL_OPS else VIEW_WEIGHT if "view" in REGISTRY[name].tags else 1
    # heaviest first: hypothesis shrinks toward the front of the list
    return [name for name in sorted(names, key=lambda n: (-weight(n), MODEL_OPS.index(n) if n in MODEL_OPS else 0, n))
            for _ in range(weight(name))]


# ---------------------------------------------------------------------------------------------
# Drawing a DAG: a probe emitter runs meta rules on types, so each step is checked as it is drawn


class _Typed:
    """A value while drawing: only its type."""

    __slots__ = ("type",)

    def __init__(self, type_: Any):
        self.type = type_


def _arrange(meta: Any) -> Any:
    if isinstance(meta, (list, tuple)):
        return type(meta)(_arrange(m) for m in meta)
    return _Typed(meta)


class _Probe:
    """An emitter that runs the op's meta rule on the argument types and records nothing."""

    def accepts(self, value: Any) -> bool:
        return value is None or isinstance(value, _Typed)

    def emit(self, opdef: OpDef, bound: list[Any]) -> Any:
        return _arrange(run_meta(opdef, _map(bound, lambda v: v.type if isinstance(v, _Typed) else v)))


# Meta rules that raised something other than a KilnError while drawing: {op: first message}.
META_CRASHES: dict[str, str] = {}


class DagDrawer:
    """A DAG being drawn: its recipe, the types of its values, and the ShapeEnv its meta rules run in."""

    def __init__(self, draw: Callable[[Any], Any], allowed: frozenset[dtypes.DType] = frozenset(dtypes.ALL_DTYPES)):
        self.draw = draw
        self.allowed = allowed - {dtypes.complex64, dtypes.complex128}  # complex is outside the fuzzed dtypes
        self.dag = Dag()
        self.env = ShapeEnv()
        self.types: dict[str, TensorType] = {}
        self.order: list[Ref] = []  # committed values, in creation order
        self.pending: list[InputSpec] = []  # inputs created for the step being drawn
        self.consumed: set[Ref] = set()
        self.results = 0

    # -- values
    def add_symbol(self, lower: int, upper: int | None) -> sympy.Symbol:
        hint = max(lower, 2) if upper is None else min(max(lower, 2), upper)
        sym = self.env.create_symbol(hint, min=lower, max=INF if upper is None else upper)
        self.dag.symbols.append(SymbolSpec(str(sym), lower, upper, hint))
        return sym

    @property
    def symbols(self) -> list[sympy.Symbol]:
        return [symbol(s.name) for s in self.dag.symbols]

    def bound_symbols(self) -> list[sympy.Symbol]:
        free = {s for spec in self.dag.inputs for d in spec.shape if isinstance(d, sympy.Basic) for s in d.free_symbols}
        return [s for s in self.symbols if s in free]

    def new_input(self, dtype: dtypes.DType, shape: Any, fixed: np.ndarray | None = None) -> Ref:
        """An input for the step being drawn (kept if the step is)."""
        ref = Ref(f"x{len(self.dag.inputs) + len(self.pending)}")
        self.pending.append(InputSpec(dtype, tuple(shape), fixed))
        self.types[ref.name] = TensorType.of(list(shape), dtype)
        return ref

    def add_root(self, dtype: dtypes.DType, shape: Any) -> Ref:
        ref = self.new_input(dtype, shape)
        self._commit_inputs()
        return ref

    def largest(self, type_: TensorType) -> int:
        """The most elements a value of this type has at the sizes inputs are drawn at (unbacked sizes taken as 8)."""
        largest = {symbol(s.name): sympy.Integer(largest_size(s)) for s in self.dag.symbols}
        count = 1
        for dim in type_.shape:
            value = sympy.sympify(dim).xreplace(largest)
            count *= int(value.xreplace({s: sympy.Integer(8) for s in value.free_symbols}))
        return count

    def type(self, ref: Ref) -> TensorType:
        return self.types[ref.name]

    def pool(self, predicate: Callable[[TensorType], bool] = lambda t: True) -> list[Ref]:
        """The values whose type satisfies `predicate`, newest first (hypothesis shrinks toward chains)."""
        return [ref for ref in reversed(self.order) if predicate(self.types[ref.name])]

    def pick(self, predicate: Callable[[TensorType], bool] = lambda t: True) -> Ref | None:
        return self.choose(self.pool(predicate))

    def choose(self, candidates: list[Ref], fresh: bool = False) -> Ref | None:
        """Mostly the newest candidate (DAGs chain, as models do), else any; with `fresh`, None (a new input)
        a tenth of the time, and always when there is no candidate."""
        if not candidates:
            return None
        kind = self.draw(st.integers(0, 9))
        if kind >= 9 - fresh:
            return None if fresh else candidates[-1]
        return candidates[0] if kind < 6 else candidates[self.draw(st.integers(0, len(candidates) - 1))]

    def _commit_inputs(self) -> None:
        for spec in self.pending:
            ref = Ref(f"x{len(self.dag.inputs)}")
            self.dag.inputs.append(spec)
            self.order.append(ref)
        self.pending = []

    def discard(self) -> None:
        for index in range(len(self.pending)):
            self.types.pop(f"x{len(self.dag.inputs) + index}", None)
        self.pending = []

    # -- steps
    def try_step(self, name: str, args: Any, kwargs: dict[str, Any]) -> bool:
        """Apply op `name` if its meta rule accepts the arguments without narrowing a symbol; False otherwise."""
        opdef = REGISTRY[name]
        env = self.env
        guards, facts = len(env.guards), len(env.facts)
        saved = {sym: dataclasses.replace(info) for sym, info in env.symbols.items()}
        try:
            bound = opdef.schema.bind(tuple(args), dict(kwargs))
            result = self._meta(opdef, bound)
            accepted = len(env.guards) == guards
        except KilnError:
            accepted = False
        except Exception as error:  # noqa: BLE001  (a meta rule should raise KilnError; reported, not fatal)
            META_CRASHES.setdefault(name, f"{type(error).__name__}: {error}".splitlines()[0][:200])
            accepted = False
        accepted = accepted and all(isinstance(r.type, TensorType) and r.type.dtype in self.allowed
                                    and self.largest(r.type) <= MAX_ELEMENTS for r in result)
        backed = set(self.symbols)  # an input's shape cannot hold a data-dependent size (nonzero's u0)
        accepted = accepted and all(spec.dtype in self.allowed and all(
            sympy.sympify(d).free_symbols <= backed for d in spec.shape) for spec in self.pending)
        if not accepted:
            del env.guards[guards:]
            del env.facts[facts:]
            env.symbols = saved
            env.meta_cache.clear()
            self.discard()
            return False
        self._commit_inputs()
        first = next((i for i, a in enumerate(opdef.schema.arguments) if a.type.is_tensor and not a.type.is_list
                      and isinstance(bound[i], Ref)), None)
        if name in INTERNAL_CONVERSIONS or name in PATH_DEPENDENT_AT_INFINITY:  # every floating operand
            for index, argument in enumerate(opdef.schema.arguments):
                if argument.type.is_tensor and not argument.type.is_list and isinstance(bound[index], Ref) and \
                        self.type(bound[index]).dtype.is_floating_point:
                    bound[index] = (self._representable(bound[index], dtypes.int32) if name in INTERNAL_CONVERSIONS
                                    else self._finite(bound[index]))
                    if name in INTERNAL_CONVERSIONS and argument.name == "scale":  # a 0 scale divides 0 by 0
                        bound[index] = self._apply("aten.clamp.default", self._apply("aten.abs.default",
                                                                                     bound[index]), 1e-3)
        elif name in NAN_SKIPPED_IN_ONNX and first is not None and self.type(bound[first]).dtype.is_floating_point:
            bound[first] = self._nan_free(bound[first])
        elif name in CONVERSIONS and first is not None and self.type(bound[first]).dtype.is_floating_point:
            integral = [r.type.dtype for r in result if r.type.dtype.is_integral]
            if integral:
                bound[first] = self._representable(bound[first], integral[0])
        self._record(opdef, bound, result)
        return True

    def _meta(self, opdef: OpDef, bound: list[Any]) -> list[_Typed]:
        typed = _map(bound, lambda v: _Typed(self.types[v.name]) if isinstance(v, Ref) else v)
        positional, keywords = split_bound(opdef, typed)
        with emitting(_Probe()), active_shape_env(self.env):
            return flat(call_op(opdef, tuple(positional), keywords))

    def _record(self, opdef: OpDef, bound: list[Any], result: list[_Typed]) -> list[Ref]:
        refs = []
        for value in result:
            ref = Ref(f"v{self.results}")
            self.results += 1
            self.types[ref.name] = value.type
            self.order.append(ref)
            refs.append(ref)
        self.consumed |= {v for v in _leaves(bound) if isinstance(v, Ref)}
        self.dag.steps.append(Step(opdef.name, bound, refs))
        return refs

    def _representable(self, ref: Ref, target: dtypes.DType) -> Ref:
        """`ref` with NaN as 0 and clamped into `target`'s range: converting NaN, inf or an out-of-range float to an
        integer is undefined in C (and differs between backends), so a conversion step gets these first, as Csmith
        wraps undefined arithmetic in safe macros."""
        low = 0.0 if not target.is_signed else -100.0
        mask = self._apply("aten.isnan.default", ref)
        zeroed = self._apply("aten.where.ScalarSelf", mask, 0.0, ref)
        return self._apply("aten.clamp.default", zeroed, low, 100.0)

    def _finite(self, ref: Ref) -> Ref:
        """`ref` clamped into [-100, 100] (NaN stays NaN, as clamp keeps it)."""
        return self._apply("aten.clamp.default", ref, -100.0, 100.0)

    def _nan_free(self, ref: Ref) -> Ref:
        """`ref` with NaN as 0 (infinities stay)."""
        return self._apply("aten.where.ScalarSelf", self._apply("aten.isnan.default", ref), 0.0, ref)

    def _apply(self, name: str, *args: Any) -> Ref:
        opdef = REGISTRY[name]
        bound = opdef.schema.bind(args, {})
        return self._record(opdef, bound, self._meta(opdef, bound))[0]

    def finish(self) -> Dag:
        """Every result nothing reads is an output."""
        if not self.dag.steps:
            self.try_step("aten.clone.default", (self.order[0],), {})
        produced = [ref for step in self.dag.steps for ref in step.results]
        self.dag.outputs = [ref for ref in produced if ref not in self.consumed] or produced[-1:]
        return self.dag


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


# How a template's tensor argument may be replaced by an earlier value: same dtype and rank (most often), same dtype,
# same rank, or any value (the meta rule decides; promotion and broadcasting follow).
# The first tensor argument (`self`, usually) takes any value more often: most ops accept any rank there.
EXACT, SAME_DTYPE, SAME_RANK, ANY = range(4)
MATCH_MODES = (EXACT,) * 8 + (SAME_DTYPE,) * 6 + (SAME_RANK,) * 3 + (ANY,) * 3
FIRST_MATCH_MODES = (SAME_DTYPE,) * 2 + (ANY,) * 2 + (EXACT,)
# Replacements for a float Scalar argument (None keeps the sample's)
SPECIAL_SCALARS = (None,) * 6 + (float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 1e-3, -2.5, 1e4)
# Ops whose alpha and beta scale inside BLAS (ATen's addmm family): BLAS may fold alpha into a packed operand, so an
# infinite alpha gives inf - inf = NaN in torch eager where alpha * (A @ B) is an infinity (kernel-path dependent, as
# PATH_DEPENDENT_AT_INFINITY): they draw finite replacements.
BLAS_SCALED = frozenset(name for name in REGISTRY
                        if name.split(".")[1] in ("addmm", "addmv", "addbmm", "baddbmm", "addr"))
FINITE_SPECIAL_SCALARS = tuple(s for s in SPECIAL_SCALARS if s is None or math.isfinite(s))


def _matches(mode: int, found: TensorType, dtype: dtypes.DType, rank: int) -> bool:
    if mode in (EXACT, SAME_DTYPE) and found.dtype is not dtype:
        return False
    return mode not in (EXACT, SAME_RANK) or len(found.shape) == rank


def _follow(shape: tuple[int, ...], sample_anchor: tuple[int, ...], anchor: TensorType | None) -> list[Any]:
    """A new operand's shape: where the sample's operand matched the first operand's size (aligned from the right,
    as broadcasting aligns), the size of the value that replaced the first operand; elsewhere the sample's."""
    result = list(shape)
    if anchor is None:
        return result
    for k in range(1, min(len(shape), len(sample_anchor), len(anchor.shape)) + 1):
        if shape[-k] == sample_anchor[-k] != 1:
            result[-k] = anchor.shape[-k]
    return result


def template_call(draw: Callable[[Any], Any], drawer: DagDrawer, name: str,
                  own: bool = False) -> tuple[list[Any], dict[str, Any]]:
    """The arguments of one of the op's samples, tensors replaced by earlier values or new inputs; with `own`, every
    tensor a new input of the sample's shape (an integer one with the sample's values)."""
    opdef = REGISTRY[name]
    templates = TEMPLATES[name]
    sample = templates[draw(st.integers(0, len(templates) - 1))]
    bound = opdef.schema.bind(copy.deepcopy(sample.args), copy.deepcopy(sample.kwargs))
    modes = [draw(st.sampled_from(FIRST_MATCH_MODES)), draw(st.sampled_from(MATCH_MODES))]
    anchor: list[Any] = []  # the first tensor: its shape in the sample, and the type of the value replacing it

    def replace(array: np.ndarray) -> Ref:
        dtype = dtypes.dtype(array.dtype)
        if own:
            return drawer.new_input(dtype, array.shape, array if dtype.is_integral else None)
        candidates = drawer.pool(lambda t: _matches(modes[1 if anchor else 0], t, dtype, array.ndim))
        if name in STORAGE_VIEWS and not anchor:  # a program input: torch has it contiguous, as kiln reads it
            candidates = [ref for ref in candidates if ref.name.startswith("x")]
        chosen = drawer.choose(candidates or ([] if anchor else drawer.pool()), fresh=True)
        if not anchor:
            anchor.extend([array.shape, drawer.type(chosen) if chosen else None])
            return chosen or drawer.new_input(dtype, array.shape)
        if chosen:
            return chosen
        if dtype.is_integral:  # integer operands after the first are indices, divisors or sizes: the sample's values
            return drawer.new_input(dtype, array.shape, array)
        return drawer.new_input(dtype, _follow(array.shape, *anchor))

    for position, (argument, value) in enumerate(zip(opdef.schema.arguments, bound)):
        if argument.type.is_tensor and value is not None:
            bound[position] = ([None if v is None else replace(np.asarray(v)) for v in value]
                               if argument.type.is_list else replace(np.asarray(value)))
        elif argument.type.base == "Scalar" and type(value) is float:
            special = draw(st.sampled_from(FINITE_SPECIAL_SCALARS if name in BLAS_SCALED else SPECIAL_SCALARS))
            if special is not None:
                bound[position] = special
    return split_bound(opdef, bound)


def draw_step(draw: Callable[[Any], Any], drawer: DagDrawer, name: str) -> bool:
    from tests.fuzz.shape_ops import HANDLERS
    handler = HANDLERS.get(name)
    templated = handler is None or (name in TEMPLATES and draw(st.booleans()))
    call = template_call(draw, drawer, name) if templated else handler(draw, drawer, name)
    if call is None:
        drawer.discard()
        return False
    accepted = drawer.try_step(name, *call)
    if accepted or not templated:
        return accepted
    # The values drawn do not fit the op (operands that must agree in several dims: addmv, lstm_cell, a transposed
    # convolution's weight): once more on a sample's own shapes, so such ops run at all.
    return drawer.try_step(name, *template_call(draw, drawer, name, own=True))


# Root inputs: mostly float32 (models), then the other dtypes every backend must handle.
ROOT_DTYPES = ((dtypes.float32,) * 8 + (dtypes.int64, dtypes.float16, dtypes.bfloat16, dtypes.bool_, dtypes.int32)
               + (dtypes.float32, dtypes.int64, dtypes.float16, dtypes.bfloat16) + (dtypes.float64, dtypes.int8,
                                                                                      dtypes.uint8))
STATIC_SIZES = (2, 3, 1, 4, 5, 0)
C_DTYPES = C_TARGET.dtypes


def draw_dim(draw: Callable[[Any], Any], drawer: DagDrawer, statics: tuple[int, ...] = STATIC_SIZES,
             bound_only: bool = False) -> Any:
    """A static size (often) or one of the DAG's symbols; `bound_only`: only symbols an input's shape binds (a size
    argument must not name a symbol the program's inputs do not give a value)."""
    symbols = drawer.bound_symbols() if bound_only else drawer.symbols
    choice = draw(st.integers(0, len(statics) + 2 * len(symbols) - 1))
    return statics[choice] if choice < len(statics) else symbols[(choice - len(statics)) // 2]


_WEIGHTED: list[str] = []


@st.composite
def dags(draw: Callable[[Any], Any], max_steps: int = 40) -> Dag:
    """A DAG of 1 to `max_steps` registry ops over 1 to 3 root inputs with static and symbolic dims."""
    if not _WEIGHTED:
        _WEIGHTED.extend(_weighted_ops())
    # Most DAGs keep to the dtypes every backend compiles (the C target's), so that C checks them too.
    drawer = DagDrawer(draw, C_DTYPES if draw(st.sampled_from((True, True, False))) else frozenset(dtypes.ALL_DTYPES))
    for _ in range(draw(st.integers(0, 3))):
        drawer.add_symbol(draw(st.sampled_from((2, 1, 0))), draw(st.sampled_from((None, 16, 8, 64))))
    roots = [dtype for dtype in ROOT_DTYPES if dtype in drawer.allowed]
    for _ in range(draw(st.integers(1, 3))):
        rank = draw(st.sampled_from((2, 1, 3, 0, 4)))
        drawer.add_root(draw(st.sampled_from(roots)), [draw_dim(draw, drawer) for _ in range(rank)])
    for _ in range(draw(st.integers(1, max_steps))):
        for _attempt in range(4):
            if draw_step(draw, drawer, draw(st.sampled_from(_WEIGHTED))):
                break
    return drawer.finish()


@contextlib.contextmanager
def fixed_constant_pool() -> Iterator[None]:
    """Draws that depend on the seed alone. Hypothesis (since 6.131) draws some integers from the literals in the
    project's loaded modules (kiln's; not tests'), a pool that grows as modules are imported: the same seed drew other
    programs once another test had imported kiln.codegen.onnx. Inside this, the pool is hypothesis's global constants
    only. (A private hook: if hypothesis renames it, this fails loudly rather than drawing unpinned.)"""
    from hypothesis.internal.conjecture import providers
    empty = providers.Constants(integers=type(providers.GLOBAL_CONSTANTS.integers)(),
                                floats=type(providers.GLOBAL_CONSTANTS.floats)(key=providers.float_to_int),
                                bytes=type(providers.GLOBAL_CONSTANTS.bytes)(),
                                strings=type(providers.GLOBAL_CONSTANTS.strings)())
    saved = providers._get_local_constants
    providers._get_local_constants = lambda: empty
    providers.CONSTANTS_CACHE.cache.clear()  # permitted constants computed from the pool so far
    try:
        yield
    finally:
        providers._get_local_constants = saved
        providers.CONSTANTS_CACHE.cache.clear()


# ---------------------------------------------------------------------------------------------
# Inputs: sizes in the symbols' ranges (size-1 and empty dims where the range allows them) and values with NaN, inf
# and signed zeros


def largest_size(spec: SymbolSpec) -> int:
    """The largest size a symbol is drawn at (sizes stay small: a program runs on every backend)."""
    return spec.lower + 4 if spec.upper is None else min(spec.upper, spec.lower + 4)


SPECIAL_VALUES = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -1.0, 0.5, 1e-3], np.float64)


def random_values(rng: np.random.Generator, dtype: dtypes.DType, shape: tuple[int, ...],
                  special_rate: float) -> np.ndarray:
    if dtype.is_bool:
        return np.asarray(rng.random(shape) < 0.5)
    if dtype.is_integral:
        low, high = (0, 10) if not dtype.is_signed else (-8, 9)
        return rng.integers(low, high, shape).astype(dtype.numpy)
    values = rng.standard_normal(shape) * 2
    if special_rate:
        values = np.where(rng.random(shape) < special_rate, rng.choice(SPECIAL_VALUES, shape), values)
    return np.asarray(values.astype(np.float32).astype(dtype.numpy))


def concrete_shape(spec: InputSpec, sizes: dict[str, int]) -> tuple[int, ...]:
    bindings = {symbol(name): size for name, size in sizes.items()}
    return tuple(int(sympy.sympify(d).xreplace(bindings)) for d in spec.shape)


@st.composite
def cases(draw: Callable[[Any], Any], max_steps: int = 40) -> Case:
    """A DAG with inputs: each symbol at a size in its range, random values with a drawn share of special values."""
    dag = draw(dags(max_steps))
    sizes = {spec.name: draw(st.integers(spec.lower, largest_size(spec))) for spec in dag.symbols}
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    special_rate = draw(st.sampled_from((0.0, 0.1, 0.3)))
    inputs = [spec.fixed.copy() if spec.fixed is not None else
              random_values(rng, spec.dtype, concrete_shape(spec, sizes), special_rate) for spec in dag.inputs]
    return Case(dag, sizes, inputs)


@st.composite
def batches(draw: Callable[[Any], Any], max_cases: int = 30, max_steps: int = 40) -> list[Case]:
    """1 to `max_cases` cases, which the differential runner builds side by side into one program per backend."""
    return [draw(cases(max_steps)) for _ in range(draw(st.integers(1, max_cases)))]


def op_counts(dags_: list[Dag]) -> collections.Counter:
    return collections.Counter(step.op for dag in dags_ for step in dag.steps)

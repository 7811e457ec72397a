"""The op registry: each ATen op defined once (schema, meta rule, reference kernel, decomposition).

`defop` registers an op; `kiln.ops.aten.<name>.<overload>` returns its handle. Calling a handle binds
the arguments against the schema, then either runs the reference kernel on numpy arrays (eager) or,
when an emitter is active and the tensors are IR values, records the op in a graph. Eager mode, the
tracer, the verifier, the interpreter and the decomposition pass all read the same OpDef.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

import numpy as np

from kiln.ir import dtypes
from kiln.ir.errors import KilnError, OpArgumentError, UnknownOpError, VerificationError
from kiln.ir.schema import FunctionSchema, parse_schema
from kiln.ir.sparse import Layout, SparseArray, layout_of
from kiln.ir.types import ScalarType, SymIntType, TensorType

MetaRule = Callable[..., Any]
Kernel = Callable[..., Any]


@dataclass
class OpDef:
    """Everything kiln knows about one op overload."""

    schema: FunctionSchema
    meta: MetaRule
    kernel: Kernel | None = None
    decomposition: Callable[..., Any] | None = None
    tags: frozenset[str] = frozenset()
    doc: str = ""
    op_class: type | None = field(default=None, repr=False)  # the generated xDSL operation
    # The vector-Jacobian product: `vjp(grad, out, *args, **kwargs)` -> one gradient per tensor argument (see
    # register_vjp). Written with `kiln.ops` handles, so it runs eagerly on arrays and records ops when traced.
    vjp: Callable[..., Any] | None = field(default=None, repr=False)
    # Results torch gives no gradient (by index) and arguments it refuses to differentiate (by name).
    nondifferentiable_outputs: frozenset[int] = frozenset()
    nondifferentiable_arguments: frozenset[str] = frozenset()
    # How the op treats sparse-layout operands (kiln/ir/ops/sparse.py); None refuses them, as torch's
    # dispatcher does for an op with no sparse kernel. Ops tagged `sparse` handle them in their own rules.
    sparse: Any = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.schema.qualified_name

    @property
    def is_core(self) -> bool:
        return "core" in self.tags

    @property
    def is_complex_prim(self) -> bool:
        return "complex_prim" in self.tags

    def __repr__(self) -> str:
        return f"OpDef({self.name})"


REGISTRY: dict[str, OpDef] = {}


def defop(schema: str, meta: MetaRule, kernel: Kernel | None = None, *, tags: tuple[str, ...] = (),
          doc: str = "") -> OpDef:
    """Register an op from its schema string. Tags: core, composite, view, random, backward, quantize,
    nondifferentiable (torch gives its floating outputs no gradient), complex_prim (builds, takes apart or
    transforms complex values, which Core ATen cannot express: it has no complex scalars and no op between a
    complex tensor and its parts; backends without complex types run these through `lower-complex`)."""
    parsed = parse_schema(schema)
    if parsed.qualified_name in REGISTRY:
        raise KilnError(f"op {parsed.qualified_name} is registered twice")
    tag_set = set(tags)
    if parsed.qualified_name in _core_names():
        tag_set.add("core")
    opdef = OpDef(parsed, meta, kernel, None, frozenset(tag_set), doc)
    REGISTRY[parsed.qualified_name] = opdef
    return opdef


def register_decomposition(op: "OpOverload | str") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: `fn` rewrites `op` in terms of other ops, calling them through `kiln.ops.aten`."""
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        opdef = lookup(op if isinstance(op, str) else op.name)
        opdef.decomposition = fn
        return fn
    return register


def register_vjp(*names: "OpOverload | str") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: `fn` is the vector-Jacobian product of each named op (torch's derivatives.yaml entry).

    `fn(grad, out, *args, **kwargs)` gets the gradient of the op's result (a tuple of gradients, None where
    none flows, for ops with several results), the op's result(s), and the op's own arguments as the schema
    binds them. It returns the gradient of each tensor argument in schema order (None where there is none; a
    list for a Tensor[] argument), or the gradient alone when the op has one tensor argument. It calls ops
    through `kiln.ops` handles and `kiln.ir.meta` helpers only, so it runs on arrays and records when traced.
    """
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        for name in names:
            opdef = lookup(name if isinstance(name, str) else name.name)
            if opdef.vjp is not None:
                raise KilnError(f"{opdef.name} has two VJP rules")
            opdef.vjp = fn
        return fn
    return register


def mark_nondifferentiable(*names: str, outputs: tuple[int, ...] = (), arguments: tuple[str, ...] = ()) -> None:
    """torch gives these ops' floating outputs no gradient (`grad_fn` is None), so kiln's autodiff does neither.
    With `outputs` (result indices) or `arguments` (names), only those: torch's output_differentiability, and the
    arguments it refuses to differentiate (batch norm's running statistics)."""
    for name in names:
        opdef = lookup(name)
        if not outputs and not arguments:
            opdef.tags = opdef.tags | {"nondifferentiable"}
        opdef.nondifferentiable_outputs = opdef.nondifferentiable_outputs | frozenset(outputs)
        opdef.nondifferentiable_arguments = opdef.nondifferentiable_arguments | frozenset(arguments)


def _core_names() -> frozenset[str]:
    from kiln.ir.core_ops import CORE_ATEN_OPS
    return CORE_ATEN_OPS


def lookup(name: str) -> OpDef:
    """Find an op by its full name (`aten.add.Tensor`, `aten::add.Tensor`, `mylib.sinc.default`) or, in the aten
    namespace, without it (`add.Tensor`); the overload `default` is implied (`aten.relu`, `relu`, `mylib.sinc`)."""
    key = name.replace("::", ".")
    parts = key.split(".")
    if len(parts) < 3 and not (len(parts) == 2 and any(k.startswith(f"{parts[0]}.") for k in REGISTRY)):
        parts.insert(0, "aten")
    if len(parts) == 2:
        parts.append("default")
    key = ".".join(parts)
    found = REGISTRY.get(key)
    if found is None:
        import difflib
        close = difflib.get_close_matches(key, REGISTRY.keys(), n=3)
        raise UnknownOpError(f"unknown op {name!r}",
                             fix=("did you mean " + ", ".join(close) + "?") if close else
                             "run `kiln ops` to list the registered ops")
    return found


# ---------------------------------------------------------------------------------------------
# Emitters: where a call goes when its tensors are not numpy arrays.

class Emitter(Protocol):
    def accepts(self, value: Any) -> bool: ...

    def emit(self, opdef: OpDef, bound: list[Any]) -> Any: ...


_EMITTERS: contextvars.ContextVar[tuple[Emitter, ...]] = contextvars.ContextVar("kiln_emitters", default=())


@contextlib.contextmanager
def emitting(emitter: Emitter) -> Iterator[Emitter]:
    token = _EMITTERS.set(_EMITTERS.get() + (emitter,))
    try:
        yield emitter
    finally:
        _EMITTERS.reset(token)


def _tensor_values(opdef: OpDef, bound: list[Any]) -> Iterator[Any]:
    for argument, value in zip(opdef.schema.arguments, bound):
        if argument.type.is_tensor and value is not None:
            if argument.type.is_list:
                yield from (v for v in value if v is not None)
            else:
                yield value


def split_bound(opdef: OpDef, bound: list[Any]) -> tuple[list[Any], dict[str, Any]]:
    """Bound arguments as a call: positional ones, and keyword-only ones by name."""
    positional = [v for a, v in zip(opdef.schema.arguments, bound) if not a.kwarg_only]
    keywords = {a.name: v for a, v in zip(opdef.schema.arguments, bound) if a.kwarg_only}
    return positional, keywords


def call_op(opdef: OpDef, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    bound = opdef.schema.bind(args, kwargs)
    emitters = _EMITTERS.get()
    if emitters:
        tensors = list(_tensor_values(opdef, bound))
        for emitter in reversed(emitters):
            if tensors and any(emitter.accepts(t) for t in tensors) or not tensors and emitter.accepts(None):
                return emitter.emit(opdef, bound)
    return run_eager(opdef, bound)


# ---------------------------------------------------------------------------------------------
# Eager execution on numpy

def _as_array(opdef: OpDef, name: str, value: Any) -> Any:
    if isinstance(value, np.ndarray):
        array = value
    elif isinstance(value, SparseArray):
        refuse_sparse(opdef, value.layout)
        return value
    elif isinstance(value, np.generic):
        array = np.asarray(value)
    elif hasattr(value, "__kiln_array__"):
        array = value.__kiln_array__()
    else:
        raise OpArgumentError(f"{opdef.name}: argument '{name}' must be a tensor (numpy array), "
                              f"got {type(value).__name__}",
                              fix="wrap Python numbers and lists with numpy.asarray(...)")
    dtypes.dtype(array.dtype)  # refuses dtypes kiln does not support
    return array


def arrays_for(opdef: OpDef, bound: list[Any]) -> list[Any]:
    """Bound arguments with every tensor argument as a numpy array."""
    result = []
    for argument, value in zip(opdef.schema.arguments, bound):
        if argument.type.is_tensor and value is not None:
            if argument.type.is_list:
                value = [None if v is None else _as_array(opdef, argument.name, v) for v in value]
            else:
                value = _as_array(opdef, argument.name, value)
        result.append(value)
    return result


_SCALAR_TYPES = (bool, int, float)


def _freeze(values: list[Any]) -> tuple[Any, ...]:
    """A hashable memo key; Python scalars carry their type, since 1 == 1.0 == True promote differently.
    (A plain loop: this runs once per recorded op, so it is kept cheap.)"""
    key = []
    for value in values:
        kind = type(value)
        if kind is list:
            key.append(_freeze(value))
        elif kind in _SCALAR_TYPES:
            key.append((kind, value))
        else:
            key.append(value)
    return tuple(key)


_GLOBAL_META_CACHE: dict[Any, Any] = {}


def run_meta(opdef: OpDef, arguments: list[Any]) -> Any:
    """The op's meta rule on typed arguments, memoized per ShapeEnv (programs repeat the same shapes).

    A call that created symbols (an unbacked size) is not memoized: each such op needs its own symbol.
    """
    from kiln.ir.meta import op_context
    from kiln.ir.symbolic import current_shape_env

    env = current_shape_env()
    cache = _GLOBAL_META_CACHE if env is None else env.meta_cache
    try:
        key = (opdef.name, _freeze(arguments))
        hit = cache.get(key)
    except TypeError:  # an unhashable argument (a numpy array): no memo
        key, hit = None, None
    if hit is not None:
        return hit
    symbols_before = len(env.symbols) if env is not None else 0
    with op_context(opdef.name):
        sparse = sparse_layouts(arguments)
        if sparse:
            refuse_sparse(opdef, sparse[0])
        result = opdef.sparse.meta(opdef, arguments) if sparse and opdef.sparse is not None else \
            opdef.meta(*arguments)
    if key is not None and (env is None or len(env.symbols) == symbols_before) and "random" not in opdef.tags:
        cache[key] = result
    return result


def run_eager(opdef: OpDef, bound: list[Any]) -> Any:
    if opdef.kernel is None:
        raise KilnError(f"{opdef.name} has a meta rule but no reference kernel, so it cannot run eagerly",
                        fix="decompose it first (ExportedProgram.run_decompositions) or avoid it")
    from kiln.ir.meta import op_context
    arguments = arrays_for(opdef, bound)
    with op_context(opdef.name):
        if opdef.sparse is not None and sparse_layouts(arguments):
            return opdef.sparse.run(opdef, arguments)
        expected = opdef.meta(*arguments)
    return conform(opdef, opdef.kernel(*arguments), expected)


def run_kernel(opdef: OpDef, arguments: list[Any]) -> Any:
    """The reference kernel on decoded arguments; sparse operands go to the op's sparse rule."""
    if opdef.sparse is not None and sparse_layouts(arguments):
        return opdef.sparse.run(opdef, arguments)
    return opdef.kernel(*arguments)


def sparse_layouts(arguments: list[Any]) -> list[Layout]:
    """The sparse layouts among tensor arguments (arrays or types), in order."""
    found = []
    for value in arguments:
        if isinstance(value, list):
            found += sparse_layouts(value)
        elif (layout := layout_of(value)).is_sparse:
            found.append(layout)
    return found


def refuse_sparse(opdef: OpDef, layout: Layout) -> None:
    """torch's 'Could not run ... with arguments from the SparseCPU backend', as a KilnError."""
    if opdef.sparse is None and "sparse" not in opdef.tags:
        from kiln.ir.errors import UnsupportedError
        raise UnsupportedError(f"{opdef.name} does not support {layout.kind} tensors",
                               fix="convert the operand with .to_dense() first; docs/sparsity.md lists the ops "
                                   "that take sparse operands")


def conform(opdef: OpDef, result: Any, expected: Any) -> Any:
    """Cast kernel results to the dtypes the meta rule promises, and check their shapes agree."""
    if isinstance(expected, TensorType):
        if isinstance(result, SparseArray) or expected.is_sparse:
            return _conform_sparse(opdef, result, expected)
        array = np.asarray(result)
        if array.dtype != expected.dtype.numpy:
            with np.errstate(over="ignore", invalid="ignore"):  # rounding to inf in float16 is the result
                array = array.astype(expected.dtype.numpy)
        concrete = tuple(int(d) for d in expected.shape) if expected.is_static else None
        if concrete is not None and array.shape != concrete:
            raise VerificationError(
                f"{opdef.name}: reference kernel produced shape {list(array.shape)} "
                f"but the meta rule says {list(concrete)}")
        return array
    if isinstance(expected, (SymIntType, ScalarType)):
        return result.item() if isinstance(result, np.generic) else result
    if isinstance(expected, (tuple, list)):
        if len(result) != len(expected):
            raise VerificationError(f"{opdef.name}: kernel returned {len(result)} results, meta {len(expected)}")
        conformed = [conform(opdef, r, e) for r, e in zip(result, expected)]
        return list(conformed) if isinstance(expected, list) else tuple(conformed)
    return result


def _conform_sparse(opdef: OpDef, result: Any, expected: TensorType) -> Any:
    produced = result.layout if isinstance(result, SparseArray) else Layout()
    if produced.kind != expected.layout.kind or result.dtype != expected.dtype.numpy:
        raise VerificationError(f"{opdef.name}: reference kernel produced a {dtypes.dtype(result.dtype).name} "
                                f"{produced.kind} tensor but the meta rule says {expected.dtype.name} "
                                f"{expected.layout.kind}")
    return result


# ---------------------------------------------------------------------------------------------
# Handles: kiln.ops.aten.add.Tensor


class OpOverload:
    """One overload, callable like `torch.ops.aten.add.Tensor`; hashable, so usable as a table key."""

    def __init__(self, opdef: OpDef):
        self._opdef = opdef

    @property
    def opdef(self) -> OpDef:
        return self._opdef

    @property
    def name(self) -> str:
        return self._opdef.name

    @property
    def _schema(self) -> FunctionSchema:
        return self._opdef.schema

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return call_op(self._opdef, args, kwargs)

    def decompose(self, *args: Any, **kwargs: Any) -> Any:
        """Run this op's decomposition instead of the op itself."""
        if self._opdef.decomposition is None:
            raise KilnError(f"{self.name} has no decomposition")
        return self._opdef.decomposition(*args, **kwargs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OpOverload) and other._opdef is self._opdef

    def __hash__(self) -> int:
        return hash(self._opdef.name)

    def __repr__(self) -> str:
        return self.name


class OpOverloadPacket:
    """All overloads of one op name: `kiln.ops.aten.add` (attributes are overloads)."""

    def __init__(self, namespace: str, name: str):
        self._namespace, self._name = namespace, name

    def overloads(self) -> list[str]:
        prefix = f"{self._namespace}.{self._name}."
        return [key[len(prefix):] for key in REGISTRY if key.startswith(prefix) and key.count(".") == 2]

    def __getattr__(self, overload: str) -> OpOverload:
        if overload.startswith("__"):
            raise AttributeError(overload)
        handle = OpOverload(lookup(f"{self._namespace}.{self._name}.{overload}"))
        setattr(self, overload, handle)  # later lookups skip __getattr__
        return handle

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Pick the first overload whose schema accepts the call (like the dispatcher's overload resolution)."""
        errors = []
        for overload in self.overloads():
            opdef = REGISTRY[f"{self._namespace}.{self._name}.{overload}"]
            try:
                opdef.schema.bind(args, kwargs)
            except OpArgumentError as error:
                errors.append(str(error))
                continue
            if _scalar_where_tensor_expected(opdef, args, kwargs):
                continue
            return call_op(opdef, args, kwargs)
        raise OpArgumentError(f"no overload of {self._namespace}.{self._name} accepts these arguments",
                              fix="; ".join(errors[:3]))

    def __repr__(self) -> str:
        return f"{self._namespace}.{self._name}"


def _scalar_where_tensor_expected(opdef: OpDef, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    bound = opdef.schema.bind(args, kwargs)
    for argument, value in zip(opdef.schema.arguments, bound):
        if argument.type.is_tensor and not argument.type.is_list and isinstance(value, (int, float, bool)):
            return True
        if not argument.type.is_tensor and argument.type.base == "Scalar" and not isinstance(
                value, (int, float, bool)) and value is not None and hasattr(value, "shape"):
            return True
    return False


class OpNamespace:
    def __init__(self, namespace: str):
        self._namespace = namespace

    def __getattr__(self, name: str) -> OpOverloadPacket:
        # Python's own dunder probes (__deepcopy__, ...) are not ops; aten's dunder ops (__and__) are registered.
        if name.startswith("__") and not any(key.startswith(f"{self._namespace}.{name}.") for key in REGISTRY):
            raise AttributeError(name)
        if not any(key.startswith(f"{self._namespace}.{name}.") for key in REGISTRY):
            lookup(f"{self._namespace}.{name}.default")  # raises UnknownOpError with suggestions
        packet = OpOverloadPacket(self._namespace, name)
        setattr(self, name, packet)  # later lookups skip __getattr__
        return packet

    def __dir__(self) -> list[str]:
        return sorted({key.split(".")[1] for key in REGISTRY if key.startswith(self._namespace + ".")})


class Ops:
    """`kiln.ops`: `kiln.ops.<namespace>.<name>.<overload>`, e.g. `kiln.ops.aten.add.Tensor`."""

    aten = OpNamespace("aten")

    def __getattr__(self, namespace: str) -> OpNamespace:
        if namespace.startswith("__") or not any(key.startswith(f"{namespace}.") for key in REGISTRY):
            raise AttributeError(f"kiln.ops has no op namespace {namespace!r} (no op registered in it)")
        space = OpNamespace(namespace)
        setattr(self, namespace, space)  # later lookups skip __getattr__
        return space


ops = Ops()


def handle(name: str) -> OpOverload:
    return OpOverload(lookup(name))

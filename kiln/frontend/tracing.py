"""The tracer: records every op a traced Tensor takes part in into a GraphBuilder.

A traced Tensor holds an SSA value instead of a numpy array. `dispatch(op, ...)` is the single entry for
every Tensor method, operator and functional: with no traced argument it runs the op eagerly on numpy;
otherwise the tracer lifts eager tensors it meets as constants, converts SymInts to sympy expressions,
records the op with the user's source line and module stack, and wraps the results as traced Tensors.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import weakref
from typing import Any, Iterator

import numpy as np
from xdsl.dialects.builtin import ArrayAttr, StringAttr
from xdsl.ir import SSAValue

from kiln.ir import dtypes
from kiln.ir.program import GraphBuilder, InputKind
from kiln.ir.registry import OpOverload, emitting
from kiln.ir.symbolic import ShapeEnv
from kiln.ir.types import TensorType
from kiln.ir.views import ViewStep, erase_unused_reads, view_steps

_KILN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# kiln's own layers; anything else (user code, and kiln/models, which is model code) is "the user's line".
_INTERNAL_DIRS = tuple(os.path.join(_KILN_DIR, layer) + os.sep
                       for layer in ("ir", "frontend", "passes", "codegen", "runtime", "cli"))


def user_source_line() -> str | None:
    """`file:line` of the innermost frame outside kiln's internals (the user's code)."""
    import sys
    frame = sys._getframe(1)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(_INTERNAL_DIRS) and "contextlib" not in filename:
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return None


class Tracer:
    """Owns the GraphBuilder and ShapeEnv of one export."""

    def __init__(self, shape_env: ShapeEnv | None = None, *, strict: bool = True):
        self.shape_env = shape_env or ShapeEnv()
        self.builder = GraphBuilder(self.shape_env)
        self.strict = strict
        self.module_stack: list[tuple[str, str]] = []  # (qualified module path, class name)
        self.module_paths: dict[int, str] = {}  # id(module) -> its qualified name in the exported model
        self.preserved_calls: dict[str, Any] = {}  # fqn -> (input values, output values, in_spec, out_spec)
        self.preserve: set[str] = set()  # fqns whose call signatures export records
        self.constants: dict[str, np.ndarray] = {}
        self.example_values: dict[SSAValue, np.ndarray] = {}  # placeholders' example inputs (strict=False)
        self._constant_ids: dict[int, Any] = {}
        self._user_input_start: int | None = None
        # Views made while tracing (kiln/ir/views.py), so an in-place op on one reaches the tensors it aliases:
        # id(view) -> (the view, weakly; its base; how), and id(base) -> its views, weakly. A view the user's code
        # no longer holds (`buf[i].copy_(x)` in a loop) is not read again after a write.
        self.view_links: dict[int, tuple[Any, Any, ViewStep]] = {}
        self.views_of: dict[int, list[Any]] = {}
        self.reread: list[SSAValue] = []  # views read again after a write, whether or not anything uses them

    # -- inputs
    def placeholder(self, name: str, value_type: TensorType, kind: InputKind, target: str | None = None,
                    persistent: bool | None = None) -> SSAValue:
        return self.builder.add_input(name, value_type, kind, target, persistent)

    def begin_user_inputs(self) -> None:
        self._user_input_start = len(self.builder.block.args)

    def lift_constant(self, array: np.ndarray) -> SSAValue:
        """An eager tensor met during tracing becomes a CONSTANT_TENSOR input (`c_lifted_tensor_N`)."""
        found = self._constant_ids.get(id(array))
        if found is not None and found[0] is array:
            return found[1]
        target = f"lifted_tensor_{len(self.constants)}"
        self.constants[target] = array
        index = self._user_input_start if self._user_input_start is not None else len(self.builder.block.args)
        value = self.builder.add_input(f"c_{target}", TensorType.of(array.shape, dtypes.dtype(array.dtype),
                                                                          getattr(array, "layout", None)),
                                       InputKind.CONSTANT_TENSOR, target, index=index)
        if self._user_input_start is not None:
            self._user_input_start += 1
        self._constant_ids[id(array)] = (array, value)
        return value

    def value_of(self, tensor: Any) -> SSAValue:
        """The SSA value standing for `tensor` in this trace (eager tensors become lifted constants)."""
        if tensor._tracer is self:
            return tensor._value
        if tensor._tracer is None:
            return self.lift_constant(tensor._value)
        from kiln.ir.errors import KilnError
        raise KilnError("a tensor from another trace was used here",
                        fix="pass tensors between traces explicitly (e.g. as kiln.cond operands)")

    def example_value(self, value: SSAValue) -> np.ndarray:
        """The value `value` takes on the example inputs (for strict=False specialization)."""
        from kiln.ir.interpreter import run_op
        if value not in self.example_values:
            bindings = {s: info.hint for s, info in self.shape_env.symbols.items() if info.hint is not None}
            for op in self.builder.block.ops:
                if op.results and all(r in self.example_values for r in op.results):
                    continue
                run_op(op, self.example_values, bindings)
                if value in self.example_values:
                    break
        return self.example_values[value]

    def specialize(self, tensor: Any, what: str) -> np.ndarray:
        """strict=False: bake in the example value, with a warning and a recorded guard."""
        import warnings

        import sympy

        from kiln.ir.symbolic import Guard
        array = self.example_value(tensor._value)
        source = user_source_line() or ""
        warnings.warn(f"{what} at {source or 'an unknown line'} depends on tensor data; the exported program "
                      f"is specialized to the example value {array.tolist()!r}", stacklevel=3)
        marker = self.shape_env.create_unbacked_symbol(source=what)
        scalar = array.reshape(-1)[0].item() if array.size else 0
        recorded = sympy.Float(scalar) if isinstance(scalar, float) else sympy.Integer(int(scalar))
        self.shape_env.guards.append(Guard(sympy.Eq(marker, recorded), source))
        return array

    # -- recording
    def call(self, op: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from kiln.frontend.symint import to_expr
        from kiln.frontend.tensor import Tensor

        def unwrap(value: Any) -> Any:
            if isinstance(value, Tensor):
                return self.value_of(value)
            if isinstance(value, (list, tuple)):
                return type(value)(unwrap(v) for v in value)
            return to_expr(value)

        self.builder.source = user_source_line()
        raw_args = [unwrap(a) for a in args]
        raw_kwargs = {k: unwrap(v) for k, v in kwargs.items()}
        mark = len(self.builder.block.ops)
        with emitting(self.builder):
            result = op(*raw_args, **raw_kwargs)
        if self.module_stack:
            stack = ArrayAttr([StringAttr(f"{path}:{cls}") for path, cls in self.module_stack])
            for recorded in list(self.builder.block.ops)[mark:]:
                recorded.attributes["kiln.nn_module_stack"] = stack
        wrapped = self.wrap(result)
        steps = view_steps(op.opdef.name, raw_args, raw_kwargs, result) if args and isinstance(args[0], Tensor) else []
        if steps:
            parts = wrapped if isinstance(wrapped, (list, tuple)) else [wrapped]
            for view, (_, step) in zip(parts, steps):
                self.view_links[id(view)] = (weakref.ref(view), args[0], step)
                self.views_of.setdefault(id(args[0]), []).append(weakref.ref(view))
        return wrapped

    def _link_of(self, tensor: Any) -> tuple[Any, ViewStep] | None:
        """(base, how) when `tensor` is a view made in this trace (an id reused by another tensor is not)."""
        entry = self.view_links.get(id(tensor))
        return entry[1:] if entry is not None and entry[0]() is tensor else None

    def _live_views(self, base: Any) -> list[Any]:
        views = []
        for ref in self.views_of.get(id(base), []):  # (a dead view, or one whose id another tensor took, is gone)
            view = ref()
            link = self._link_of(view) if view is not None else None
            if link is not None and link[0] is base:
                views.append(view)
        self.views_of[id(base)] = [weakref.ref(view) for view in views]
        return views

    def write_through(self, tensor: Any) -> None:
        """After an in-place op gave `tensor` a new value: the tensors it views take the write, up to the root,
        and every view of a tensor that changed reads it again (torch's functionalization, at trace time)."""
        self._reread_views(tensor, skip=None)
        link = self._link_of(tensor)
        while link is not None:
            base, step = link
            with emitting(self.builder):
                updated = step.write(self.value_of(base), tensor._value)
            base._value, base._tracer = updated, self
            self._reread_views(base, skip=tensor)
            tensor, link = base, self._link_of(base)

    def _reread_views(self, base: Any, skip: Any) -> None:
        for view in self._live_views(base):
            if view is skip:
                continue
            step = self._link_of(view)[1]
            with emitting(self.builder):
                view._value, view._tracer = step.read(base._value), self
            self.reread.append(view._value)
            self._reread_views(view, skip=None)

    def erase_unused_views(self, returned: list[Any]) -> None:
        """Drop the views read again that no op and no output (`returned`) uses."""
        erase_unused_reads(self.reread, returned)

    def wrap(self, value: Any) -> Any:
        from kiln.frontend.symint import SymInt
        from kiln.frontend.tensor import Tensor
        if isinstance(value, SSAValue):
            if isinstance(value.type, TensorType):
                return Tensor._traced(value, self)
            return SymInt.wrap(value.type.expr, self.shape_env)
        if isinstance(value, (list, tuple)):
            return type(value)(self.wrap(v) for v in value)
        return value

    def record_call(self, path: str, inputs: Any, outputs: Any) -> None:
        """Remember a preserved submodule's call: its tensor arguments and results as graph values."""
        from kiln.frontend.tensor import Tensor
        from kiln.ir.pytree import tree_flatten
        in_leaves, in_spec = tree_flatten(inputs)
        out_leaves, out_spec = tree_flatten(outputs)
        values_in = [self.value_of(v) for v in in_leaves if isinstance(v, Tensor)]
        values_out = [self.value_of(v) for v in out_leaves if isinstance(v, Tensor)]
        self.preserved_calls[path] = (values_in, values_out, in_spec, out_spec)

    @contextlib.contextmanager
    def module_scope(self, path: str, cls_name: str) -> Iterator[None]:
        self.module_stack.append((path, cls_name))
        try:
            yield
        finally:
            self.module_stack.pop()


_ACTIVE_TRACER: contextvars.ContextVar[Tracer | None] = contextvars.ContextVar("kiln_tracer", default=None)


@contextlib.contextmanager
def tracing(tracer: Tracer) -> Iterator[Tracer]:
    token = _ACTIVE_TRACER.set(tracer)
    try:
        yield tracer
    finally:
        _ACTIVE_TRACER.reset(token)


def active_tracer() -> Tracer | None:
    return _ACTIVE_TRACER.get()

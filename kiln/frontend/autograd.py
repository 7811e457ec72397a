"""Eager autograd on kiln.Tensor, with torch's API and semantics.

Each op that runs on a tensor requiring grad (while grad mode is on) records a `Node`: the op, its arguments
and results as arrays, and an edge per tensor argument to where that argument's gradient goes (the node that
produced it, or a leaf's `.grad`). `backward()` walks the nodes in reverse creation order (a topological order)
and calls each op's VJP rule from the registry. A composite op without its own rule is recorded as the ops of its
decomposition. With `create_graph=True` the rules run on Tensors, so the backward pass is itself recorded.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import threading
import weakref
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from kiln.ir.autodiff import NoDerivativeError, call_vjp, replace_slots, slot_names, tensor_slots
from kiln.ir.errors import KilnError
from kiln.ir.registry import OpDef, OpOverload, emitting, split_bound

__all__ = [
    "backward", "grad", "no_grad", "enable_grad", "set_grad_enabled", "inference_mode", "is_grad_enabled",
    "is_inference_mode_enabled", "Node", "AutogradError", "NoDerivativeError",
]


class AutogradError(KilnError):
    """Misuse of autograd: backward of a non-scalar without a gradient, a second backward through freed state,
    an in-place update of a leaf that requires grad. (An op without a derivative raises NoDerivativeError.)"""


# ---------------------------------------------------------------------------------------------
# Grad mode (thread-local, as torch's)

class _GradMode(threading.local):
    enabled = True
    inference = False


_MODE = _GradMode()


def is_grad_enabled() -> bool:
    return _MODE.enabled


def is_inference_mode_enabled() -> bool:
    return _MODE.inference


class _GradModeContext:
    """Base of the grad-mode context managers; each is also a decorator, like torch's."""

    def __init__(self, enabled: bool, inference: bool | None = None):
        self._enabled, self._inference = enabled, inference
        self._saved: list[tuple[bool, bool]] = []

    def __enter__(self) -> None:
        self._saved.append((_MODE.enabled, _MODE.inference))
        _MODE.enabled = self._enabled
        if self._inference is not None:
            _MODE.inference = self._inference

    def __exit__(self, *exc: object) -> None:
        _MODE.enabled, _MODE.inference = self._saved.pop()

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with type(self)._fresh(self):
                return fn(*args, **kwargs)
        return wrapper

    def _fresh(self) -> "_GradModeContext":
        clone = object.__new__(type(self))
        _GradModeContext.__init__(clone, self._enabled, self._inference)
        return clone


class no_grad(_GradModeContext):
    """Ops inside record nothing and their results do not require grad (torch.no_grad)."""

    def __init__(self) -> None:
        super().__init__(False)


class enable_grad(_GradModeContext):
    """Turn grad mode back on inside no_grad (torch.enable_grad)."""

    def __init__(self) -> None:
        super().__init__(True)


class set_grad_enabled(_GradModeContext):
    """`set_grad_enabled(False)` is no_grad, `True` enable_grad; it also takes effect when called as a function."""

    def __init__(self, mode: bool) -> None:
        super().__init__(bool(mode))
        self._saved.append((_MODE.enabled, _MODE.inference))
        _MODE.enabled = bool(mode)  # like torch: the plain call switches the mode

    def __enter__(self) -> None:  # the mode is already set by __init__
        return None

    def _fresh(self) -> "set_grad_enabled":
        return set_grad_enabled(self._enabled)


class inference_mode(_GradModeContext):
    """no_grad for inference (torch.inference_mode); `inference_mode(False)` leaves grad mode as it is."""

    def __init__(self, mode: bool = True) -> None:
        super().__init__(False, inference=bool(mode))
        self._mode = bool(mode)

    def __enter__(self) -> None:
        self._saved.append((_MODE.enabled, _MODE.inference))
        if self._mode:
            _MODE.enabled, _MODE.inference = False, True
        else:
            _MODE.inference = False

    def _fresh(self) -> "inference_mode":
        return inference_mode(self._mode)


# ---------------------------------------------------------------------------------------------
# The recorded graph

_SEQUENCE = itertools.count()


class Node:
    """One recorded op: what its VJP rule needs, and where each tensor argument's gradient goes.

    `edges[i]` belongs to the i-th tensor slot of the op (a Tensor[] argument has a slot per element): None
    (no gradient wanted), a leaf Tensor (gradient accumulates in `.grad`), or `(node, output_index)`.
    """

    __slots__ = ("opdef", "bound", "outputs", "output_count", "edges", "sequence", "hooks", "retained", "freed",
                 "__weakref__")

    def __init__(self, opdef: OpDef, bound: list[Any], outputs: list[np.ndarray], edges: list[Any]):
        self.opdef, self.bound, self.outputs, self.edges = opdef, bound, outputs, edges
        self.output_count = len(outputs)
        self.sequence = next(_SEQUENCE)
        self.hooks: dict[int, list[Callable[[Any], Any]]] = {}
        self.retained: dict[int, Any] = {}  # output index -> weakref of a tensor that called retain_grad()
        self.freed = False

    def name(self) -> str:
        """torch's grad_fn name, e.g. `MulBackward0`: here `aten.mul.Tensor` backward."""
        return f"{self.opdef.name} backward"

    def __repr__(self) -> str:
        return f"<{self.name()}>"


def _is_differentiable_dtype(array: Any) -> bool:
    return isinstance(array, np.ndarray) and array.dtype.kind in "fc" or (
        isinstance(array, np.ndarray) and array.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"))


def requires_grad_anywhere(values: Iterable[Any]) -> bool:
    """Is any Tensor among `values` (lists included) part of the autograd graph? False outside grad mode."""
    if not _MODE.enabled:
        return False
    from kiln.frontend.tensor import Tensor
    for value in values:
        if isinstance(value, Tensor):
            if value._requires_grad:
                return True
        elif isinstance(value, (list, tuple)) and requires_grad_anywhere(value):
            return True
    return False


def _edge_of(tensor: Any) -> Any:
    from kiln.frontend.tensor import Tensor
    if not isinstance(tensor, Tensor) or not tensor._requires_grad:
        return None
    return tensor._grad_fn if tensor._grad_fn is not None else tensor


class _TensorEmitter:
    """Sends `kiln.ops` calls on Tensors back through dispatch, so a decomposition or a VJP rule given Tensors
    records its ops like user code does."""

    def accepts(self, value: Any) -> bool:
        from kiln.frontend.tensor import Tensor
        return isinstance(value, Tensor) and value._tracer is None

    def emit(self, opdef: OpDef, bound: list[Any]) -> Any:
        from kiln.frontend.tensor import dispatch
        positional, keywords = split_bound(opdef, bound)
        return dispatch(OpOverload(opdef), *positional, **keywords)


_TENSOR_EMITTER = _TensorEmitter()


def record(opdef: OpDef, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """Run `opdef` eagerly on Tensors that require grad, and record how to differentiate it."""
    from kiln.frontend.tensor import Tensor, _eager, _wrap_eager

    if opdef.vjp is None and opdef.decomposition is not None and "nondifferentiable" not in opdef.tags:
        # A composite op without a rule of its own is differentiated through its decomposition (torch's
        # CompositeImplicitAutograd): record the ops it decomposes into.
        positional, keywords = split_bound(opdef, opdef.schema.bind(tuple(args), dict(kwargs)))
        with emitting(_TENSOR_EMITTER):
            return opdef.decomposition(*positional, **keywords)

    bound = opdef.schema.bind(tuple(args), dict(kwargs))
    slots = tensor_slots(opdef, bound)
    frozen = opdef.nondifferentiable_arguments
    edges = [None if name in frozen else _edge_of(value) for name, value in zip(slot_names(opdef, bound), slots)]
    arrays = [_eager(value) for value in bound]
    positional, keywords = split_bound(opdef, arrays)
    result = OpOverload(opdef)(*positional, **keywords)
    flat = list(result) if isinstance(result, (list, tuple)) else [result]
    differentiable = "nondifferentiable" not in opdef.tags and any(e is not None for e in edges)
    if not differentiable or not any(_is_differentiable_dtype(r) and i not in opdef.nondifferentiable_outputs
                                     for i, r in enumerate(flat)):
        return _wrap_eager(result)

    for value in slots:
        if isinstance(value, Tensor):
            value._saved = True  # an in-place update must not overwrite the array this node keeps
    node = Node(opdef, replace_slots(opdef, arrays, (_eager(v) for v in slots)), flat, edges)
    wrapped = []
    for index, array in enumerate(flat):
        if isinstance(array, np.ndarray):
            tensor = Tensor(array)
            if _is_differentiable_dtype(array) and index not in opdef.nondifferentiable_outputs:
                tensor._requires_grad, tensor._grad_fn, tensor._saved = True, (node, index), True
            wrapped.append(tensor)
        else:
            wrapped.append(array)
    if isinstance(result, list):
        return wrapped
    if isinstance(result, tuple):
        return type(result)(wrapped) if type(result) is tuple else type(result)(*wrapped)
    return wrapped[0]


# ---------------------------------------------------------------------------------------------
# Running the rules backwards

def _call_rule(node: Node, output_grads: list[Any], create_graph: bool) -> list[Any]:
    """The gradient of each tensor slot of `node`'s op, given the gradients of its outputs."""
    from kiln.frontend.tensor import Tensor

    bound, outputs = node.bound, list(node.outputs)
    if not create_graph:
        return call_vjp(node.opdef, output_grads, outputs, bound)
    # Rebuild Tensors connected to the graph, so the ops the rule runs are recorded in turn.
    slots = [_reconnect(array, edge) for array, edge in zip(tensor_slots(node.opdef, bound), node.edges)]
    outputs = [_reconnect(array, (node, i) if _is_differentiable_dtype(array)
                          and i not in node.opdef.nondifferentiable_outputs else None)
               for i, array in enumerate(outputs)]
    output_grads = [g if g is None or isinstance(g, Tensor) else Tensor(g) for g in output_grads]
    with emitting(_TENSOR_EMITTER):
        return call_vjp(node.opdef, output_grads, outputs, replace_slots(node.opdef, bound, slots))


def _reconnect(array: Any, edge: Any) -> Any:
    """A saved array as a Tensor whose gradient flows along `edge` (for higher-order gradients)."""
    from kiln.frontend.tensor import Tensor
    if not isinstance(array, np.ndarray):
        return array
    if isinstance(edge, Tensor):
        return edge  # the leaf itself, so second-order gradients reach its .grad
    tensor = Tensor(array)
    if edge is not None:
        tensor._requires_grad, tensor._grad_fn, tensor._saved = True, edge, True
    return tensor


def _check_gradient(node: Node, slot: int, gradient: Any, like: Any) -> Any:
    """A rule's gradient must have its input's shape; it is cast to the input's dtype (as torch's engine does)."""
    shape = tuple(gradient.shape)
    if shape != tuple(like.shape):
        raise KilnError(f"the VJP rule of {node.opdef.name} returned a gradient of shape {list(shape)} for "
                        f"tensor argument {slot}, whose shape is {list(like.shape)}")
    if gradient.dtype != like.dtype:
        return gradient.to(like.dtype) if hasattr(gradient, "to") else gradient.astype(like.dtype)
    return gradient


def _add(a: Any, b: Any) -> Any:
    if a is None:
        return b
    return a + b


def run_backward(roots: Sequence[Any], root_grads: Sequence[Any], *, retain_graph: bool, create_graph: bool,
                 inputs: Sequence[Any] | None = None, accumulate: bool = True) -> list[Any] | None:
    """Propagate `root_grads` from `roots` (Tensors). With `accumulate`, leaves' `.grad` (or only those in
    `inputs`) gain their gradients; otherwise the gradients of `inputs` are returned (autograd.grad)."""
    from kiln.frontend.tensor import Tensor

    pending: dict[Node, list[Any]] = {}
    leaf_grads: dict[int, Any] = {}
    leaves: dict[int, Tensor] = {}
    heap: list[tuple[int, int, Node]] = []
    wanted_leaves = {id(t) for t in inputs if t._grad_fn is None} if inputs is not None else None
    wanted_nodes = {t._grad_fn: None for t in inputs if t._grad_fn is not None} if inputs is not None else {}
    captured: dict[tuple[int, int], Any] = {}

    def send(edge: Any, gradient: Any) -> None:
        if edge is None or gradient is None:
            return
        if isinstance(edge, Tensor):
            leaves[id(edge)] = edge
            leaf_grads[id(edge)] = _add(leaf_grads.get(id(edge)), gradient)
            return
        node, index = edge
        if node not in pending:
            pending[node] = [None] * node.output_count
            heapq.heappush(heap, (-node.sequence, id(node), node))
        pending[node][index] = _add(pending[node][index], gradient)

    for root, gradient in zip(roots, root_grads):
        send(_edge_of(root), gradient)

    while heap:
        _, _, node = heapq.heappop(heap)
        grads = pending.pop(node)
        if node.freed:
            raise AutogradError(
                "Trying to backward through the graph a second time (or directly access saved tensors after they "
                "have already been freed)", fix="pass retain_graph=True to the first backward() or autograd.grad()")
        for index, hooks in node.hooks.items():
            for hook in hooks:
                if grads[index] is not None:
                    changed = hook(_as_tensor(grads[index]))
                    if changed is not None:
                        grads[index] = changed if create_graph else _as_array(changed)
        for index, ref in node.retained.items():
            tensor = ref()
            if tensor is not None and grads[index] is not None:
                tensor._grad = _as_tensor(grads[index]) if tensor._grad is None else tensor._grad + grads[index]
        for index in range(len(grads)):
            if (node, index) in wanted_nodes:
                captured[(id(node), index)] = grads[index]
        if all(g is None for g in grads):
            continue
        input_grads = _call_rule(node, grads, create_graph)
        slots = tensor_slots(node.opdef, node.bound)
        for slot, (edge, gradient) in enumerate(zip(node.edges, input_grads)):
            if edge is not None and gradient is not None:
                send(edge, _check_gradient(node, slot, gradient, slots[slot]))
        if not retain_graph:
            node.bound, node.outputs, node.freed = [], [], True

    # Leaves last: hooks see the whole gradient, then it accumulates (AccumulateGrad).
    for key, leaf in leaves.items():
        gradient = leaf_grads[key]
        for hook in leaf._hooks:
            changed = hook(_as_tensor(gradient))
            if changed is not None:
                gradient = changed if create_graph else _as_array(changed)
        leaf_grads[key] = gradient
        if accumulate and (wanted_leaves is None or key in wanted_leaves):
            _accumulate(leaf, gradient, create_graph)
    if accumulate:
        return None
    results = []
    for tensor in inputs or ():
        if tensor._grad_fn is None:
            gradient = leaf_grads.get(id(tensor))
        else:
            node, index = tensor._grad_fn
            gradient = captured.get((id(node), index))
        results.append(gradient)
    return results


def _as_tensor(value: Any) -> Any:
    from kiln.frontend.tensor import Tensor
    return value if isinstance(value, Tensor) else Tensor(value)


def _as_array(value: Any) -> Any:
    from kiln.frontend.tensor import Tensor
    return value._value if isinstance(value, Tensor) else np.asarray(value)


def _accumulate(leaf: Any, gradient: Any, create_graph: bool) -> None:
    from kiln.frontend.tensor import Tensor
    if leaf._grad is None:
        leaf._grad = gradient if isinstance(gradient, Tensor) else Tensor(np.array(gradient, copy=True))
    elif create_graph or isinstance(gradient, Tensor) and gradient._requires_grad:
        leaf._grad = leaf._grad + gradient
    else:
        np.add(leaf._grad._value, _as_array(gradient), out=leaf._grad._value)


def _root_grads(tensors: Sequence[Any], grad_tensors: Sequence[Any] | None, create_graph: bool) -> list[Any]:
    from kiln.frontend.tensor import Tensor
    result = []
    given = list(grad_tensors) if grad_tensors is not None else [None] * len(tensors)
    if len(given) != len(tensors):
        raise AutogradError(f"got {len(given)} gradients for {len(tensors)} tensors",
                            fix="pass one gradient per output (None for a scalar output)")
    for index, (tensor, gradient) in enumerate(zip(tensors, given)):
        if not tensor._requires_grad:
            raise AutogradError(f"element {index} of tensors does not require grad and does not have a grad_fn",
                                fix="call backward on a result computed from tensors with requires_grad=True")
        if gradient is None:
            if tensor._value.size != 1:
                raise AutogradError("grad can be implicitly created only for scalar outputs",
                                    fix="pass gradient= (a tensor of the output's shape) to backward()")
            gradient = np.ones_like(tensor._value)
        elif isinstance(gradient, Tensor):
            gradient = gradient.to(tensor.dtype) if create_graph else gradient._value.astype(tensor._value.dtype)
        else:
            gradient = np.asarray(gradient, dtype=tensor._value.dtype)
        if tuple(gradient.shape) != tuple(tensor._value.shape):
            raise AutogradError(f"Mismatch in shape: grad_output[{index}] has a shape of {list(gradient.shape)} and "
                                f"output[{index}] has a shape of {list(tensor._value.shape)}")
        result.append(gradient)
    return result


def _as_sequence(value: Any) -> list[Any]:
    from kiln.frontend.tensor import Tensor
    if value is None:
        return []
    return [value] if isinstance(value, Tensor) else list(value)


def backward(tensors: Any, grad_tensors: Any = None, retain_graph: bool | None = None, create_graph: bool = False,
             inputs: Any = None) -> None:
    """torch.autograd.backward: accumulate d(tensors)/d(leaf) into each leaf's `.grad`."""
    roots = _as_sequence(tensors)
    grads = None if grad_tensors is None else ([grad_tensors] if len(roots) == 1 and not isinstance(
        grad_tensors, (list, tuple)) else list(grad_tensors))
    run_backward(roots, _root_grads(roots, grads, create_graph),
                 retain_graph=create_graph if retain_graph is None else retain_graph, create_graph=create_graph,
                 inputs=_as_sequence(inputs) if inputs is not None else None)


def grad(outputs: Any, inputs: Any, grad_outputs: Any = None, retain_graph: bool | None = None,
         create_graph: bool = False, allow_unused: bool | None = None, materialize_grads: bool = False) -> tuple:
    """torch.autograd.grad: the gradients of `outputs` with respect to `inputs`, without touching `.grad`."""
    from kiln.frontend.tensor import Tensor
    roots = _as_sequence(outputs)
    wanted = _as_sequence(inputs)
    for index, tensor in enumerate(wanted):
        if not isinstance(tensor, Tensor) or not tensor._requires_grad:
            raise AutogradError(f"One of the differentiated Tensors (input {index}) does not require grad",
                                fix="set requires_grad=True on it before computing the outputs")
    grads = None if grad_outputs is None else ([grad_outputs] if len(roots) == 1 and not isinstance(
        grad_outputs, (list, tuple)) else list(grad_outputs))
    found = run_backward(roots, _root_grads(roots, grads, create_graph),
                         retain_graph=create_graph if retain_graph is None else retain_graph,
                         create_graph=create_graph, inputs=wanted, accumulate=False) or []
    result = []
    for index, (tensor, gradient) in enumerate(zip(wanted, found)):
        if gradient is None:
            if materialize_grads:
                gradient = np.zeros_like(tensor._value)
            elif not allow_unused:
                raise AutogradError(f"One of the differentiated Tensors (input {index}) appears to not have been "
                                    "used in the graph", fix="pass allow_unused=True if this is intended")
        result.append(None if gradient is None else _as_tensor(gradient))
    return tuple(result)


def register_hook(tensor: Any, hook: Callable[[Any], Any]) -> Any:
    """Call `hook(grad)` when the gradient of `tensor` is computed; a returned tensor replaces the gradient."""
    if not tensor._requires_grad:
        raise AutogradError("cannot register a hook on a tensor that doesn't require gradient")
    if tensor._grad_fn is None:
        hooks = tensor._hooks
    else:
        node, index = tensor._grad_fn
        hooks = node.hooks.setdefault(index, [])
    hooks.append(hook)
    return _RemovableHandle(hooks, hook)


def retain_grad(tensor: Any) -> None:
    if tensor._grad_fn is not None:
        node, index = tensor._grad_fn
        node.retained[index] = weakref.ref(tensor)


class _RemovableHandle:
    def __init__(self, hooks: list[Any], hook: Any):
        self._hooks, self._hook = hooks, hook

    def remove(self) -> None:
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)

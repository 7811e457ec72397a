"""Registry-driven autodiff tests: every op's VJP rule against torch.autograd, as recorded ops (the joint program's
path) against the same rule run eagerly, and, on a subset of smooth ops, against finite differences.

Samples come from tests/ir/samples. Floating tensors are promoted to float64 (torch's gradcheck dtype), so the
comparison holds at float64's default tolerances; integer and bool tensors (indices, masks) stay as they are.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import numpy as np
import pytest

import kiln
from kiln.frontend.tensor import dispatch
from kiln.ir import dtypes
from kiln.ir.program import GraphBuilder
from kiln.ir.registry import REGISTRY, OpOverload, split_bound
from kiln.ir.types import TensorType
from tests.ir.samples import SAMPLES
from tests.torch_oracle import requires_torch, to_torch, torch

import kiln.ir.ops  # noqa: F401

# Every core op, and every other op with a rule of its own (composites without one differentiate through their
# decomposition, which the eager-autograd tests exercise). Random ops draw new values on each call: no oracle.
VJP_OPS = sorted(name for name, opdef in REGISTRY.items()
                 if (opdef.is_core or opdef.vjp is not None) and "random" not in opdef.tags)
RULE_OPS = sorted(name for name, opdef in REGISTRY.items() if opdef.vjp is not None)


def _is_float(array) -> bool:
    """A differentiable array: floating, or complex."""
    return isinstance(array, np.ndarray) and (dtypes.dtype(array.dtype).is_floating_point or array.dtype.kind == "c")


def _promote(value):
    """Floating arrays to float64 and complex ones to complex128, recursively; everything else unchanged."""
    if _is_float(value):
        return value.astype(np.complex128 if value.dtype.kind == "c" else np.float64)
    if isinstance(value, list):
        return [_promote(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_promote(v) for v in value)
    return value


# Ops torch only computes in float32 (its per-channel and learnable fake-quant kernels refuse float64): their samples
# keep float32 (bfloat16/float16/float64 ones become float32) instead of moving to float64.
FLOAT32_GRADIENT_OPS = {"aten.fake_quantize_per_channel_affine.default",
                        "aten._fake_quantize_learnable_per_tensor_affine.default",
                        "aten._fake_quantize_learnable_per_channel_affine.default"}


def _promote_to_float32(value):
    if isinstance(value, np.ndarray) and dtypes.dtype(value.dtype).is_floating_point:
        return value.astype(np.float32)
    if isinstance(value, list):
        return [_promote_to_float32(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_promote_to_float32(v) for v in value)
    return value


def _has_complex(value) -> bool:
    if isinstance(value, np.ndarray):
        return value.dtype.kind == "c"
    if isinstance(value, (list, tuple)):
        return any(_has_complex(v) for v in value)
    if isinstance(value, dict):
        return any(_has_complex(v) for v in value.values())
    return False


def _float_samples(name: str):
    """The op's samples with floating tensors in float64 (complex in complex128, for COMPLEX_GRADIENT_OPS only)."""
    for sample in SAMPLES[name](np.random.default_rng(0)):
        if not sample.check_values or _has_complex((sample.args, sample.kwargs)) and name not in COMPLEX_GRADIENT_OPS:
            continue
        promote = _promote_to_float32 if name in FLOAT32_GRADIENT_OPS else _promote
        args, kwargs = promote(copy.deepcopy(sample.args)), promote(copy.deepcopy(sample.kwargs))
        yield sample, args, kwargs


def _flat(value) -> list:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _flat(item)]
    return [value]


def _wrap(value, inputs: list, make):
    """Floating arrays -> framework tensors that require grad (collected in `inputs`, in argument order)."""
    if _is_float(value):
        tensor = make(value)
        inputs.append(tensor)
        return tensor
    if isinstance(value, list):
        return [_wrap(v, inputs, make) for v in value]
    if isinstance(value, tuple):
        return tuple(_wrap(v, inputs, make) for v in value)
    if isinstance(value, np.ndarray):
        return make(value, grad=False)
    if make in (_torch_tensor, _torch_constant):
        return to_torch(value)  # kiln dtypes -> torch dtypes
    return value


def _wrap_positional(opdef, args, inputs: list, make):
    """_wrap per positional argument; those torch refuses to differentiate (batch norm's running statistics)
    never require grad."""
    names = [a.name for a in opdef.schema.arguments if not a.kwarg_only]
    return [_wrap(value, [], lambda array, grad=True: make(array, grad=False))
            if name in opdef.nondifferentiable_arguments else _wrap(value, inputs, make)
            for name, value in zip(names, args)]


def _kiln_tensor(array, grad=True):
    return kiln.tensor(array, requires_grad=grad)


def _torch_tensor(array, grad=True):
    return to_torch(array).requires_grad_(grad)


def _kiln_constant(array, grad=False):
    return _kiln_tensor(array, grad=False)


def _torch_constant(array, grad=False):
    return _torch_tensor(array, grad=False)


# Ops whose gradient torch cannot give directly, with a torch expression computing the same thing that it can
# differentiate: the functional copy has no derivative in torch (its in-place copy_ has), out= overloads refuse
# autograd, and atan2's backward negates a bool self instead of promoting it first.
TORCH_GRAD_EQUIVALENTS = {
    "aten.copy.default": lambda t: lambda self, src, non_blocking=False: self.clone().copy_(src),
    "aten.atan2.out": lambda t: lambda self, other, *, out: t.atan2(self, other).to(out.dtype),
    "aten.atan2.default": lambda t: lambda self, other: t.atan2(self.double() if self.dtype == t.bool else self,
                                                                 other),
    # torch's backward crashes with a bias but no weight; a weight of ones is the same forward
    "aten.native_group_norm.default": lambda t: lambda input, weight, bias, n, c, hxw, group, eps:
        t.ops.aten.native_group_norm.default(
            input, weight if weight is not None or bias is None else t.ones(c, dtype=input.dtype), bias, n, c, hxw,
            group, eps),
}


# Where torch cannot be the oracle at all: the op, or the samples of it, and why. The rule is still checked traced
# against eager (test_vjp_rule_records_the_same_gradients).
NO_TORCH_GRADIENT: dict[str, tuple[Callable[[Any], bool], str]] = {
    "aten.native_group_norm_backward.default": (lambda sample: True, "torch has no derivative for it"),
    "aten.embedding_dense_backward.default": (lambda sample: sample.args[1].size == 0,
                                              "torch's double backward fails on empty indices"),
}
# Ops whose gradients are checked on complex samples too (complex cotangents): the rules written for complex values.
COMPLEX_GRADIENT_OPS = {"aten._fft_r2c.default", "aten._fft_c2r.default", "aten._fft_c2c.default"}


def _torch_op(name: str):
    if name in TORCH_GRAD_EQUIVALENTS:
        return TORCH_GRAD_EQUIVALENTS[name](torch)
    namespace, op_name, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), op_name), overload)


def _cotangent(output, rng) -> np.ndarray:
    """A random float64 (complex128 for a complex output) array of the output's shape."""
    shape = tuple(output.shape)
    complex_output = output.dtype.kind == "c" if isinstance(output, np.ndarray) else output.dtype.is_complex
    real = np.asarray(rng.standard_normal(shape))
    return real + 1j * np.asarray(rng.standard_normal(shape)) if complex_output else real


def _cotangents(outputs: list, rng) -> list[np.ndarray]:
    return [_cotangent(o, rng) for o in outputs]


@requires_torch
@pytest.mark.parametrize("name", VJP_OPS)
def test_vjp_matches_torch_autograd(name):
    """kiln.autograd.grad through the op == torch.autograd.grad through torch's op, on every float sample."""
    opdef = REGISTRY[name]
    compared = 0
    for sample, args, kwargs in _float_samples(name):
        if name in NO_TORCH_GRADIENT and NO_TORCH_GRADIENT[name][0](sample):
            continue
        kiln_inputs: list = []
        kiln_args = _wrap_positional(opdef, args, kiln_inputs, _kiln_tensor)
        # An out= argument is written, never differentiated (torch refuses out= tensors that require grad).
        kiln_kwargs = {k: _wrap(v, kiln_inputs, _kiln_tensor) if k != "out" else _wrap(v, [], _kiln_constant)
                       for k, v in kwargs.items()}
        torch_inputs: list = []
        torch_args = _wrap_positional(opdef, args, torch_inputs, _torch_tensor)
        torch_kwargs = {k: _wrap(v, torch_inputs, _torch_tensor) if k != "out" else _wrap(v, [], _torch_constant)
                        for k, v in kwargs.items()}
        if not kiln_inputs:
            continue
        where = f"{name} {sample}"
        try:
            expected = [o for o in _flat(_torch_op(name)(*torch_args, **torch_kwargs))
                        if isinstance(o, torch.Tensor) and o.requires_grad]
        except RuntimeError as error:  # a float input reduced to an integer dtype: torch refuses, kiln records nothing
            if "Autograd not support dtype" not in str(error):
                raise
            expected = []
        produced = [o for o in _flat(dispatch(OpOverload(opdef), *kiln_args, **kiln_kwargs))
                    if isinstance(o, kiln.Tensor) and o.requires_grad]
        assert len(produced) == len(expected), (
            f"{where}: kiln gives {len(produced)} differentiable results, torch {len(expected)}"
            + (" (tag the op nondifferentiable)" if not expected else ""))
        if not expected:
            continue
        assert opdef.vjp is not None or opdef.decomposition is not None, f"{name} has no VJP rule"
        cotangents = _cotangents(produced, np.random.default_rng(1))
        kiln_grads = kiln.autograd.grad(produced, kiln_inputs, [kiln.tensor(c) for c in cotangents],
                                        allow_unused=True)
        torch_grads = torch.autograd.grad(expected, torch_inputs, [torch.from_numpy(c) for c in cotangents],
                                          allow_unused=True)
        for index, (mine, theirs) in enumerate(zip(kiln_grads, torch_grads)):
            reference = torch.zeros_like(torch_inputs[index]) if theirs is None else theirs
            actual = torch.zeros_like(reference) if mine is None else torch.from_numpy(np.array(mine.numpy()))
            torch.testing.assert_close(actual, reference.detach(), equal_nan=True,
                                       msg=lambda m, i=index: f"{where}: gradient of input {i}: {m}")
        compared += 1
    if opdef.vjp is not None and name not in NO_TORCH_GRADIENT:
        assert compared, f"{name} has a VJP rule but no float sample exercises it"


def _lift(builder: GraphBuilder, value, inputs: list):
    if isinstance(value, np.ndarray):
        inputs.append(value)
        return builder.add_input(f"x{len(inputs) - 1}", TensorType.of(value.shape, dtypes.dtype(value.dtype)))
    if isinstance(value, list):
        return [_lift(builder, v, inputs) for v in value]
    return value


@pytest.mark.parametrize("name", RULE_OPS)
def test_vjp_rule_records_the_same_gradients(name):
    """The rule run on IR values (how the joint program is built) gives, in the interpreter, what it gives eagerly."""
    opdef = REGISTRY[name]
    checked = 0
    for sample, args, kwargs in _float_samples(name):
        if checked == 3:
            break
        bound = opdef.schema.bind(args, kwargs)
        positional, keywords = split_bound(opdef, bound)
        if not any(_is_float(v) for v in _flat(positional + list(keywords.values()))):
            continue
        out = OpOverload(opdef)(*positional, **keywords)
        flat_out = _flat(out)
        if not any(_is_float(o) for o in flat_out):
            continue
        checked += 1
        rng = np.random.default_rng(2)
        grads = [_cotangent(o, rng) if _is_float(o) else None for o in flat_out]
        eager = _flat(_call_rule(opdef, grads, out, positional, keywords))

        builder = GraphBuilder()
        inputs: list = []
        traced_positional = [_lift(builder, v, inputs) for v in positional]
        traced_keywords = {k: _lift(builder, v, inputs) for k, v in keywords.items()}
        traced_grads = [_lift(builder, g, inputs) for g in grads]
        with builder:
            traced_out = OpOverload(opdef)(*traced_positional, **traced_keywords)
            traced = _flat(_call_rule(opdef, traced_grads, traced_out, traced_positional, traced_keywords))
        kept = [i for i, g in enumerate(traced) if g is not None]
        assert [i for i, g in enumerate(eager) if g is not None] == kept, f"{name} {sample}: different None grads"
        if not kept:
            continue
        program = builder.build([traced[i] for i in kept])
        program.verify()
        got = program(*inputs)
        got = [got] if len(kept) == 1 else list(got)
        for index, value in zip(kept, got):
            np.testing.assert_allclose(np.asarray(value, np.float64), np.asarray(eager[index], np.float64),
                                       rtol=1e-7, atol=1e-7, err_msg=f"{name} {sample}: gradient {index}")


def _call_rule(opdef, grads, out, positional, keywords):
    returns = opdef.schema.returns
    if len(returns) == 1 and not returns[0].type.is_list:
        grad_arg = grads[0]
    elif len(returns) == 1:
        grad_arg = list(grads)
    else:
        grad_arg = tuple(grads)
    result = opdef.vjp(grad_arg, out, *positional, **keywords)
    if len([a for a in opdef.schema.arguments if a.type.is_tensor]) == 1:
        result = (result,)
    return result


# Smooth ops (away from measure-zero kinks, which random samples miss) checked against central differences.
FINITE_DIFFERENCE_OPS = [
    "aten.exp.default", "aten.mul.Tensor", "aten.add.Tensor", "aten.sub.Tensor",
    # shape and indexing
    "aten.view.default", "aten.squeeze.dim", "aten.squeeze.dims", "aten.unsqueeze.default", "aten.expand.default",
    "aten.permute.default", "aten.flip.default", "aten.repeat.default", "aten.select.int", "aten.slice.Tensor",
    "aten.select_scatter.default", "aten.slice_scatter.default", "aten.diagonal.default", "aten.as_strided.default",
    "aten.cat.default", "aten.split_with_sizes.default", "aten.constant_pad_nd.default", "aten.gather.default",
    "aten.scatter.src", "aten.scatter_add.default", "aten.index_select.default", "aten.index.Tensor",
    "aten.index_put.default", "aten.masked_scatter.default",
    # reductions and linear algebra
    "aten._softmax.default", "aten._log_softmax.default", "aten.mean.default", "aten.mean.dim",
    "aten.sum.dim_IntList", "aten.cumsum.default", "aten.prod.dim_int", "aten.prod.default", "aten.mm.default",
    "aten.bmm.default", "aten.addmm.default",
    # pointwise
    "aten.sin.default", "aten.cos.default", "aten.tan.default", "aten.tanh.default", "aten.sigmoid.default",
    "aten.expm1.default", "aten.log.default", "aten.log1p.default", "aten.log2.default", "aten.log10.default",
    "aten.sqrt.default", "aten.rsqrt.default", "aten.reciprocal.default", "aten.asin.default", "aten.acos.default",
    "aten.atan.default", "aten.asinh.default", "aten.acosh.default", "aten.atanh.default", "aten.sinh.default",
    "aten.cosh.default", "aten.erf.default", "aten.neg.default", "aten.clone.default", "aten.alias.default",
    "aten.gelu.default", "aten.div.Tensor", "aten.div.Scalar", "aten.atan2.default", "aten.pow.Tensor_Tensor",
    "aten.mul.Scalar", "aten.add.Scalar", "aten.sub.Scalar", "aten.where.self",
    # nn
    "aten.convolution.default", "aten.convolution_backward.default", "aten.native_group_norm.default",
    "aten.native_layer_norm.default", "aten._native_batch_norm_legit.no_stats", "aten.avg_pool2d.default",
    "aten.avg_pool3d.default", "aten._adaptive_avg_pool2d.default", "aten._adaptive_avg_pool3d.default",
    "aten.upsample_bilinear2d.vec", "aten.col2im.default", "aten.reflection_pad1d.default",
    "aten.reflection_pad2d.default", "aten.reflection_pad3d.default", "aten.replication_pad2d.default",
    "aten.replication_pad3d.default", "aten.embedding.default", "aten.avg_pool2d_backward.default",
    "aten._adaptive_avg_pool2d_backward.default",
]


@pytest.mark.parametrize("name", [n for n in FINITE_DIFFERENCE_OPS if n in REGISTRY])
def test_vjp_matches_finite_differences(name):
    """<u, J v> from the rule == (<u, f(x + h v)> - <u, f(x - h v)>) / 2h, for random u and v, in float64."""
    opdef = REGISTRY[name]
    op = OpOverload(opdef)
    for sample, args, kwargs in list(_float_samples(name))[:4]:
        inputs: list = []
        wrapped = _wrap_positional(opdef, args, inputs, _kiln_tensor)
        wrapped_kwargs = {k: _wrap(v, inputs, _kiln_tensor) for k, v in kwargs.items()}
        if not inputs:
            continue
        outputs = [o for o in _flat(dispatch(op, *wrapped, **wrapped_kwargs)) if isinstance(o, kiln.Tensor)
                   and o.requires_grad]
        rng = np.random.default_rng(3)
        cotangents = _cotangents(outputs, rng)
        directions = [rng.standard_normal(t.shape) for t in inputs]
        grads = kiln.autograd.grad(outputs, inputs, [kiln.tensor(c) for c in cotangents], allow_unused=True)
        analytic = sum(float(np.sum(g.numpy() * d)) for g, d in zip(grads, directions) if g is not None)

        def projected(step: float) -> float:
            shifted = iter([t.numpy() + step * d for t, d in zip(inputs, directions)])
            moved_args = _replace_floats(args, shifted)
            moved_kwargs = {k: _replace_floats(v, shifted) for k, v in kwargs.items()}
            results = [r for r in _flat(op(*moved_args, **moved_kwargs)) if _is_float(r)]
            return sum(float(np.sum(r * c)) for r, c in zip(results, cotangents))

        step = 1e-6
        numeric = (projected(step) - projected(-step)) / (2 * step)
        assert numeric == pytest.approx(analytic, rel=1e-5, abs=1e-6), f"{name} {sample}"


def _replace_floats(value, replacements):
    if _is_float(value):
        return next(replacements)
    if isinstance(value, list):
        return [_replace_floats(v, replacements) for v in value]
    if isinstance(value, tuple):
        return tuple(_replace_floats(v, replacements) for v in value)
    return value

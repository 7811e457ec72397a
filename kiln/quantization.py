"""kiln.quantization: PT2E post-training quantization, as torch.ao.quantization / torchao.quantization.pt2e.

    prepared = prepare_pt2e(program, X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config()))
    for batch in calibration_data:
        prepared(batch)                 # or: calibrate(prepared, batches, backend="c"), compiled once
    quantized = convert_pt2e(prepared)  # quantize/dequantize ops around float ops

Quantization-aware training: `prepare_qat_pt2e(program, quantizer)` with a QAT config (`is_qat=True`) gives a
trainable module whose quantized values pass through fake quantizers (FakeQuantize, FusedMovingAvgObsFakeQuantize,
_LearnableFakeQuantize, which compute and differentiate as torch.ao.quantization's do); train it with kiln.optim,
`move_exported_model_to_eval`, then `convert_pt2e` gives the same kind of program as post-training quantization.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from kiln.frontend.nn.module import Module
from kiln.frontend.program_module import ProgramModule
from kiln.frontend.tensor import Parameter, Tensor, dispatch
from kiln.ir import dtypes
from kiln.ir.dtypes import DType
from kiln.ir.errors import KilnError
from kiln.ir.dialect import bound_arguments
from kiln.ir.program import ExportedProgram, OutputKind, running_statistic_targets
from kiln.ir.registry import ops as _ops
from kiln.passes.quant.convert import convert_pt2e as _convert_pt2e
from kiln.passes.quant.observer import (
    FixedQParamsObserver, HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver, ObserverBase, PartialConstructor, PerChannelMinMaxObserver,
    PerGroupMinMaxObserver, PlaceholderObserver, QScheme, UniformQuantizationObserverBase, fbgemm_qparams,
    moving_average, per_channel_affine, per_channel_symmetric, per_tensor_affine, per_tensor_symmetric,
)
from kiln.passes.quant.prepare import PreparedProgram, prepare_pt2e
from kiln.passes.quant.qat import fold_conv_bn_qat
from kiln.passes.quant.quantizer import (
    DerivedQuantizationSpec, Int32Bias, QuantizationAnnotation, QuantizationConfig, QuantizationSpec, Quantizer,
    Renaming, SharedQuantizationSpec, annotate, annotation_of,
)
from kiln.passes.quant.report import LayerError, QuantizationReport, report
from kiln.passes.quant.simple import (
    WeightOnlyQuantizer, XNNPACKQuantizer, get_symmetric_quantization_config,
)
from kiln.passes.quant.x86 import X86InductorQuantizer, get_default_x86_inductor_quantization_config

__all__ = [
    "convert_pt2e", "prepare_pt2e", "PreparedProgram", "HistogramObserver", "MinMaxObserver",
    "MovingAverageMinMaxObserver", "ObserverBase", "PerChannelMinMaxObserver", "PlaceholderObserver", "QScheme",
    "UniformQuantizationObserverBase", "per_channel_affine", "per_channel_symmetric", "per_tensor_affine",
    "per_tensor_symmetric", "QuantizationAnnotation", "QuantizationConfig", "QuantizationSpec", "Quantizer",
    "SharedQuantizationSpec", "annotate", "annotation_of", "X86InductorQuantizer",
    "get_default_x86_inductor_quantization_config", "PerGroupMinMaxObserver", "WeightOnlyQuantizer",
    "XNNPACKQuantizer", "get_symmetric_quantization_config", "LayerError", "QuantizationReport", "report",
    "calibrate", "CALIBRATION_BACKENDS", "DerivedQuantizationSpec", "Int32Bias",
]


CALIBRATION_BACKENDS = ("interpreter", "c")


def calibrate(prepared: PreparedProgram, batches: Iterable[Sequence[Any]], backend: str = "interpreter",
              progress: Callable[[int], None] | None = None) -> None:
    """Run `prepared` on each batch (a tuple of arguments) and feed its observers.

    backend="c" compiles the float program once, with every observed value as an extra output, and runs the
    batches in C: the way to calibrate GPT-2-sized models (the interpreter computes matmuls in float64). The
    observers see the C kernels' float32 results, which differ from the interpreter's in the last bits."""
    if backend not in CALIBRATION_BACKENDS:
        from kiln.ir.errors import KilnError
        raise KilnError(f"unknown calibration backend {backend!r}", fix=f"use one of {', '.join(CALIBRATION_BACKENDS)}")
    run = prepared if backend == "interpreter" else _compiled_observing(prepared)
    for index, args in enumerate(batches):
        run(*(tuple(args) if isinstance(args, (tuple, list)) else (args,)))
        if progress is not None:
            progress(index + 1)


def _compiled_observing(prepared: PreparedProgram) -> Callable[..., Any]:
    """A C build of the prepared program that returns the observed values after its outputs, and a runner that
    feeds them (and the observed inputs and weights) to the observers. A value a loop body reads as an invariant
    operand is observed as the top-level value it stands for; one computed inside a body cannot be returned."""
    from xdsl.ir import Operation

    from kiln.ir.control_flow import outermost_source
    from kiln.ir.errors import KilnError, UnsupportedError
    from kiln.ir.program import InputKind, OutputKind, OutputSpec
    from kiln.passes.base import weight_value
    from kiln.compiler import compile as compile_c

    program = prepared.program
    sources = {value: outermost_source(value) for value in prepared.watched_values()}  # watched -> top-level value
    if any((s.owner.parent_block() if isinstance(s.owner, Operation) else s.owner) is not program.body
           for s in sources.values()):
        raise UnsupportedError("calibrating in C cannot observe values inside loop bodies (a C build returns only "
                               "the top level's values)", fix="calibrate with backend='interpreter'")
    computed = list(dict.fromkeys(s for s in sources.values() if isinstance(s.owner, Operation)))
    returned = program.body.last_op
    outputs, specs, out_spec = list(returned.operands), list(program.graph_signature.output_specs), program.out_spec
    if any(spec.kind is not OutputKind.USER_OUTPUT for spec in specs):
        raise KilnError("calibrating in C needs a program without buffer mutations",
                        fix="calibrate with backend='interpreter'")
    try:  # the observed values become extra outputs for the build only
        returned.operands = outputs + computed
        program.graph_signature.output_specs = specs + [OutputSpec(OutputKind.USER_OUTPUT, f"observed_{i}")
                                                        for i in range(len(computed))]
        program.out_spec = None
        program.graph.update_function_type()
        package = compile_c(program)
    finally:
        returned.operands = outputs
        program.graph_signature.output_specs = specs
        program.out_spec = out_spec
        program.graph.update_function_type()
    user_inputs = [arg for arg, spec in zip(program.body.args, program.graph_signature.input_specs)
                   if spec.kind is InputKind.USER_INPUT]
    # Weights do not change between batches: they are observed once (torch's observers see them every call, which
    # changes nothing for the min/max observers weights use).
    for value, source in sources.items():
        array = None if source in computed or source in user_inputs else weight_value(program, source)
        if array is not None:
            prepared.observe(value, array)

    def run(*args: Any) -> None:
        results = package(*args)
        results = results if isinstance(results, tuple) else (results,)
        arrays = dict(zip(computed, results[len(outputs):]))
        arrays.update(zip(user_inputs, args))
        for value, source in sources.items():
            if source in arrays:
                prepared.observe(value, arrays[source])
    return run


# ---------------------------------------------------------------------------------------------
# Quantization-aware training: the fake-quantize modules of torch.ao.quantization.fake_quantize and
# _learnable_fake_quantize. Each keeps a numpy observer as `activation_post_process` and fake-quantizes through the
# aten ops (kiln.ops.aten.fake_quantize_*), so kiln's autograd records them like any op: the gradient passes straight
# through where the value was in range, and the learnable module's scale and zero point get torch's gradients.

_aten = _ops.aten
_F32 = np.float32


def _bound_keywords(constructor: Any) -> dict[str, Any]:
    """The keywords `with_args` bound on an observer constructor (torch reads `observer.p.keywords`)."""
    factory = constructor.factory if isinstance(constructor, PartialConstructor) else constructor
    return dict(factory.keywords) if isinstance(factory, functools.partial) else {}


def _check_quant_range(quant_min: int, quant_max: int, dtype: Any) -> None:
    info = np.iinfo(dtypes.dtype(dtype).numpy)
    if quant_min < info.min or quant_max > info.max:
        raise KilnError(f"quant range [{quant_min}, {quant_max}] is out of bounds for {dtypes.dtype(dtype).name} "
                        f"[{info.min}, {info.max}]", fix="choose quant_min/quant_max within the dtype's range")


def _enabled(flag: Tensor) -> bool:
    return bool(flag.numpy()[0])


def _overwrite(buffer: Tensor, values: Any) -> None:
    """`buffer.resize_(values.shape).copy_(values)`: the new values in the buffer's own dtype, in place."""
    buffer.data = Tensor(np.array(np.asarray(values), dtype=buffer.numpy().dtype))


def _as_tensor(x: Any) -> tuple[Tensor, bool]:
    """Observer-style callers pass numpy arrays: they get a numpy array back."""
    return (x, False) if isinstance(x, Tensor) else (Tensor(np.asarray(x)), True)


class FakeQuantizeBase(Module):
    """Base of the fake-quantize modules: the `fake_quant_enabled` and `observer_enabled` flags (uint8 buffers,
    as torch's) and their switches."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("fake_quant_enabled", Tensor(np.array([1], np.uint8)))
        self.register_buffer("observer_enabled", Tensor(np.array([1], np.uint8)))

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def enable_fake_quant(self, enabled: bool = True) -> None:
        self.fake_quant_enabled[0] = 1 if enabled else 0

    def disable_fake_quant(self) -> None:
        self.enable_fake_quant(False)

    def enable_observer(self, enabled: bool = True) -> None:
        self.observer_enabled[0] = 1 if enabled else 0

    def disable_observer(self) -> None:
        self.enable_observer(False)

    @classmethod
    def with_args(cls, **kwargs: Any) -> PartialConstructor:
        """A constructor with `kwargs` bound; QuantizationSpec.make_observer adds dtype, range, qscheme, ch_axis."""
        return PartialConstructor(functools.partial(cls, **kwargs))


class FakeQuantize(FakeQuantizeBase):
    """`x_out = (clamp(round(x / scale + zero_point), quant_min, quant_max) - zero_point) * scale`, with scale and
    zero point from `activation_post_process` (an observer built from `observer` and the keyword arguments) while
    the observer is enabled. `calculate_qparams()` returns the observer's (numpy) qparams, so convert reads a
    FakeQuantize like an observer."""

    def __init__(self, observer: Any = MovingAverageMinMaxObserver, quant_min: int | None = None,
                 quant_max: int | None = None, is_dynamic: bool = False, **observer_kwargs: Any):
        super().__init__()
        if quant_min is not None and quant_max is not None:
            if quant_min > quant_max:
                raise KilnError(f"quant_min {quant_min} must be less than or equal to quant_max {quant_max}")
            dtype = _bound_keywords(observer).get("dtype", observer_kwargs.get("dtype", dtypes.uint8))
            _check_quant_range(quant_min, quant_max, dtype)
            observer_kwargs.update(quant_min=quant_min, quant_max=quant_max)
        observer_kwargs["is_dynamic"] = is_dynamic
        self.activation_post_process = observer(**observer_kwargs)
        self.quant_min = self.activation_post_process.quant_min
        self.quant_max = self.activation_post_process.quant_max
        self.is_dynamic = self.activation_post_process.is_dynamic
        self.register_buffer("scale", Tensor(np.array([1.0], _F32)))
        self.register_buffer("zero_point", Tensor(np.array([0], np.int32)))
        self.dtype: DType = self.activation_post_process.dtype
        self.qscheme: QScheme = self.activation_post_process.qscheme
        self.ch_axis: int = getattr(self.activation_post_process, "ch_axis", -1)
        self.is_per_channel = self.qscheme.is_per_channel

    @property
    def eps(self) -> float | None:
        """The observer's eps (what convert_pt2e reads for dynamic quantization)."""
        return getattr(self.activation_post_process, "eps", None)

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        return self.activation_post_process.calculate_qparams()

    def forward(self, X: Any) -> Any:
        X, as_array = _as_tensor(X)
        if _enabled(self.observer_enabled):
            self.activation_post_process(X.detach().numpy())
            scale, zero_point = self.calculate_qparams()
            _overwrite(self.scale, scale)
            _overwrite(self.zero_point, zero_point)
        if _enabled(self.fake_quant_enabled):
            X = self._fake_quantize(X)
        return X.numpy() if as_array else X

    def _fake_quantize(self, X: Tensor) -> Tensor:
        low, high = self.activation_post_process.quant_min, self.activation_post_process.quant_max
        if self.is_per_channel:
            return dispatch(_aten.fake_quantize_per_channel_affine.default, X, self.scale, self.zero_point,
                            self.ch_axis, low, high)
        return dispatch(_aten.fake_quantize_per_tensor_affine.tensor_qparams, X, self.scale, self.zero_point, low,
                        high)

    def extra_repr(self) -> str:
        return (f"fake_quant_enabled={self.fake_quant_enabled}, observer_enabled={self.observer_enabled}, "
                f"quant_min={self.activation_post_process.quant_min}, "
                f"quant_max={self.activation_post_process.quant_max}, dtype={self.dtype.name}, "
                f"qscheme={self.qscheme.value}, ch_axis={self.ch_axis}, scale={self.scale}, "
                f"zero_point={self.zero_point}")


class FixedQParamsFakeQuantize(FakeQuantize):
    """Fake quantization with the fixed qparams of a FixedQParamsObserver (per tensor only)."""

    def __init__(self, observer: Any):
        super().__init__(observer=observer)
        if type(self.activation_post_process) is not FixedQParamsObserver:
            raise KilnError(f"{type(self).__name__}'s observer must be a FixedQParamsObserver, got "
                            f"{type(self.activation_post_process).__name__}")
        self._observer_ctr = observer
        _overwrite(self.scale, self.activation_post_process.scale)
        _overwrite(self.zero_point, self.activation_post_process.zero_point)
        if self.qscheme.is_per_channel:
            raise KilnError("FixedQParamsFakeQuantize supports per-tensor quantization only")

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        return self.scale.numpy(), self.zero_point.numpy()


def _moving_average(running: Any, current: Any, averaging_constant: float) -> Any:
    """The fused op's update in float32: the batch statistic where the running one is still infinite, else the
    observers' moving average."""
    running, current = np.asarray(running, _F32), np.asarray(current, _F32)
    with np.errstate(invalid="ignore"):
        averaged = moving_average(running, current, averaging_constant)
    return np.where(np.isinf(running), current, averaged).astype(_F32)


class FusedMovingAvgObsFakeQuantize(FakeQuantize):
    """FakeQuantize with a moving-average min/max observer fused in, as torch's `fused_moving_avg_obs_fake_quant`
    computes it: the observer's running min/max are updated per batch, and the qparams come from fbgemm's
    ChooseQuantizationParams (not the observer's formula, which `calculate_qparams()` still uses). Written in
    Python over the fake-quantize ops (no fused op is needed for torch's bits)."""

    def __init__(self, observer: Any = MovingAverageMinMaxObserver, quant_min: int = 0, quant_max: int = 255,
                 **observer_kwargs: Any):
        super().__init__(observer, quant_min, quant_max, **observer_kwargs)
        if not isinstance(self.activation_post_process,
                          (MovingAverageMinMaxObserver, MovingAveragePerChannelMinMaxObserver)):
            raise KilnError("the fused observer + fake-quantize module works only with MovingAverageMinMaxObserver "
                            "or MovingAveragePerChannelMinMaxObserver",
                            fix="use FakeQuantize for other observers")
        self.register_buffer("fake_quant_enabled", Tensor(np.array([1], np.int64)))
        self.register_buffer("observer_enabled", Tensor(np.array([1], np.int64)))
        self.is_symmetric_quant = self.qscheme.is_symmetric

    def forward(self, X: Any) -> Any:
        X, as_array = _as_tensor(X)
        if X.numel() == 0:
            return X.numpy() if as_array else X
        observer = self.activation_post_process
        observe = _enabled(self.observer_enabled)
        if self.is_per_channel:
            channels = X.shape[self.ch_axis]
            if observer.min_val.size == 0:  # the running statistics (and qparams) get one entry per channel
                observer.min_val, observer.max_val = np.full(channels, np.inf, _F32), np.full(channels, -np.inf, _F32)
                _overwrite(self.scale, np.ones(channels, _F32))
                _overwrite(self.zero_point, np.zeros(channels, np.int32))
            if observe:
                if self.ch_axis != 0:
                    raise KilnError("per-channel fused fake quantization observes axis 0 only, got ch_axis "
                                    f"{self.ch_axis}", fix="use FakeQuantize with a per-channel observer")
                self._update(*observer.channel_extrema(X.detach().numpy()))
        elif observe:
            values = X.detach().numpy().astype(_F32, copy=False)
            self._update(values.min(), values.max())
        if not _enabled(self.fake_quant_enabled):
            return X.numpy() if as_array else X
        low, high = observer.quant_min, observer.quant_max
        qparams = [fbgemm_qparams(lo, hi, low, high, self.is_symmetric_quant)
                   for lo, hi in zip(np.atleast_1d(observer.min_val), np.atleast_1d(observer.max_val))]
        _overwrite(self.scale, np.array([s for s, _ in qparams], _F32))
        _overwrite(self.zero_point, np.array([z for _, z in qparams], np.int32))
        X = self._fake_quantize(X)
        return X.numpy() if as_array else X

    def _update(self, current_min: Any, current_max: Any) -> None:
        observer = self.activation_post_process
        low = _moving_average(observer.min_val, current_min, observer.averaging_constant)
        high = _moving_average(observer.max_val, current_max, observer.averaging_constant)
        if not self.is_per_channel:
            low, high = _F32(low), _F32(high)
        observer.min_val, observer.max_val = low, high

    def extra_repr(self) -> str:
        return super().extra_repr() + f", reduce_range={self.activation_post_process.reduce_range}"


class _LearnableFakeQuantize(FakeQuantizeBase):
    """Fake quantization whose scale and zero point are Parameters (torch.ao.quantization._learnable_fake_quantize):
    estimated by the observer while `static_enabled`, learned by backpropagation after `enable_param_learning()`
    (with `use_grad_scaling`, their gradients are scaled by 1 / sqrt(numel * quant_max))."""

    def __init__(self, observer: Any, quant_min: int = 0, quant_max: int = 255, scale: float = 1.0,
                 zero_point: float = 0.0, channel_len: int = -1, use_grad_scaling: bool = False,
                 **observer_kwargs: Any):
        super().__init__()
        if quant_min >= quant_max:
            raise KilnError(f"quant_min {quant_min} must be strictly less than quant_max {quant_max}")
        self.quant_min, self.quant_max = quant_min, quant_max
        observer_kwargs.update(quant_min=quant_min, quant_max=quant_max)
        self.use_grad_scaling = use_grad_scaling
        if channel_len == -1:
            self.scale = Parameter(np.array([scale], _F32))
            self.zero_point = Parameter(np.array([zero_point], _F32))
        else:
            if not (isinstance(channel_len, int) and channel_len > 0):
                raise KilnError(f"channel_len must be a positive integer, got {channel_len!r}")
            self.scale = Parameter(np.full(channel_len, scale, _F32))
            self.zero_point = Parameter(np.full(channel_len, zero_point, _F32))
        self.activation_post_process = observer(**observer_kwargs)
        _check_quant_range(quant_min, quant_max, self.activation_post_process.dtype)
        self.dtype: DType = self.activation_post_process.dtype
        self.qscheme: QScheme = self.activation_post_process.qscheme
        self.ch_axis: int = getattr(self.activation_post_process, "ch_axis", -1)
        self.register_buffer("static_enabled", Tensor(np.array([1], np.uint8)))
        self.register_buffer("learning_enabled", Tensor(np.array([0], np.uint8)))
        self.bitwidth = int(math.log2(quant_max - quant_min + 1))
        self.register_buffer("eps", Tensor(np.array([np.finfo(_F32).eps], _F32)))

    def enable_param_learning(self) -> "_LearnableFakeQuantize":
        """Learn the qparams: no more observer estimates; the forward fake-quantizes."""
        self.toggle_qparam_learning(enabled=True).toggle_fake_quant(enabled=True).toggle_observer_update(False)
        return self

    def enable_static_estimate(self) -> None:
        """Observer estimates of the qparams, no learning; the forward fake-quantizes."""
        self.toggle_qparam_learning(enabled=False).toggle_fake_quant(enabled=True).toggle_observer_update(True)

    def enable_static_observation(self) -> None:
        """Observe without updating the qparams' use; the forward returns its input."""
        self.toggle_qparam_learning(enabled=False).toggle_fake_quant(enabled=False).toggle_observer_update(True)

    def toggle_observer_update(self, enabled: bool = True) -> "_LearnableFakeQuantize":
        self.static_enabled[0] = int(enabled)
        return self

    def enable_observer(self, enabled: bool = True) -> None:
        self.toggle_observer_update(enabled)

    def toggle_qparam_learning(self, enabled: bool = True) -> "_LearnableFakeQuantize":
        self.learning_enabled[0] = int(enabled)
        self.scale.requires_grad = enabled
        self.zero_point.requires_grad = enabled
        return self

    def toggle_fake_quant(self, enabled: bool = True) -> "_LearnableFakeQuantize":
        self.fake_quant_enabled[0] = int(enabled)
        return self

    def observe_quant_params(self) -> None:
        print(f"_LearnableFakeQuantize Scale: {self.scale.detach()}")
        print(f"_LearnableFakeQuantize Zero Point: {self.zero_point.detach()}")

    def _clamp_scale(self) -> None:
        self.scale.data = Tensor(np.maximum(self.scale.numpy(), self.eps.numpy()[0]))

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        """The scale (clamped to eps, in place) and the zero point rounded half to even into the range (int64)."""
        self._clamp_scale()
        zero_point = np.clip(np.round(self.zero_point.numpy()), self.quant_min, self.quant_max).astype(np.int64)
        return self.scale.numpy().copy(), zero_point

    def forward(self, X: Any) -> Any:
        X, as_array = _as_tensor(X)
        if _enabled(self.static_enabled):
            self.activation_post_process(X.detach().numpy())
            scale, zero_point = self.activation_post_process.calculate_qparams()
            shape = tuple(self.scale.shape)
            self.scale.data = Tensor(np.broadcast_to(np.asarray(scale, _F32), shape).copy())
            self.zero_point.data = Tensor(np.broadcast_to(np.asarray(zero_point).astype(_F32), shape).copy())
        else:
            self._clamp_scale()
        if _enabled(self.fake_quant_enabled):
            if self.qscheme.is_symmetric:
                self.zero_point.data = Tensor(np.zeros(tuple(self.zero_point.shape), _F32))
            grad_factor = 1.0 / (X.numel() * self.quant_max) ** 0.5 if self.use_grad_scaling else 1.0
            if self.qscheme.is_per_channel:
                X = dispatch(_aten._fake_quantize_learnable_per_channel_affine.default, X, self.scale,
                             self.zero_point, self.ch_axis, self.quant_min, self.quant_max, grad_factor)
            else:
                X = dispatch(_aten._fake_quantize_learnable_per_tensor_affine.default, X, self.scale,
                             self.zero_point, self.quant_min, self.quant_max, grad_factor)
        return X.numpy() if as_array else X


def _switch(method: str) -> Callable[[Module], None]:
    def switch(module: Module) -> None:
        for submodule in module.modules():
            if isinstance(submodule, FakeQuantizeBase):
                getattr(submodule, method)()
    switch.__name__ = method
    switch.__doc__ = (f"Call `{method}()` on `module` and every fake-quantize module inside it (torch's "
                      f"`model.apply(torch.ao.quantization.{method})`).")
    return switch


enable_fake_quant = _switch("enable_fake_quant")
disable_fake_quant = _switch("disable_fake_quant")
enable_observer = _switch("enable_observer")
disable_observer = _switch("disable_observer")

# torch's default fake-quantize constructors (torch.ao.quantization.fake_quantize)
default_fake_quant = FakeQuantize.with_args(observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                                            dtype=dtypes.uint8, qscheme=per_tensor_affine, reduce_range=True)
default_weight_fake_quant = FakeQuantize.with_args(observer=MovingAverageMinMaxObserver, quant_min=-128,
                                                   quant_max=127, dtype=dtypes.int8, qscheme=per_tensor_symmetric,
                                                   reduce_range=False)
default_per_channel_weight_fake_quant = FakeQuantize.with_args(
    observer=MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127, dtype=dtypes.int8,
    qscheme=per_channel_symmetric, reduce_range=False, ch_axis=0)
default_fused_act_fake_quant = FusedMovingAvgObsFakeQuantize.with_args(
    observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255, dtype=dtypes.uint8)
default_fused_wt_fake_quant = FusedMovingAvgObsFakeQuantize.with_args(
    observer=MovingAverageMinMaxObserver, quant_min=-128, quant_max=127, dtype=dtypes.int8,
    qscheme=per_tensor_symmetric)
default_fused_per_channel_wt_fake_quant = FusedMovingAvgObsFakeQuantize.with_args(
    observer=MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127, dtype=dtypes.int8,
    qscheme=per_channel_symmetric)

__all__ += [
    "FakeQuantizeBase", "FakeQuantize", "FixedQParamsFakeQuantize", "FusedMovingAvgObsFakeQuantize",
    "_LearnableFakeQuantize", "enable_fake_quant", "disable_fake_quant", "enable_observer", "disable_observer",
    "MovingAveragePerChannelMinMaxObserver", "FixedQParamsObserver", "default_fake_quant",
    "default_weight_fake_quant", "default_per_channel_weight_fake_quant", "default_fused_act_fake_quant",
    "default_fused_wt_fake_quant", "default_fused_per_channel_wt_fake_quant",
]

# QAT quantization configs (kiln/passes/quant/x86.py) build their specs from these classes by name: the quantizer
# layer sits below kiln.nn, so the classes register there when this module is imported.
from kiln.passes.quant.quantizer import FAKE_QUANTIZE_CLASSES  # noqa: E402

FAKE_QUANTIZE_CLASSES.update({cls.__name__: cls for cls in (
    FakeQuantize, FusedMovingAvgObsFakeQuantize, FixedQParamsFakeQuantize, _LearnableFakeQuantize)})


# ---------------------------------------------------------------------------------------------
# Quantization-aware training (torch.ao's prepare_qat_pt2e)

class QATModule(ProgramModule):
    """A program prepared for quantization-aware training: the program as a trainable module, with a fake quantizer
    on every value (or use of a value) the quantizer annotated. Train it like the model, then `convert_pt2e`."""

    def __init__(self, prepared: PreparedProgram):
        super().__init__(prepared.program)
        object.__setattr__(self, "prepared", prepared)
        names = {}
        for edge_or_node, group in prepared.groups.items():
            fake_quantize = prepared.observers[group]
            if fake_quantize is None:  # a derived spec (an int32 bias): its qparams follow from others' at convert
                continue
            name = names.setdefault(group, f"activation_post_process_{len(names)}")
            if isinstance(edge_or_node, tuple):
                value, user = edge_or_node
                if prepared.groups.get(value) == group:
                    continue  # the value is fake-quantized already, for every use
                self.transform_edge(value, user, name, fake_quantize)
            else:
                self.transform_value(edge_or_node, name, fake_quantize)


def prepare_qat_pt2e(model: Any, quantizer: Quantizer) -> QATModule:
    """Annotate a copy of the exported `model` with `quantizer` (a QAT config: `is_qat=True`) and return it as a
    trainable module whose annotated values pass through fake quantizers (torch.ao's prepare_qat_pt2e)."""
    prepared = prepare_pt2e(model, quantizer, is_qat=True)
    for group, observer in prepared.observers.items():
        if observer is not None and not isinstance(observer, FakeQuantizeBase):
            raise KilnError(f"prepare_qat_pt2e needs fake quantizers, but the quantizer's config observes with "
                            f"{type(observer).__name__}", fix="use a QAT config, e.g. "
                            "get_default_x86_inductor_quantization_config(is_qat=True)")
    return QATModule(prepared)


def move_exported_model_to_eval(model: QATModule) -> QATModule:
    """Batch norm on running statistics and dropout off (torch.ao's move_exported_model_to_eval)."""
    return model.eval()


def move_exported_model_to_train(model: QATModule) -> QATModule:
    return model.train()


class _TrainedQParams:
    """What convert reads from an observer, for a trained fake quantizer: its observer's settings, and the qparams
    the fake quantizer applied last (its `scale` / `zero_point`; learned ones for _LearnableFakeQuantize).

    torch's convert asks the observer instead, whose formula differs from the fused fake quantizer's (fbgemm's) for
    symmetric ranges narrower than 8 bits: [-2, 1] gives scales max|w| and max|w| / 1.5, so the converted weights
    would not be the ones the model trained with. kiln converts with the qparams training used."""

    def __init__(self, fake_quantize: Any):
        self._fake_quantize = fake_quantize
        self._observer = fake_quantize.activation_post_process

    def __getattr__(self, name: str) -> Any:
        return getattr(self._observer, name)

    def __call__(self, x: Any) -> Any:
        return self._observer(x)

    def calculate_qparams(self) -> tuple[np.ndarray, np.ndarray]:
        scale = np.asarray(self._fake_quantize.scale.detach().numpy(), np.float32).reshape(-1)
        zero_point = np.asarray(self._fake_quantize.zero_point.detach().numpy()).reshape(-1)
        return scale, np.round(zero_point).astype(np.int64)


def _to_inference(module: QATModule) -> None:
    """Rewrite the prepared program into its inference form before converting, as torch's convert does after
    move_exported_model_to_eval: batch norm exported in training mode reads its running statistics (and stops
    updating them: those buffer updates leave the outputs), dropout is the identity."""
    from xdsl.rewriter import InsertPoint, Rewriter

    from kiln.passes.base import erase_dead_program_ops
    from kiln.passes.quant.convert import _InsertAt

    program = module.prepared.program
    arguments = {spec.target: arg for arg, spec in zip(program.body.args, program.graph_signature.input_specs)
                 if spec.target is not None}
    replaced: dict[Any, Any] = {}
    for op in list(program.body.ops):
        name = getattr(getattr(op, "opdef", None), "name", None)
        if name == "aten.batch_norm.default" and op.operands and bound_arguments(op)[5]:
            values = bound_arguments(op)
            if values[3] is None:  # kiln's export: the statistics' update follows as separate ops
                mean, variance = running_statistic_targets(program, op)
                values[3], values[4] = arguments[mean], arguments[variance]
            values[5] = False
            builder = _InsertAt(program, InsertPoint.before(op))
            with builder:
                new = _ops.aten.batch_norm.default(*values)
        elif name in ("aten.dropout.default", "aten.native_dropout.default") and bound_arguments(op)[2]:
            new = op.operands[0]
        else:
            continue
        op.results[0].replace_all_uses_with(new)
        replaced[op.results[0]] = new
        if name == "aten.native_dropout.default" and op.results[1].uses:
            raise KilnError("a dropout mask is used after dropout", fix="export the model in eval mode")
        Rewriter.erase_op(op)
    module.prepared.rename(Renaming(replaced))
    returned = program.body.last_op
    kept = [(value, spec) for value, spec in zip(returned.operands, program.graph_signature.output_specs)
            if spec.kind is not OutputKind.BUFFER_MUTATION]
    returned.operands = [value for value, _ in kept]
    program.graph_signature.output_specs = [spec for _, spec in kept]
    program.graph.update_function_type()
    erase_dead_program_ops(program)


def convert_pt2e(prepared: Any) -> ExportedProgram:
    """The reference quantized program (quantize/dequantize around float ops) from a calibrated PreparedProgram or
    a trained QATModule, whose trained weights it quantizes (torch.ao's convert_pt2e)."""
    if isinstance(prepared, QATModule):
        calibrated = prepared.prepared
        calibrated.program.state_dict = prepared.current_state()
        _to_inference(prepared)
        fold_conv_bn_qat(calibrated)
        observers = {group: None if fq is None else _TrainedQParams(fq) for group, fq in calibrated.observers.items()}
        trained = PreparedProgram(calibrated.program, calibrated.groups, calibrated.specs, observers)
        trained._seen = {id(o) for o in observers.values() if o is not None}
        calibrated.converted = True
        return _convert_pt2e(trained)
    return _convert_pt2e(prepared)


__all__ += ["QATModule", "prepare_qat_pt2e", "move_exported_model_to_eval", "move_exported_model_to_train"]

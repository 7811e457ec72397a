"""kiln.nn.init: torch.nn.init's initializers, with torch's formulas, fan conventions and errors.

Every function fills an eager kiln Tensor in place and returns it. Random values come from kiln's
generator (`kiln.manual_seed` seeds it): the distributions match torch's, the bit streams do not. The
`generator=` arguments are accepted for torch's signatures and ignored.
Initialization is eager-only: it runs when a module is built, never inside a traced forward.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from kiln.frontend.autograd import no_grad
from kiln.frontend.tensor import Tensor
from kiln.ir.errors import KilnError

__all__ = [
    "calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
    "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_",
    "uniform", "normal", "constant", "eye", "dirac", "xavier_uniform", "xavier_normal", "kaiming_uniform",
    "kaiming_normal", "orthogonal", "sparse",
]


class InitError(KilnError, ValueError):
    """An initializer argument torch rejects with ValueError (wrong rank, unknown mode or nonlinearity)."""


_LINEAR_FNS = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")


def calculate_gain(nonlinearity: str, param: int | float | None = None) -> float:
    """The recommended gain for `nonlinearity` (torch.nn.init.calculate_gain)."""
    if nonlinearity in _LINEAR_FNS or nonlinearity == "sigmoid":
        return 1
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            negative_slope: float = 0.01
        elif (not isinstance(param, bool) and isinstance(param, int)) or isinstance(param, float):
            negative_slope = param
        else:
            raise InitError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + negative_slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4  # torch's empirical value (pytorch/pytorch#50664)
    raise InitError(f"Unsupported nonlinearity {nonlinearity}",
                    fix="use one of linear, conv1d/2d/3d, conv_transpose1d/2d/3d, sigmoid, tanh, relu, "
                        "leaky_relu, selu")


def _eager(tensor: Any, what: str) -> Tensor:
    if not isinstance(tensor, Tensor):
        raise KilnError(f"{what} expects a kiln.Tensor, got {type(tensor).__name__}")
    if tensor.is_traced:
        raise KilnError(f"{what} cannot run while tracing: initializers fill eager tensors",
                        fix="initialize parameters in __init__ (or before kiln.export), not in forward")
    return tensor


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0, generator: Any = None) -> Tensor:
    """Fill with values drawn from U(a, b)."""
    return _eager(tensor, "uniform_").uniform_(a, b)


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, generator: Any = None) -> Tensor:
    """Fill with values drawn from N(mean, std²)."""
    return _eager(tensor, "normal_").normal_(mean, std)


def trunc_normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                  generator: Any = None) -> Tensor:
    """Fill with N(mean, std²) truncated to [a, b], by rejection sampling like torch 2.13.

    When [a, b] holds more than 30% of the mass, normal draws outside it are redrawn; otherwise
    uniform proposals on [a, b] are accepted with probability pdf(x) / pdf(mode).
    """
    from kiln.frontend.functions import where
    _eager(tensor, "trunc_normal_")

    def norm_cdf(x: float) -> float:
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    if mean < a - 2 * std or mean > b + 2 * std:
        warnings.warn("mean is more than 2 std from [a, b] in nn.init.trunc_normal_. "
                      "The distribution of values may be incorrect.", stacklevel=2)
    mass = norm_cdf((b - mean) / std) - norm_cdf((a - mean) / std)
    if mass > 0.3:
        # Compare against the bounds as the tensor's dtype represents them, like torch.
        low = tensor.new_tensor(a).item()
        high = tensor.new_tensor(b).item()
        result = tensor.clone().normal_(mean, std)
        while True:
            rejected = result.lt(low) | result.gt(high)
            if not rejected.any().item():
                break
            result = where(rejected, result.clone().normal_(mean, std), result)
        return tensor.copy_(result)

    mode = max(a, min(mean, b))
    log_peak = -0.5 * ((mode - mean) / std) ** 2

    def log_density_ratio(x: Tensor) -> Tensor:
        return ((x - mean) / std).pow(2) * -0.5 - log_peak

    result = tensor.clone().uniform_(a, b)
    pending = tensor.clone().uniform_(0.0, 1.0).log().gt(log_density_ratio(result))
    while pending.any().item():
        candidates = tensor.clone().uniform_(a, b)
        result = where(pending, candidates, result)
        rejected_now = tensor.clone().uniform_(0.0, 1.0).log().gt(log_density_ratio(candidates))
        pending = pending & rejected_now
    return tensor.copy_(result)


def constant_(tensor: Tensor, val: float) -> Tensor:
    """Fill with `val`."""
    return _eager(tensor, "constant_").fill_(val)


def ones_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 1.0)


def zeros_(tensor: Tensor) -> Tensor:
    return _eager(tensor, "zeros_").zero_()


def eye_(tensor: Tensor) -> Tensor:
    """Fill a 2-D tensor with the identity matrix (ones on the main diagonal of a rectangle too)."""
    from kiln.frontend.functions import arange
    _eager(tensor, "eye_")
    if tensor.dim() != 2:
        raise InitError("Only tensors with 2 dimensions are supported")
    rows, cols = tensor.shape
    identity = arange(rows).unsqueeze(1).eq(arange(cols).unsqueeze(0))
    return tensor._assign(identity.to(tensor.dtype))


def dirac_(tensor: Tensor, groups: int = 1) -> Tensor:
    """Fill a 3/4/5-D conv weight with the Dirac delta: each group's output channel d copies input channel d."""
    from kiln.frontend.functions import arange
    _eager(tensor, "dirac_")
    dimensions = tensor.dim()
    if dimensions not in (3, 4, 5):
        raise InitError("Only tensors with 3, 4, or 5 dimensions are supported")
    sizes = tensor.shape
    if sizes[0] % groups != 0:
        raise InitError("dim 0 must be divisible by groups")
    out_channels_per_group = sizes[0] // groups
    min_dim = min(out_channels_per_group, sizes[1])
    tensor.zero_()
    within_group = arange(min_dim)
    centers = tuple(size // 2 for size in sizes[2:])
    for group in range(groups):
        tensor[(within_group + group * out_channels_per_group, within_group, *centers)] = 1
    return tensor


def _calculate_fan_in_and_fan_out(tensor: Tensor) -> tuple[int, int]:
    """(fan_in, fan_out): dims 1 and 0 times the receptive field (the product of dims 2...)."""
    dimensions = tensor.dim()
    if dimensions < 2:
        raise InitError("Fan in and fan out can not be computed for tensor with fewer than 2 dimensions")
    num_input_fmaps = tensor.size(1)
    num_output_fmaps = tensor.size(0)
    receptive_field_size = 1
    for size in tensor.shape[2:]:
        receptive_field_size *= size
    return num_input_fmaps * receptive_field_size, num_output_fmaps * receptive_field_size


def _calculate_correct_fan(tensor: Tensor, mode: str) -> int:
    mode = mode.lower()
    valid_modes = ["fan_in", "fan_out"]
    if mode not in valid_modes:
        raise InitError(f"Mode {mode} not supported, please use one of {valid_modes}")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def xavier_uniform_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio, 2010)."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    bound = math.sqrt(3.0) * std  # the uniform bound with that standard deviation
    return uniform_(tensor, -bound, bound)


def xavier_normal_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """N(0, std²) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return normal_(tensor, 0.0, std)


def _has_zero_dim(tensor: Tensor) -> bool:
    if 0 in tuple(tensor.shape):
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=3)
        return True
    return False


def _kaiming_std(tensor: Tensor, a: float, mode: str, nonlinearity: str) -> float:
    return calculate_gain(nonlinearity, a) / math.sqrt(_calculate_correct_fan(tensor, mode))


def kaiming_uniform_(tensor: Tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                     generator: Any = None) -> Tensor:
    """U(-bound, bound) with bound = gain * sqrt(3 / fan) (He et al., 2015)."""
    _eager(tensor, "kaiming_uniform_")
    if _has_zero_dim(tensor):
        return tensor
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity)
    return tensor.uniform_(-bound, bound)


def kaiming_normal_(tensor: Tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                    generator: Any = None) -> Tensor:
    """N(0, std²) with std = gain / sqrt(fan)."""
    _eager(tensor, "kaiming_normal_")
    if _has_zero_dim(tensor):
        return tensor
    return tensor.normal_(0, _kaiming_std(tensor, a, mode, nonlinearity))


def _orthonormal_columns(matrix: Tensor) -> Tensor:
    """Q of the QR decomposition of a tall `matrix` whose R has a positive diagonal.

    That is the Q torch.nn.init.orthogonal_ gets after its sign correction (q *= sign(diag(r))). Computed
    by Gram-Schmidt with a second orthogonalization pass (enough for float64 accuracy), in float64.
    """
    from kiln.frontend.functions import cat
    work = matrix.double()
    first = work[:, 0:1]
    basis = first / first.norm()
    for index in range(1, work.shape[1]):
        vector = work[:, index:index + 1]
        for _ in range(2):
            vector = vector - basis.matmul(basis.t().matmul(vector))
        basis = cat([basis, vector / vector.norm()], 1)
    return basis


def orthogonal_(tensor: Tensor, gain: float = 1, generator: Any = None) -> Tensor:
    """Fill with a (semi-)orthogonal matrix from the QR of a Gaussian matrix (Saxe et al., 2013), times gain.

    Trailing dims are flattened: a (rows, ...) tensor is treated as (rows, numel / rows).
    """
    from kiln.frontend.functions import zeros
    _eager(tensor, "orthogonal_")
    if tensor.dim() < 2:
        raise InitError("Only tensors with 2 or more dimensions are supported")
    if tensor.numel() == 0:
        return tensor
    rows = tensor.size(0)
    cols = tensor.numel() // rows
    flattened = zeros(rows, cols, dtype=tensor.dtype).normal_(0, 1)
    if rows < cols:
        flattened = flattened.t()
    q = _orthonormal_columns(flattened)
    if rows < cols:
        q = q.t()
    return tensor._assign((q * gain).reshape(list(tensor.shape)))


def sparse_(tensor: Tensor, sparsity: float, std: float = 0.01, generator: Any = None) -> Tensor:
    """N(0, std²) with ceil(sparsity * rows) entries of every column set to zero (Martens, 2010)."""
    from kiln.frontend.functions import randperm
    _eager(tensor, "sparse_")
    if tensor.dim() != 2:
        raise InitError("Only tensors with 2 dimensions are supported")
    rows, cols = tensor.shape
    num_zeros = math.ceil(sparsity * rows)
    tensor.normal_(0, std)
    for column in range(cols):
        zero_rows = randperm(rows)[:num_zeros]
        tensor[zero_rows, column] = 0
    return tensor


# torch's initializers fill parameters under no_grad: initialization is not part of any autograd graph.
for _name in ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
              "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_"):
    globals()[_name] = no_grad()(globals()[_name])


def _deprecated(method: Any) -> Any:
    new_name = method.__name__
    old_name = new_name[:-1]

    def deprecated_init(*args: Any, **kwargs: Any) -> Any:
        warnings.warn(f"`nn.init.{old_name}` is now deprecated in favor of `nn.init.{new_name}`.",
                      FutureWarning, stacklevel=2)
        return method(*args, **kwargs)
    deprecated_init.__name__ = old_name
    return deprecated_init


uniform = _deprecated(uniform_)
normal = _deprecated(normal_)
constant = _deprecated(constant_)
eye = _deprecated(eye_)
dirac = _deprecated(dirac_)
xavier_uniform = _deprecated(xavier_uniform_)
xavier_normal = _deprecated(xavier_normal_)
kaiming_uniform = _deprecated(kaiming_uniform_)
kaiming_normal = _deprecated(kaiming_normal_)
orthogonal = _deprecated(orthogonal_)
sparse = _deprecated(sparse_)

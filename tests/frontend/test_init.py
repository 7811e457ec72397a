"""kiln.nn.init against torch.nn.init: formulas and fans exactly, distributions statistically, structure exactly.

Statistical checks use 6-sigma bounds from the sampling distribution of the mean and of the variance
(Var(s²) ≈ (μ4 - σ⁴) / n), so a correct initializer fails them with probability below 1e-8.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import kiln
from kiln.nn import init

torch = pytest.importorskip("torch")

N_SIGMA = 6.0


def _fill(shape: tuple[int, ...], fn, *args, dtype=kiln.float32, **kwargs) -> np.ndarray:
    tensor = kiln.zeros(*shape, dtype=dtype)
    returned = fn(tensor, *args, **kwargs)
    assert returned is tensor
    return tensor.numpy().astype(np.float64)


def _assert_moments(values: np.ndarray, mean: float, std: float, fourth_moment_ratio: float) -> None:
    """Sample mean and variance agree with (mean, std²); fourth_moment_ratio is μ4 / σ⁴ (3 normal, 1.8 uniform)."""
    values = values.ravel()
    n = values.size
    assert abs(values.mean() - mean) <= N_SIGMA * std / math.sqrt(n), (values.mean(), mean)
    variance_sd = std ** 2 * math.sqrt((fourth_moment_ratio - 1) / n)
    assert abs(values.var() - std ** 2) <= N_SIGMA * variance_sd, (values.std(), std)


# ---------------------------------------------------------------------------------------------
# Gains and fans


@pytest.mark.parametrize("nonlinearity, param", [
    ("linear", None), ("conv1d", None), ("conv2d", None), ("conv3d", None), ("conv_transpose1d", None),
    ("conv_transpose2d", None), ("conv_transpose3d", None), ("sigmoid", None), ("tanh", None), ("relu", None),
    ("leaky_relu", None), ("leaky_relu", 0.2), ("leaky_relu", 0), ("leaky_relu", 1), ("leaky_relu", math.sqrt(5)),
    ("selu", None),
])
def test_calculate_gain_matches_torch(nonlinearity, param):
    assert init.calculate_gain(nonlinearity, param) == torch.nn.init.calculate_gain(nonlinearity, param)


@pytest.mark.parametrize("nonlinearity, param", [("swish", None), ("leaky_relu", "0.1"), ("leaky_relu", True)])
def test_calculate_gain_rejects_like_torch(nonlinearity, param):
    with pytest.raises(ValueError):
        torch.nn.init.calculate_gain(nonlinearity, param)
    with pytest.raises(kiln.KilnError):
        init.calculate_gain(nonlinearity, param)
    with pytest.raises(ValueError):
        init.calculate_gain(nonlinearity, param)


@pytest.mark.parametrize("shape", [(3, 4), (8, 3, 5), (8, 3, 3, 3), (4, 2, 3, 5, 7), (5, 0)])
def test_fans_match_torch(shape):
    expected = torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))
    assert init._calculate_fan_in_and_fan_out(kiln.zeros(*shape)) == expected
    for mode in ("fan_in", "fan_out", "FAN_IN"):
        assert init._calculate_correct_fan(kiln.zeros(*shape), mode) == \
            torch.nn.init._calculate_correct_fan(torch.empty(shape), mode)


@pytest.mark.parametrize("shape", [(5,), ()])
def test_fans_of_low_rank_tensors_are_errors(shape):
    with pytest.raises(ValueError):
        torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))
    with pytest.raises(kiln.KilnError, match="fewer than 2 dimensions"):
        init._calculate_fan_in_and_fan_out(kiln.zeros(*shape))
    with pytest.raises(ValueError):
        init.xavier_uniform_(kiln.zeros(*shape))
    with pytest.raises(ValueError):
        init.kaiming_normal_(kiln.zeros(*shape))


def test_invalid_fan_mode():
    with pytest.raises(ValueError, match="Mode fan_avg not supported"):
        init.kaiming_uniform_(kiln.zeros(3, 4), mode="fan_avg")


# ---------------------------------------------------------------------------------------------
# Distributions


def test_uniform_bounds_and_moments():
    values = _fill((400, 500), init.uniform_, -2.0, 3.0)
    assert values.min() >= -2.0 and values.max() <= 3.0
    assert values.min() < -1.99 and values.max() > 2.99
    _assert_moments(values, 0.5, 5.0 / math.sqrt(12), 1.8)


def test_normal_moments():
    values = _fill((400, 500), init.normal_, 1.5, 0.25)
    _assert_moments(values, 1.5, 0.25, 3.0)


def test_default_arguments():
    _assert_moments(_fill((400, 500), init.uniform_), 0.5, 1 / math.sqrt(12), 1.8)
    _assert_moments(_fill((400, 500), init.normal_), 0.0, 1.0, 3.0)


@pytest.mark.parametrize("gain", [1.0, init.calculate_gain("relu")])
def test_xavier_uniform(gain):
    shape = (64, 32, 3, 3)
    fan_in, fan_out = 32 * 9, 64 * 9
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    values = _fill(shape, init.xavier_uniform_, gain=gain)
    assert np.abs(values).max() <= bound and np.abs(values).max() > 0.99 * bound
    _assert_moments(values, 0.0, bound / math.sqrt(3), 1.8)


def test_xavier_normal():
    shape = (300, 200)
    std = 0.5 * math.sqrt(2.0 / (300 + 200))
    _assert_moments(_fill(shape, init.xavier_normal_, gain=0.5), 0.0, std, 3.0)


@pytest.mark.parametrize("shape, a, mode, nonlinearity", [
    ((400, 300), math.sqrt(5), "fan_in", "leaky_relu"),   # Linear's and Conv's default
    ((128, 16, 3, 3), 0, "fan_out", "relu"),
    ((200, 600), 0.2, "fan_in", "leaky_relu"),
    ((200, 600), 0, "fan_in", "selu"),
])
def test_kaiming_uniform(shape, a, mode, nonlinearity):
    fan = init._calculate_correct_fan(kiln.zeros(*shape), mode)
    bound = math.sqrt(3.0) * torch.nn.init.calculate_gain(nonlinearity, a) / math.sqrt(fan)
    values = _fill(shape, init.kaiming_uniform_, a=a, mode=mode, nonlinearity=nonlinearity)
    assert np.abs(values).max() <= bound and np.abs(values).max() > 0.99 * bound
    _assert_moments(values, 0.0, bound / math.sqrt(3), 1.8)


def test_linear_default_bound_is_one_over_sqrt_fan_in():
    values = _fill((400, 300), init.kaiming_uniform_, a=math.sqrt(5))
    assert np.abs(values).max() <= 1 / math.sqrt(300)


@pytest.mark.parametrize("shape, a, mode, nonlinearity", [
    ((400, 300), 0, "fan_in", "relu"),
    ((64, 32, 3, 3), 0, "fan_out", "relu"),
    ((300, 400), 0.1, "fan_in", "leaky_relu"),
    ((300, 400), 0, "fan_in", "tanh"),
])
def test_kaiming_normal(shape, a, mode, nonlinearity):
    fan = init._calculate_correct_fan(kiln.zeros(*shape), mode)
    std = torch.nn.init.calculate_gain(nonlinearity, a) / math.sqrt(fan)
    _assert_moments(_fill(shape, init.kaiming_normal_, a=a, mode=mode, nonlinearity=nonlinearity), 0.0, std, 3.0)


@pytest.mark.parametrize("fn", [init.kaiming_uniform_, init.kaiming_normal_])
def test_kaiming_on_zero_element_tensor_warns_and_does_nothing(fn):
    tensor = kiln.zeros(0, 3)
    with pytest.warns(UserWarning, match="zero-element tensors is a no-op"):
        assert fn(tensor) is tensor
    assert tensor.shape == (0, 3)


def _truncated_normal_moments(mean: float, std: float, a: float, b: float) -> tuple[float, float, float]:
    """Mean, std and μ4/σ⁴ of N(mean, std²) truncated to [a, b], by numerical integration."""
    grid = np.linspace(a, b, 200_001)
    density = np.exp(-0.5 * ((grid - mean) / std) ** 2)
    density /= np.trapezoid(density, grid)
    m = np.trapezoid(grid * density, grid)
    var = np.trapezoid((grid - m) ** 2 * density, grid)
    mu4 = np.trapezoid((grid - m) ** 4 * density, grid)
    return float(m), math.sqrt(var), float(mu4 / var ** 2)


@pytest.mark.parametrize("mean, std, a, b", [
    (0.0, 1.0, -2.0, 2.0),     # most of the mass inside: normal draws, rejected ones redrawn
    (0.0, 0.02, -0.04, 0.04),  # ViT-style init
    (0.0, 1.0, 2.0, 3.0),      # a thin tail: uniform proposals with acceptance by density
    (1.0, 2.0, -1.0, 0.0),
])
def test_trunc_normal(mean, std, a, b):
    values = _fill((500, 400), init.trunc_normal_, mean, std, a, b)
    assert values.min() >= np.float32(a) and values.max() <= np.float32(b)
    expected_mean, expected_std, ratio = _truncated_normal_moments(mean, std, a, b)
    _assert_moments(values, expected_mean, expected_std, ratio)


def test_trunc_normal_warns_when_mean_is_far_outside():
    with pytest.warns(UserWarning, match="more than 2 std"):
        init.trunc_normal_(kiln.zeros(10), mean=10.0, std=1.0, a=-1.0, b=1.0)


def test_float64_and_float16_tensors_keep_their_dtype():
    for dtype in (kiln.float64, kiln.float16):
        tensor = kiln.zeros(20, 30, dtype=dtype)
        init.kaiming_uniform_(tensor)
        init.trunc_normal_(tensor, std=0.1)
        assert tensor.dtype is dtype


def test_manual_seed_makes_initialization_reproducible():
    kiln.manual_seed(123)
    first = _fill((10, 10), init.xavier_uniform_)
    kiln.manual_seed(123)
    assert np.array_equal(first, _fill((10, 10), init.xavier_uniform_))
    assert not np.array_equal(first, _fill((10, 10), init.xavier_uniform_))


# ---------------------------------------------------------------------------------------------
# Deterministic structure


def test_constant_ones_zeros():
    assert np.all(_fill((3, 4), init.constant_, 2.5) == 2.5)
    assert np.all(_fill((3, 4), init.ones_) == 1.0)
    tensor = kiln.ones(3, 4)
    assert init.zeros_(tensor) is tensor and np.all(tensor.numpy() == 0)


@pytest.mark.parametrize("shape", [(3, 5), (5, 3), (4, 4)])
def test_eye_matches_torch(shape):
    expected = torch.nn.init.eye_(torch.empty(shape)).numpy()
    assert np.array_equal(_fill(shape, init.eye_), expected)


def test_eye_needs_two_dims():
    with pytest.raises(ValueError, match="Only tensors with 2 dimensions"):
        init.eye_(kiln.zeros(2, 2, 2))


@pytest.mark.parametrize("shape, groups", [
    ((4, 2, 3), 1), ((2, 4, 5), 1), ((6, 4, 3, 3), 2), ((6, 2, 3, 4), 3), ((4, 4, 3, 3, 3), 1), ((8, 2, 1, 3), 4),
])
def test_dirac_matches_torch(shape, groups):
    expected = torch.nn.init.dirac_(torch.empty(shape), groups).numpy()
    assert np.array_equal(_fill(shape, init.dirac_, groups), expected)


def test_dirac_errors():
    with pytest.raises(ValueError, match="3, 4, or 5 dimensions"):
        init.dirac_(kiln.zeros(3, 3))
    with pytest.raises(ValueError, match="divisible by groups"):
        init.dirac_(kiln.zeros(5, 2, 3), groups=2)


@pytest.mark.parametrize("shape", [(300, 200), (200, 300), (3, 200), (6, 3, 2, 2), (16, 4, 3, 3), (1, 1)])
def test_orthogonal_rows_or_columns_are_orthonormal(shape):
    matrix = _fill(shape, init.orthogonal_).reshape(shape[0], -1)
    rows, cols = matrix.shape
    gram = matrix.T @ matrix if rows >= cols else matrix @ matrix.T
    np.testing.assert_allclose(gram, np.eye(min(rows, cols)), atol=2e-6)


def test_orthogonal_gain_and_errors():
    matrix = _fill((50, 40), init.orthogonal_, gain=3.0)
    np.testing.assert_allclose(matrix.T @ matrix, 9.0 * np.eye(40), atol=2e-5)
    with pytest.raises(ValueError, match="2 or more dimensions"):
        init.orthogonal_(kiln.zeros(5))


@pytest.mark.parametrize("shape", [(7, 4), (30, 30)])
def test_orthogonal_q_equals_torch_sign_corrected_qr(shape):
    """The Q kiln builds is exactly torch's q * sign(diag(r)) for the same Gaussian matrix."""
    matrix = np.random.default_rng(0).standard_normal(shape)
    q, r = torch.linalg.qr(torch.from_numpy(matrix))
    expected = q * torch.diag(r, 0).sign()
    actual = init._orthonormal_columns(kiln.tensor(matrix, dtype=kiln.float64)).numpy()
    torch.testing.assert_close(torch.from_numpy(actual), expected)


@pytest.mark.parametrize("rows, cols, sparsity", [(20, 50, 0.3), (10, 7, 0.95), (9, 4, 0.0), (5, 5, 1.0)])
def test_sparse_zeros_per_column(rows, cols, sparsity):
    values = _fill((rows, cols), init.sparse_, sparsity, std=0.01)
    zeros_per_column = (values == 0).sum(axis=0)
    assert np.all(zeros_per_column == math.ceil(sparsity * rows))


def test_sparse_nonzeros_are_normal():
    values = _fill((400, 500), init.sparse_, 0.25, std=0.05)
    assert np.all((values == 0).sum(axis=0) == 100)
    _assert_moments(values[values != 0], 0.0, 0.05, 3.0)


def test_sparse_needs_two_dims():
    with pytest.raises(ValueError, match="Only tensors with 2 dimensions"):
        init.sparse_(kiln.zeros(3, 3, 3), 0.5)


# ---------------------------------------------------------------------------------------------
# API surface


def test_every_torch_initializer_exists():
    public = [name for name in dir(torch.nn.init) if not name.startswith("_") and callable(getattr(torch.nn.init, name))
              and getattr(torch.nn.init, name).__module__ == "torch.nn.init"]
    missing = [name for name in public if not hasattr(init, name)]
    assert not missing


@pytest.mark.parametrize("old, new", [("uniform", "uniform_"), ("normal", "normal_"), ("xavier_uniform", None),
                                      ("kaiming_normal", None), ("constant", None)])
def test_deprecated_names_warn(old, new):
    tensor = kiln.zeros(4, 4)
    args = (1.0,) if old == "constant" else ()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        getattr(init, old)(tensor, *args)
    assert any(issubclass(w.category, FutureWarning) and f"nn.init.{old}`" in str(w.message) for w in caught)


def test_initializers_refuse_traced_tensors():
    class Module(kiln.nn.Module):
        def forward(self, x):
            init.normal_(x)
            return x

    with pytest.raises(kiln.KilnError, match="cannot run while tracing"):
        kiln.export(Module(), (kiln.zeros(2, 2),))

"""kiln's observers against torchao's on the same data: the qparams and the collected statistics bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import quantization as kq
from tests.quantization.support import TORCHAO, requires_torchao
from tests.torch_oracle import torch

pytestmark = requires_torchao


def _batches(kind: str, rng: np.random.Generator) -> list[np.ndarray]:
    """Calibration streams that exercise each update path: a range that grows (histograms re-binned), shrinks
    (histograms added), one-sided, heavy-tailed, constant, and with infinities."""
    if kind == "growing":
        return [rng.standard_normal((8, 64)).astype(np.float32) * (1 + i) for i in range(4)]
    if kind == "shrinking":
        return [rng.standard_normal((8, 64)).astype(np.float32) / (1 + i) for i in range(4)]
    if kind == "relu":
        return [np.maximum(rng.standard_normal((4, 128)) * 3, 0).astype(np.float32) for _ in range(3)]
    if kind == "heavy_tailed":
        return [rng.standard_t(2, (16, 64)).astype(np.float32) for _ in range(3)]
    if kind == "constant_then_spread":
        return [np.full((4, 4), 0.75, np.float32), rng.standard_normal((4, 16)).astype(np.float32)]
    if kind == "with_inf":
        first = rng.standard_normal((4, 32)).astype(np.float32)
        first[0, :3] = [np.inf, -np.inf, 5.0]
        return [first, rng.standard_normal((4, 32)).astype(np.float32) * 2]
    raise ValueError(kind)


KINDS = ["growing", "shrinking", "relu", "heavy_tailed", "constant_then_spread", "with_inf"]

# (observer, kiln kwargs, the same for torch)
PER_TENSOR = [
    ("HistogramObserver", {"eps": 2.0 ** -12}, {"eps": 2.0 ** -12}),
    ("HistogramObserver", {"dtype": kiln.int8, "qscheme": kq.per_tensor_symmetric},
     {"dtype": "int8", "qscheme": "per_tensor_symmetric"}),
    ("HistogramObserver", {"reduce_range": True}, {"reduce_range": True}),
    ("MinMaxObserver", {}, {}),
    ("MinMaxObserver", {"dtype": kiln.int8, "qscheme": kq.per_tensor_symmetric},
     {"dtype": "int8", "qscheme": "per_tensor_symmetric"}),
    ("MinMaxObserver", {"quant_min": 0, "quant_max": 127}, {"quant_min": 0, "quant_max": 127}),
    ("MovingAverageMinMaxObserver", {}, {}),
    ("MovingAverageMinMaxObserver", {"averaging_constant": 0.5}, {"averaging_constant": 0.5}),
]


def _torch_kwargs(kwargs: dict) -> dict:
    converted = dict(kwargs)
    if "dtype" in converted:
        converted["dtype"] = getattr(torch, converted["dtype"])
    if "qscheme" in converted:
        converted["qscheme"] = getattr(torch, converted["qscheme"])
    return converted


def _assert_same_qparams(kiln_observer, torch_observer, where: str) -> None:
    torch_scale, torch_zero = torch_observer.calculate_qparams()
    scale, zero = kiln_observer.calculate_qparams()
    assert scale.dtype == np.dtype(str(torch_scale.dtype).removeprefix("torch.")), where
    assert zero.dtype == np.dtype(str(torch_zero.dtype).removeprefix("torch.")), where
    np.testing.assert_array_equal(scale, torch_scale.numpy(), err_msg=where)
    np.testing.assert_array_equal(zero, torch_zero.numpy(), err_msg=where)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name,kiln_kwargs,torch_kwargs", PER_TENSOR,
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(PER_TENSOR)])
def test_per_tensor_observer_matches_torch(name, kiln_kwargs, torch_kwargs, kind):
    torch_observer = getattr(TORCHAO[0], name)(**_torch_kwargs(torch_kwargs))
    kiln_observer = getattr(kq, name)(**kiln_kwargs)
    if name == "HistogramObserver":  # torch's re-binning rounds per its vector width and thread split
        kiln_observer.vector_lanes = 16 if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else 8
        kiln_observer.threads = torch.get_num_threads()
    for batch in _batches(kind, np.random.default_rng(0)):
        torch_observer(torch.from_numpy(batch))
        kiln_observer(batch)
    where = f"{name}({kiln_kwargs}) on {kind}"
    try:
        torch_observer.calculate_qparams()
    except AssertionError:  # torch refuses the range (a moving average of infinities is NaN): so must kiln
        with pytest.raises(kiln.KilnError, match="empty or NaN"):
            kiln_observer.calculate_qparams()
        return
    np.testing.assert_array_equal(kiln_observer.min_val, torch_observer.min_val.numpy(), err_msg=where)
    np.testing.assert_array_equal(kiln_observer.max_val, torch_observer.max_val.numpy(), err_msg=where)
    if name == "HistogramObserver":
        np.testing.assert_array_equal(kiln_observer.histogram, torch_observer.histogram.numpy(), err_msg=where)
    _assert_same_qparams(kiln_observer, torch_observer, where)


@pytest.mark.parametrize("ch_axis", [0, 1])
@pytest.mark.parametrize("symmetric", [True, False])
def test_per_channel_observer_matches_torch(ch_axis, symmetric):
    rng = np.random.default_rng(1)
    qscheme = "per_channel_symmetric" if symmetric else "per_channel_affine"
    kwargs = {"ch_axis": ch_axis, "dtype": "int8", "qscheme": qscheme, "eps": 2.0 ** -12}
    torch_observer = TORCHAO[0].PerChannelMinMaxObserver(**_torch_kwargs(kwargs))
    kiln_observer = kq.PerChannelMinMaxObserver(**{**kwargs, "dtype": kiln.int8, "qscheme": getattr(kq, qscheme)})
    for scale in (1.0, 3.0, 0.5):
        batch = (rng.standard_normal((6, 5, 3, 3)) * scale).astype(np.float32)
        batch[2] = 0.0  # an all-zero channel: eps decides its scale
        torch_observer(torch.from_numpy(batch))
        kiln_observer(batch)
    _assert_same_qparams(kiln_observer, torch_observer, f"per-channel {qscheme} axis {ch_axis}")


def test_unobserved_observer_gives_torch_defaults():
    for name in ("MinMaxObserver", "HistogramObserver"):
        _assert_same_qparams(getattr(kq, name)(), getattr(TORCHAO[0], name)(), f"{name} before any data")


def test_observer_refuses_per_channel_scheme():
    with pytest.raises(kiln.KilnError, match="per-tensor"):
        kq.HistogramObserver(qscheme=kq.per_channel_symmetric)

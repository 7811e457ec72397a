"""torchao as the quantization oracle (tests only): its observers, quantizer and PT2E flow, imported quietly."""

from __future__ import annotations

import logging
import warnings

import pytest

from tests.torch_oracle import torch


def _import_torchao():
    if torch is None:
        return None
    logging.getLogger("torchao").setLevel(logging.ERROR)  # its CUDA extensions do not load on a CPU wheel
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import torchao.quantization.pt2e.observer as observers
            import torchao.quantization.pt2e.quantize_pt2e as flow
            import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as x86
        except ImportError:
            return None
    return observers, flow, x86


TORCHAO = _import_torchao()
requires_torchao = pytest.mark.skipif(TORCHAO is None, reason="torchao is not installed")

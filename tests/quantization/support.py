"""torchao as the quantization oracle (tests only): its observers, quantizer and PT2E flow, imported quietly."""

from __future__ import annotations

import logging
import warnings

import pytest

from kiln.ir.cpu import cpu_flags
from tests.torch_oracle import torch

# onnxruntime multiplies uint8 activations by int8 weights with vpmaddubsw on x86 CPUs without VNNI (AVX2 only, as
# on the AMD EPYC machines): its int16 pair sums saturate for full 8-bit activations, as onnxruntime documents
# ("try reduce_range or the U8U8 format"). Measured there: up to 3x the one-step bound off kiln's reference. Tests
# that use onnxruntime as the int8 oracle quantize activations to 7 bits on such CPUs, where no pair can saturate.
ORT_U8S8_SATURATES = bool(cpu_flags()) and not {"avx512_vnni", "avx_vnni"} & cpu_flags()


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

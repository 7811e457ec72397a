"""Every zoo model through PT2E static and dynamic quantization: quantized, accurate, and through .pt2 and ONNX."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import kiln
from kiln import quantization as kq
from tests.quantization.support import ORT_U8S8_SATURATES
from tests.quantization.test_pt2e import assert_quantized_close


def _arrays(args):
    return tuple(a.__kiln_array__() if hasattr(a, "__kiln_array__") else a for a in args)


@pytest.mark.parametrize("scheme", ["static", "dynamic"])
@pytest.mark.parametrize("name", sorted(kiln.models.MODELS))
def test_zoo_model_quantizes(name, scheme, tmp_path):
    entry = kiln.models.get(name)
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    config = kq.get_default_x86_inductor_quantization_config(is_dynamic=scheme == "dynamic",
                                                             reduce_range=ORT_U8S8_SATURATES)
    prepared = kq.prepare_pt2e(program, kq.X86InductorQuantizer().set_global(config))
    args = _arrays(entry.args)
    prepared(*args)
    quantized = kq.convert_pt2e(prepared)
    assert any(op.startswith("quantized_decomposed.quantize") for op in quantized.op_histogram())
    result = kq.report(program, quantized, [args])
    assert result.output_sqnr_db > 25, str(result)  # 8-bit: measured 41-72 dB on the zoo
    kiln.save(quantized, tmp_path / "quantized.pt2")
    loaded = kiln.load(tmp_path / "quantized.pt2")
    np.testing.assert_array_equal(np.asarray(loaded(*args)), np.asarray(quantized(*args)))
    onnx_program = kiln.onnx.export(quantized, args)
    session = ort.InferenceSession(onnx_program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: a for i, a in zip(session.get_inputs(), args)}
    assert_quantized_close(session.run(None, feeds)[0], np.asarray(quantized(*args)))

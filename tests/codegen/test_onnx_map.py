"""`kiln.map` lowers to an ONNX `Scan` (no state; the xs are its scan inputs, the other operands are read from the
outer scope): the model passes the checker and strict shape inference, and onnxruntime computes what kiln's
interpreter computes at several leading-dim sizes, nested maps and symbolic sizes inside the body included."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
from torch._higher_order_ops.map import map as torch_map  # noqa: E402

import kiln  # noqa: E402
from kiln.codegen.onnx import export_program  # noqa: E402

from tests.codegen.support import assert_matches_interpreter, check_model  # noqa: E402


class MapWithWeights(torch.nn.Module):
    """A linear layer (lifted weights) and gelu (decomposed for ONNX) in the body; `w`'s dynamic size `n` is
    computed inside the Scan body from the outer graph's input."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, xs, w):
        def body(x, w):
            hidden = torch.nn.functional.gelu(self.linear(x)).sum(-1)
            outer = (hidden.unsqueeze(-1) * w).transpose(0, 1).reshape(-1, 5) + torch.ones_like(w)[:, None]
            return outer.softmax(0), x.amax(0)

        return torch_map(body, xs, w)


class NestedMap(torch.nn.Module):
    def forward(self, xs, w):
        def inner(row, w):
            return (row.unsqueeze(-1) * w).reshape(-1).cos()

        def body(x, w):
            return torch_map(inner, x, w) + 1

        return torch_map(body, xs, w)


CASES = {
    "weights": (MapWithWeights, lambda b, n: [(b, 5, 4), (n,)]),
    "nested": (NestedMap, lambda b, n: [(b, 2, 4), (n,)]),
}


def _inputs(shapes) -> list[np.ndarray]:
    rng = np.random.default_rng(len(shapes) + sum(map(sum, shapes)))
    return [rng.standard_normal(shape).astype(np.float32) for shape in shapes]


@pytest.mark.parametrize("case", sorted(CASES))
def test_map_lowers_to_scan_and_matches_the_interpreter(case):
    model_class, shapes = CASES[case]
    torch.manual_seed(0)
    model = model_class()
    batch, n = torch.export.Dim("batch", min=1, max=16), torch.export.Dim("n", min=2, max=16)
    example = tuple(torch.from_numpy(a) for a in _inputs(shapes(3, 5)))
    program = kiln.from_torch(model, example, dynamic_shapes={"xs": {0: batch}, "w": {0: n}})
    onnx_program = export_program(program)
    check_model(onnx_program)
    graph = onnx_program.model_proto.graph
    assert [node.op_type for node in graph.node if node.op_type in ("Scan", "Loop")] == ["Scan"]
    assert [d.dim_param for d in graph.input[0].type.tensor_type.shape.dim][:1] == ["batch"]
    for size, width in ((2, 3), (7, 9)):
        inputs = _inputs(shapes(size, width))
        assert_matches_interpreter(program, onnx_program, inputs)
        expected = model(*(torch.from_numpy(a) for a in inputs))
        expected = expected if isinstance(expected, (list, tuple)) else [expected]
        kiln.testing.assert_close(list(onnx_program.run(inputs)), [t.detach().numpy() for t in expected])

"""Tokens split by a router's counts (JetMoE's experts: `torch.split(x, counts.tolist())`) have data-dependent sizes:
`item()` binds u0, u1, ... and the pieces' types carry them. Every rewrite pass dropped the `item` ops, which have no
SSA use (fold-batchnorm first), so a pass pipeline lost what binds the sizes; and the ONNX lowering could find a size
only in an input's shape. Dead-code elimination now keeps an op that binds a size a kept value names, and ONNX
reads such a size from the op's value: JetMoE exports and runs in onnxruntime."""

import pytest

import kiln
from kiln.passes import run
from tests.serde.support import assert_same

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")


class RouteByCounts(torch.nn.Module):
    def forward(self, x, expert):
        order = torch.argsort(expert, stable=True)
        counts = torch.stack([(expert == k).sum() for k in range(3)])
        pieces = torch.split(x[order], counts.tolist())
        return torch.cat([piece * (k + 1) + piece.sum(0) for k, piece in enumerate(pieces)])


def test_sizes_bound_by_item_survive_passes_and_export_to_onnx(tmp_path):
    x = torch.randn(7, 4)
    expert = torch.tensor([2, 0, 1, 2, 2, 0, 1])
    n = torch.export.Dim("n", min=2, max=64)
    exported = torch.export.export(RouteByCounts(), (x, expert), dynamic_shapes=({0: n}, {0: n}))
    torch.export.save(exported, tmp_path / "model.pt2")
    program = kiln.load(tmp_path / "model.pt2")
    binders = [op for op in program.nodes() if op.name in ("aten.item.default", "aten._local_scalar_dense.default")]
    assert binders
    for pipeline in ("fold-batchnorm", "dce", "fold-constants,cse,dce"):
        lowered = run(program, pipeline)
        assert_same(lowered(x.numpy(), expert.numpy()), RouteByCounts()(x, expert))
    onnx_program = kiln.onnx.export(program)
    session = ort.InferenceSession(onnx_program.model_proto.SerializeToString())
    for rows in ([2, 0, 1, 2, 2, 0, 1], [1, 1, 0, 2], [0, 0, 0, 0, 0]):
        x, expert = torch.randn(len(rows), 4), torch.tensor(rows)
        got = session.run(None, {name: value.numpy() for name, value in zip(
            [i.name for i in session.get_inputs()], (x, expert))})
        assert_same(got[0], RouteByCounts()(x, expert))

"""Python's bitwise operators on tensors reach torch.export's graph under their dunder names when a model applies
them in place (`mask |= other`, as SmolVLM's patch selection does): `aten.__ior__.Tensor`, which kiln's reader did
not know. It now reads `__or__` / `__and__` / `__xor__` (and the in-place `__i*__`, functionalized) as the bitwise
ops, and bucketize (SmolVLM's patch positions) is a kiln op."""

import pytest

import kiln
from tests.serde.support import assert_same

torch = pytest.importorskip("torch")


class Masks(torch.nn.Module):
    def forward(self, x, y, edges):
        mask = x > 0
        mask |= y > 0
        other = x < 1
        other &= y < 1
        other ^= x > y
        return mask, other, torch.bucketize(x, edges, right=True)


def test_in_place_operators_and_bucketize_load_and_run(tmp_path):
    x, y, edges = torch.randn(3, 5), torch.randn(3, 5), torch.tensor([-1.0, 0.0, 0.0, 1.0])
    mask, _, _ = Masks()(x, y, edges)
    exported = torch.export.export(Masks(), (x, y, edges))
    names = {str(node.target) for node in exported.graph.nodes}
    assert {"aten.__ior__.Tensor", "aten.__iand__.Tensor", "aten.__ixor__.Tensor"} & names
    torch.export.save(exported, tmp_path / "model.pt2")
    program = kiln.load(tmp_path / "model.pt2")
    compiled = kiln.compile(program, output=tmp_path / "pkg")
    for _ in range(3):
        x, y = torch.randn(3, 5), torch.randn(3, 5)
        x[0, 0] = float("nan")
        expected = Masks()(x, y, edges)
        for got in (program(x.numpy(), y.numpy(), edges.numpy()), compiled(x.numpy(), y.numpy(), edges.numpy())):
            for value, want in zip(got, expected):
                assert_same(value, want)

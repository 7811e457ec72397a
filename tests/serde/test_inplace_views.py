"""In-place ops through views in torch's training IR (`k[..., :8] = k_pass`: a slice, then `copy_` into it). kiln's
reader runs the functional op and writes its result back through each base the view aliases; views of an updated
base read it again. Before, the write reached the view alone, and DeepSeek-V3's attention read its keys from an
uninitialized `new_empty`. Each case: torch.export, save, kiln.load, then the interpreter, C and ONNX against torch
eager."""

from __future__ import annotations

import pytest

import kiln
from tests.fuzz.differential import check_program
from tests.inplace_view_cases import CASES
from tests.serde.support import assert_same

torch = pytest.importorskip("torch")


class _Wrap(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@pytest.mark.parametrize("fn", CASES, ids=lambda fn: fn.__name__.strip("_"))
def test_an_in_place_op_on_a_view_updates_its_base(fn, tmp_path):
    x = torch.randn(4, 12)
    exported = torch.export.export(_Wrap(fn), (x,))
    torch.export.save(exported, tmp_path / "model.pt2")
    program = kiln.load(tmp_path / "model.pt2")
    assert_same(program(x.numpy()), fn(x))
    check_program(program, [x.numpy()], backends=("c", "onnx"))


def test_a_buffers_slice_written_in_place_is_a_buffer_mutation(tmp_path):
    from kiln.ir.interpreter import run_program

    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("seen", torch.arange(12.0).reshape(3, 4))

        def forward(self, x):
            self.seen[:, :2].add_(x)
            return self.seen * 1

    x = torch.randn(3, 2)
    exported = torch.export.export(Counter(), (x,))
    torch.export.save(exported, tmp_path / "model.pt2")
    program = kiln.load(tmp_path / "model.pt2")
    twin = Counter()
    expected = twin(x)
    kinds = [spec.kind for spec in program.graph_signature.output_specs]
    assert kinds == [kiln.OutputKind.BUFFER_MUTATION, kiln.OutputKind.USER_OUTPUT]
    buffer, output = run_program(program, [x.numpy()])
    assert_same(buffer, twin.seen)  # the whole buffer, its other columns kept
    assert_same(output, expected)

"""`kiln.map` (torch's `higher_order.map_impl`) through the IR's tools: the readable form prints it as torch does,
verify() accepts it, run_decompositions and the pass pipeline recurse into its body and keep the interpreter's
results, and the C backend runs it as a loop kernel."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch._higher_order_ops.map import map as torch_map  # noqa: E402

import kiln  # noqa: E402
import kiln.passes  # noqa: E402
from kiln.ir.control_flow import MapOp  # noqa: E402
from kiln.testing import assert_close  # noqa: E402

SIZES = [2, 7]  # two leading-dim sizes: one program serves every size in the Dim's range


class MapModel(torch.nn.Module):
    """Two xs mapped together; a pass-through `y` and the lifted linear weights reach the body as operands."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, xs, zs, y):
        def body(sliced, y):
            x, z = sliced
            hidden = torch.nn.functional.gelu(self.linear(x * y)) + z.sum()
            return hidden, z.softmax(-1)

        first, second = torch_map(body, (xs, zs), y)
        return first * 2, second


def _inputs(batch: int) -> list[np.ndarray]:
    rng = np.random.default_rng(batch)
    return [rng.standard_normal(shape).astype(np.float32) for shape in ((batch, 5, 4), (batch, 6), (4,))]


@pytest.fixture(scope="module")
def program():
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=1, max=16)
    example = [torch.from_numpy(a) for a in _inputs(3)]
    return kiln.from_torch(MapModel(), tuple(example),
                           dynamic_shapes={"xs": {0: batch}, "zs": {0: batch}, "y": None})


def _maps(program) -> list[MapOp]:
    return [op for op in program.body.walk() if isinstance(op, MapOp)]


def _body_op_names(program) -> set[str]:
    return {op.name for map_op in _maps(program) for op in map_op.body.block.ops}


def test_loaded_program_holds_a_map_that_verifies(program):
    assert len(_maps(program)) == 1
    program.verify()


def test_interpreter_matches_torch(program):
    torch.manual_seed(0)
    model = MapModel()
    for batch in SIZES:
        inputs = _inputs(batch)
        expected = [t.detach().numpy() for t in model(*(torch.from_numpy(a) for a in inputs))]
        assert_close(list(program(*inputs)), expected)


def test_map_prints_as_torch_prints_map_impl(program):
    text = str(program)
    assert "torch.ops.higher_order.map_impl(body_graph_0, [xs, zs], [y, p_linear_weight, p_linear_bias])" in text
    # the results carry their stacked types, as torch annotates the map's getitems
    assert '"f32[batch, 5, 3]"' in text and '"f32[batch, 6]"' in text
    body = text[text.index("class body_graph_0(torch.nn.Module):"):]
    assert 'def forward(self, xs_1: "f32[5, 4]", zs_1: "f32[6]", y_1: "f32[4]"' in body
    assert "aten.linear.default(" in body and "aten.gelu.default(" in body
    assert "return (" in body


def test_run_decompositions_recurses_into_the_body(program):
    decomposed = program.run_decompositions()
    decomposed.verify()
    names = _body_op_names(decomposed)
    assert "aten.linear.default" not in names and "aten.addmm.default" in names, names
    assert "torch.ops.higher_order.map_impl(body_graph_0" in str(decomposed)
    for batch in SIZES:
        inputs = _inputs(batch)
        assert_close(list(decomposed(*inputs)), list(program(*inputs)))


def test_pass_pipeline_keeps_the_interpreters_results(program):
    optimized = kiln.passes.run(program, "decompose,canonicalize,cse,dce")
    optimized.verify()
    assert len(_maps(optimized)) == 1 and "aten.linear.default" not in _body_op_names(optimized)
    for batch in SIZES:
        inputs = _inputs(batch)
        assert_close(list(optimized(*inputs)), list(program(*inputs)))


def test_retraced_map_types_follow_the_retraced_xs(program):
    (map_op,) = _maps(program.run_decompositions())
    leading = map_op.xs[0].type.shape[0]
    assert [r.type.shape[0] for r in map_op.results] == [leading, leading]
    assert str(leading) == "batch"


def test_c_backend_runs_the_map_as_a_loop(program, tmp_path):
    model = kiln.compile(program, output=tmp_path / "pkg")
    for batch in SIZES:
        inputs = _inputs(batch)
        assert_close(list(model(*inputs)), list(program(*inputs)))

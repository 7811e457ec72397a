"""Sparse programs in .pt2: kiln's encoding (each component a dense weight, the layouts in extra/kiln_sparse.json)
round-trips every layout, as weights and as user inputs; torch loads the same file, building each sparse weight
from its components in the graph; a tampered file is refused with a SerdeError."""

from __future__ import annotations

import io
import json
import warnings
import zipfile

import numpy as np
import pytest

import kiln
from kiln.ir import sparse as layouts
from kiln.ir.serde.errors import SerdeError
from tests.ir.samples.sparse import sparse_rand

CONVERSIONS = {
    "sparse_coo": lambda t: t.to_sparse(),
    "sparse_csr": lambda t: t.to_sparse_csr(),
    "sparse_csr int32": lambda t: kiln.sparse_csr_tensor(*[c.int() if i < 2 else c for i, c in enumerate(
        (t.to_sparse_csr().crow_indices(), t.to_sparse_csr().col_indices(), t.to_sparse_csr().values()))],
        tuple(t.shape)),
    "sparse_csc": lambda t: t.to_sparse_csc(),
    "sparse_bsr": lambda t: t.to_sparse_bsr((2, 4)),
    "sparse_bsc": lambda t: t.to_sparse_bsc((4, 2)),
    "semi_structured": lambda t: t.to_sparse_semi_structured(),
}


class SparseWeight(kiln.nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.register_buffer("weight", weight)

    def forward(self, x):
        return kiln.nn.functional.linear(x, self.weight).relu()


def _round_trip(program):
    buffer = io.BytesIO()
    user_inputs = [arg for arg, spec in zip(program.body.args, program.graph_signature.input_specs)
                   if arg.type.is_sparse and spec.kind.value == "USER_INPUT"]
    if user_inputs:  # torch builds sparse weights from their components, but takes no sparse input
        with pytest.warns(UserWarning, match="torch 2.13 cannot load"):
            kiln.save(program, buffer)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            kiln.save(program, buffer)
    return buffer.getvalue(), kiln.load(io.BytesIO(buffer.getvalue()))


def _weight(kind: str):
    rng = np.random.default_rng(0)
    dense = sparse_rand(rng, 8, 16, block=(4, 4))
    if kind == "semi_structured":
        groups = dense.reshape(8, 4, 4)
        np.put_along_axis(groups, np.argsort(np.abs(groups), axis=-1)[..., :2], 0, axis=-1)
    return dense, CONVERSIONS[kind](kiln.tensor(dense))


@pytest.mark.parametrize("kind", sorted(CONVERSIONS))
def test_sparse_weights_round_trip(kind):
    dense, weight = _weight(kind)
    program = kiln.export(SparseWeight(weight), (kiln.randn(3, 16),))
    layout = next(arg.type.layout for arg in program.body.args if arg.type.is_sparse)
    _, loaded = _round_trip(program)
    assert next(arg.type.layout for arg in loaded.body.args if arg.type.is_sparse) == layout
    stored = loaded.state_dict["weight"]
    assert isinstance(stored, layouts.SparseArray) and stored.layout == weight._value.layout
    for name, array in weight._value.components.items():
        np.testing.assert_array_equal(stored.components[name], array, err_msg=name)
        assert stored.components[name].dtype == array.dtype
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_allclose(loaded(x), np.maximum(x @ dense.T, 0), rtol=1.3e-6, atol=1e-5)


TORCH_LAYOUTS = {"sparse_coo": "sparse_coo", "sparse_csr": "sparse_csr", "sparse_csr int32": "sparse_csr",
                 "sparse_csc": "sparse_csc", "sparse_bsr": "sparse_bsr", "sparse_bsc": "sparse_bsc",
                 "semi_structured": "strided"}  # torch's 2:4 layout is CUDA-only: its CPU graph scatters the values
# torch's own CPU kernels refuse linear() with these (MKL takes square BSR blocks only; no BSC addmm on CPU)
TORCH_CPU_REFUSES = {"sparse_bsr": "non-square blocks", "sparse_bsc": "not implemented"}


def _torch_loaded(data: bytes):
    torch = pytest.importorskip("torch")
    return torch, torch.export.load(io.BytesIO(data))


def _built_weight(torch, loaded):
    """The weight torch builds at the top of the graph (the node feeding linear's weight), computed alone."""
    module = loaded.module()
    linear = next(n for n in module.graph.nodes if n.target is torch.ops.aten.linear.default)
    output = next(n for n in module.graph.nodes if n.op == "output")
    output.args = ((linear.args[1],),)
    module.graph.eliminate_dead_code()
    module.recompile()
    return module(torch.zeros(3, 16))  # (the one output, as the program returned it)


@pytest.mark.parametrize("kind", sorted(CONVERSIONS))
def test_torch_loads_kiln_sparse_weights(kind):
    """torch.export.load reads kiln's file and builds each sparse weight (torch's own layout, block size and index
    dtype) from its components; where torch's CPU kernels take the layout, its module computes kiln's result."""
    dense, weight = _weight(kind)
    program = kiln.export(SparseWeight(weight), (kiln.randn(3, 16),))
    data, _ = _round_trip(program)
    torch, loaded = _torch_loaded(data)
    built = _built_weight(torch, loaded)
    assert str(built.layout) == f"torch.{TORCH_LAYOUTS[kind]}"
    np.testing.assert_array_equal(built.to_dense().numpy(), dense)
    if built.layout in (torch.sparse_csr, torch.sparse_bsr):
        assert built.crow_indices().dtype == (torch.int32 if "int32" in kind else torch.int64)
    if built.layout == torch.sparse_bsr:
        assert tuple(built.values().shape[1:]) == weight._value.layout.blocksize
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    if kind in TORCH_CPU_REFUSES:
        with pytest.raises((RuntimeError, NotImplementedError), match=TORCH_CPU_REFUSES[kind]):
            loaded.module()(torch.from_numpy(x))
        return
    kiln.testing.assert_close(loaded.module()(torch.from_numpy(x)).numpy(), program(x))


def test_torch_runs_square_bsr_blocks():
    dense = sparse_rand(np.random.default_rng(4), 8, 16, block=(4, 4))
    program = kiln.export(SparseWeight(kiln.tensor(dense).to_sparse_bsr((4, 4))), (kiln.randn(3, 16),))
    data, loaded_by_kiln = _round_trip(program)
    torch, loaded = _torch_loaded(data)
    x = np.random.default_rng(5).standard_normal((3, 16)).astype(np.float32)
    kiln.testing.assert_close(loaded.module()(torch.from_numpy(x)).numpy(), program(x))
    kiln.testing.assert_close(loaded_by_kiln(x), program(x))


def test_sparse_user_input_round_trips():
    class Densify(kiln.nn.Module):
        def forward(self, x):
            return x.to_dense() * 2

    value = kiln.tensor(sparse_rand(np.random.default_rng(2), 6, 8)).to_sparse_bsr((2, 2))
    program = kiln.export(Densify(), (value,))
    _, loaded = _round_trip(program)
    assert list(loaded.body.args)[0].type.layout == value._value.layout
    np.testing.assert_array_equal(loaded(value._value), value._value.to_dense() * 2)


def test_sparsified_program_compiles_after_loading(tmp_path):
    kiln.manual_seed(0)
    model = kiln.nn.Sequential(kiln.nn.Linear(32, 64), kiln.nn.GELU(), kiln.nn.Linear(64, 16)).eval()
    program = kiln.passes.run(kiln.export(model, (kiln.randn(4, 32),)), "prune{sparsity=0.9},sparsify")
    _, loaded = _round_trip(program)
    compiled = kiln.compile(loaded, output=tmp_path / "pkg")
    x = np.random.default_rng(3).standard_normal((4, 32)).astype(np.float32)
    kiln.testing.assert_close(compiled(x), program(x))


def _members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist()}


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _tampered(change) -> bytes:
    _, weight = _weight("sparse_csr")
    data, _ = _round_trip(kiln.export(SparseWeight(weight), (kiln.randn(3, 16),)))
    members = _members(data)
    change(members)
    return _zip(members)


def _column_out_of_range(members):
    config_name = next(n for n in members if n.endswith("weights_config.json"))
    config = json.loads(members[config_name])["config"]
    path = next(n for n in members if n.endswith(config["weight.col_indices"]["path_name"]))
    columns = np.frombuffer(members[path], np.int64).copy()
    columns[0] = 1000
    members[path] = columns.tobytes()


def _sparse_member(members, edit):
    name = next(n for n in members if n.endswith("kiln_sparse.json"))
    document = json.loads(members[name])
    edit(document)
    members[name] = json.dumps(document).encode()


@pytest.mark.parametrize("change,message", [
    (_column_out_of_range, "0 <= col_indices < ncols"),
    (lambda m: _sparse_member(m, lambda d: d["weights"]["weight"].update(layout="sparse_csc")),
     "(malformed|disagrees|ccol_indices)"),
    (lambda m: _sparse_member(m, lambda d: d["weights"]["weight"].update(components=["gone", "values"])),
     "lacks its components"),
    (lambda m: _sparse_member(m, lambda d: d["weights"]["weight"].update(shape=[8, -16])), "malformed shape"),
    (lambda m: _sparse_member(m, lambda d: d["inputs"].clear()), "does not describe"),
    (lambda m: _sparse_member(m, lambda d: d["weights"]["weight"]["graph"].update(placeholders=["nowhere"])),
     "the graph does not have"),
    (lambda m: _sparse_member(m, lambda d: d["weights"]["weight"]["graph"].update(spec=[])), "graph record"),
], ids=["index out of range", "layout changed", "component missing", "negative size", "layout missing",
        "placeholders missing", "graph record malformed"])
def test_tampered_sparse_files_are_refused(change, message):
    with pytest.raises(SerdeError, match=message):
        kiln.load(io.BytesIO(_tampered(change)))


def test_sparse_convolution_weights_round_trip_and_compile(tmp_path):
    """A hybrid BSR convolution weight (taps as dense dims) keeps its layout and components through .pt2."""
    kiln.manual_seed(0)
    model = kiln.nn.Sequential(kiln.nn.Conv2d(8, 16, 3, padding=1), kiln.nn.ReLU()).eval()
    program = kiln.passes.run(kiln.export(model, (kiln.randn(2, 8, 6, 6),)),
                              "prune{pattern=block block=4,4 sparsity=0.5},sparsify{block=4,4}")
    (target,) = kiln.passes.sparsity.sparse_weights(program)
    data, loaded = _round_trip(program)
    stored, original = loaded.constants[target], program.constants[target]
    assert stored.layout == original.layout and stored.layout.dense_dim == 2
    for name, array in original.components.items():
        np.testing.assert_array_equal(stored.components[name], array, err_msg=name)
    x = np.random.default_rng(1).standard_normal((2, 8, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(loaded(x), program(x), rtol=1.3e-6, atol=1e-5)
    kiln.testing.assert_close(kiln.compile(loaded, output=tmp_path / "pkg")(x), program(x))
    # torch builds the hybrid BSR weight and, since its conv2d takes no sparse weight, convolves a dense copy
    torch, by_torch = _torch_loaded(data)
    assert torch.ops.aten._to_dense.default in [node.target for node in by_torch.graph.nodes]
    with torch.no_grad():
        kiln.testing.assert_close(by_torch.module()(torch.from_numpy(x)).numpy(), program(x))

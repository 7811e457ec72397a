"""`kiln sparsify`: the package, .pt2 and ONNX it writes against the prune/sparsify passes run in Python, the
sparsity read back from the written files, and flag errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import kiln
from kiln.cli.main import main
from kiln.ir.sparse import SparseArray
from kiln.codegen.driver import DEFAULT_PIPELINE
from kiln.testing import assert_close

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


def _zoo_mlp():
    entry = kiln.models.get("mlp")
    return kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)


def _summary(out: str) -> dict[str, tuple[str, float, str]]:
    """The command's lines `name  [shape]  sparsity F  layout` by weight name."""
    rows = {}
    for line in out.strip().splitlines():
        name, rest = line.split(None, 1)
        shape, _, after = rest.partition("]")
        zeros, _, layout = after.split(None, 1)[1].partition("  ")
        rows[name] = (shape + "]", float(zeros), layout.strip())
    return rows


def _package_weights(package) -> dict[str, np.ndarray]:
    """Every weight of a package, read from weights.bin at the offsets its manifest gives."""
    manifest = json.loads((package / "manifest.json").read_text())
    blob = (package / "weights.bin").read_bytes()
    weights = {}
    for entry in manifest["weights"]:
        assert entry["bits"] == 8 * np.dtype(entry["dtype"]).itemsize, entry
        count = int(np.prod(entry["shape"], dtype=np.int64))
        weights[entry["name"]] = np.frombuffer(blob, np.dtype(entry["dtype"]).newbyteorder("<"), count,
                                               entry["offset"]).reshape(entry["shape"])
    return weights


def _sparse_weights_read_back(package, expected_program) -> dict[str, np.ndarray]:
    """The dense form of every sparse weight of `expected_program`, rebuilt from the components the package stores
    (`target.crow_indices`, `target.values`, ...)."""
    stored = _package_weights(package)
    dense = {}
    for key, value in expected_program.constants.items():
        if isinstance(value, SparseArray):
            components = {name: stored[f"{key}.{name}"] for name in value.components}
            dense[key] = SparseArray(value.layout, value.shape, components).to_dense()
    return dense


CASES = {  # CLI flags, the same passes as a pipeline, the layout of each weight, the least sparsity of each
    "csr": (["--sparsity", "0.9"], "prune{sparsity=0.9},sparsify",
            {"layers.0.weight": "sparse_csr", "layers.1.weight": "sparse_csr", "head.weight": "sparse_csr"}, 0.89),
    "bsr": (["--pattern", "block", "--block", "16,16", "--sparsity", "0.75", "--layout", "bsr"],
            "prune{pattern=block block=16,16 sparsity=0.75},sparsify{layout=bsr block=16,16}",
            {"layers.0.weight": "sparse_bsr 16x16", "layers.1.weight": "sparse_bsr 16x16",
             "head.weight": "dense"}, 0.75),  # 10 output features: not whole 16x16 blocks, stays dense
    "2:4": (["--pattern", "semi_structured", "--layout", "semi_structured"],
            "prune{pattern=semi_structured},sparsify{layout=semi_structured}",
            {"layers.0.weight": "semi_structured", "layers.1.weight": "semi_structured",
             "head.weight": "semi_structured"}, 0.5),
}


@needs_cc
@pytest.mark.parametrize("source", ["zoo", "pt2"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_package_matches_the_passes_and_keeps_the_sparsity(case, source, tmp_path, capsys):
    """The package computes what the interpreter computes on prune+sparsify run in Python, runs every sparse weight
    as a sparse kernel, and the weights read back from weights.bin are the expected ones at the asked sparsity."""
    flags, pipeline, layouts, least = CASES[case]
    program = _zoo_mlp()
    model = "kiln.models:mlp"
    if source == "pt2":  # MODEL given as a .pt2 written by kiln.save
        model = str(tmp_path / "mlp.pt2")
        kiln.save(program, model)
        program = kiln.load(model)
    package = tmp_path / "pkg"
    assert main(["sparsify", model, *flags, "-o", str(package), "-q"]) == 0
    summary = _summary(capsys.readouterr().out)
    assert {name: layout for name, (_, _, layout) in summary.items()} == layouts
    assert summary["layers.0.weight"][0] == "[64, 32]"
    assert all(zeros >= least for _, zeros, _ in summary.values()), summary

    expected = kiln.passes.run(program, pipeline)
    compiled = kiln.runtime.load(package)
    for rows in (1, 5):
        x = np.random.default_rng(rows).standard_normal((rows, 32)).astype(np.float32)
        assert_close(compiled(x), expected(x))
    source_text = (package / "model.c").read_text()
    sparse_count = sum(layout != "dense" for layout in layouts.values())
    assert sum(line.startswith("/* sparse_linear") for line in source_text.splitlines()) == sparse_count

    read_back = _sparse_weights_read_back(package, expected)
    assert len(read_back) == sparse_count
    for key, dense in read_back.items():
        np.testing.assert_array_equal(dense, expected.constants[key].to_dense(), err_msg=key)
        assert 1 - np.count_nonzero(dense) / dense.size >= least, key
        if case == "2:4":
            assert (dense.reshape(dense.shape[0], -1, 4) != 0).sum(axis=-1).max() <= 2
        if case == "bsr":  # whole 16x16 blocks are zero
            blocks = (dense.reshape(dense.shape[0] // 16, 16, -1, 16) != 0).any(axis=(1, 3))
            assert 1 - blocks.mean() >= least
    stored = _package_weights(package)
    manifest = json.loads((package / "manifest.json").read_text())
    packed = {entry["name"]: entry["packed_from"] for entry in manifest["weights"] if "packed_from" in entry}
    for name, layout in layouts.items():  # the dense parameter is stored only where the layer stayed dense, as it
        # is or packed into the micro-kernels' layout (zero padding aside, the same nonzeros)
        forms = [entry for entry in stored if entry == name or packed.get(entry) == name]
        assert bool(forms) == (layout == "dense"), name
        if forms:
            dense = np.asarray(expected.state_dict[name])
            assert 1 - np.count_nonzero(dense) / dense.size >= least
            for entry in forms:
                assert sorted(stored[entry][stored[entry] != 0]) == sorted(dense[dense != 0]), entry


@needs_cc
def test_convolutions_are_block_pruned_and_run_as_sparse_kernels(tmp_path, capsys):
    """The zoo's ResNet: every ungrouped convolution whose channels fit the blocks becomes a hybrid BSR weight and
    a sparse_conv kernel; the package computes what the passes do, and weights.bin holds the pruned weights."""
    entry = kiln.models.get("cnn")
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    package = tmp_path / "pkg"
    assert main(["sparsify", "kiln.models:cnn", "--pattern", "block", "--block", "8,8", "--sparsity", "0.75",
                 "-o", str(package), "-q"]) == 0
    summary = _summary(capsys.readouterr().out)
    assert summary["stem.0.weight"] == ("[16, 3, 3, 3]", 0.5, "dense")  # 3 input channels: no whole 8x8 blocks
    convolutions = {name: row for name, row in summary.items() if name != "stem.0.weight" and "fc" not in name}
    assert len(convolutions) == 5 and all(layout == "sparse_bsr 8x8" and zeros == 0.75
                                          for _, zeros, layout in convolutions.values()), summary
    expected = kiln.passes.run(program, "prune{pattern=block block=8,8 sparsity=0.75},sparsify{block=8,8}")
    compiled = kiln.runtime.load(package)
    for batch in (1, 5):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 16, 16)).astype(np.float32)
        assert_close(compiled(x), expected(x))
    source_text = (package / "model.c").read_text()
    assert sum(line.startswith("/* sparse_conv") for line in source_text.splitlines()) == 5
    folded = kiln.passes.run(expected, DEFAULT_PIPELINE)  # batch norm folds into the sparse weights when compiling
    read_back = _sparse_weights_read_back(package, folded)
    assert sum(dense.ndim == 4 for dense in read_back.values()) == 5
    for key, dense in read_back.items():
        np.testing.assert_array_equal(dense, folded.constants[key].to_dense(), err_msg=key)
        if dense.ndim == 4:  # whole (8 output x 8 input channel) blocks, all their taps, are zero
            blocks = (dense.reshape(dense.shape[0] // 8, 8, dense.shape[1] // 8, -1) != 0).any(axis=(1, 3))
            assert 1 - blocks.mean() == 0.75, key


def test_pt2_output_holds_the_sparse_program_torch_loads(tmp_path, capsys):
    out = tmp_path / "mlp_sparse.pt2"
    assert main(["sparsify", "kiln.models:mlp", "--sparsity", "0.9", "-o", str(out), "-q"]) == 0
    summary = _summary(capsys.readouterr().out)
    expected = kiln.passes.run(_zoo_mlp(), "prune{sparsity=0.9},sparsify")
    layouts = {arg.type.layout.kind for arg in expected.body.args if arg.type.is_sparse}
    assert set(summary) == {"layers.0.weight", "layers.1.weight", "head.weight"}
    assert {layout.split()[0] for _, _, layout in summary.values()} - {"dense"} == layouts != set(), summary
    loaded = kiln.load(out)
    assert {arg.type.layout.kind for arg in loaded.body.args if arg.type.is_sparse} == layouts
    for name, value in expected.state_dict.items():
        stored = loaded.state_dict[name]
        for part, array in getattr(value, "components", {"": value}).items():
            np.testing.assert_array_equal(getattr(stored, "components", {"": stored})[part], array, err_msg=name)
    x = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    assert_close(loaded(x), expected(x))
    torch = pytest.importorskip("torch")
    with torch.no_grad():
        assert_close(torch.export.load(out).module()(torch.from_numpy(x)).numpy(), expected(x))


def _onnx_arrays(model) -> list[np.ndarray]:
    """Every constant tensor of an ONNX graph, dense: initializers, sparse initializers, Constant nodes."""
    from onnx import numpy_helper

    def sparse_dense(tensor):  # values at flat (or per-dim) indices
        values, indices = numpy_helper.to_array(tensor.values), numpy_helper.to_array(tensor.indices)
        dense = np.zeros(tuple(tensor.dims), values.dtype)
        dense[np.unravel_index(indices.reshape(-1), dense.shape) if indices.ndim == 1 else tuple(indices.T)] = values
        return dense

    graph = model.graph
    arrays = [numpy_helper.to_array(t) for t in graph.initializer]
    arrays += [sparse_dense(t) for t in graph.sparse_initializer]
    for node in graph.node:
        for attribute in node.attribute if node.op_type == "Constant" else ():
            if attribute.name == "value":
                arrays.append(numpy_helper.to_array(attribute.t))
            elif attribute.name == "sparse_value":
                arrays.append(sparse_dense(attribute.sparse_tensor))
    return arrays


def test_onnx_output_runs_in_onnxruntime_with_the_pruned_weights(tmp_path, capsys):
    """ONNX stores the sparse weights densified (as dense or sparse initializers or constants, the exporter's
    choice): their zeros are the asked sparsity, and onnxruntime computes what the sparsified program does."""
    import onnx
    import onnxruntime as ort
    out = tmp_path / "mlp_sparse.onnx"
    assert main(["sparsify", "kiln.models:mlp", "--sparsity", "0.9", "-o", str(out), "-q"]) == 0
    summary = _summary(capsys.readouterr().out)
    assert all(layout == "sparse_csr" and zeros >= 0.89 for _, zeros, layout in summary.values()), summary
    weights = [a for a in _onnx_arrays(onnx.load(out)) if a.ndim == 2 and a.dtype.kind == "f"]
    assert sorted(sorted(w.shape) for w in weights) == [[10, 64], [32, 64], [64, 64]]
    assert all(1 - np.count_nonzero(w) / w.size >= 0.89 for w in weights)
    expected = kiln.passes.run(_zoo_mlp(), "prune{sparsity=0.9},sparsify")
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((5, 32)).astype(np.float32)
    (got,) = session.run(None, {session.get_inputs()[0].name: x})
    assert_close(got, expected(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arguments,output,message", [
    (["--pattern", "diagonal"], "pkg", "unknown --pattern 'diagonal'"),
    (["--sparsity", "1.5"], "pkg", "--sparsity must be a number in [0, 1], got '1.5'"),
    (["--sparsity=-0.1"], "out.pt2", "--sparsity must be a number in [0, 1], got '-0.1'"),
    (["--sparsity", "nan"], "out.onnx", "--sparsity must be a number in [0, 1]"),
    (["--sparsity", "most"], "pkg", "--sparsity must be a number in [0, 1]"),
    (["--min-sparsity", "2"], "pkg", "--min-sparsity must be a number in [0, 1]"),
    (["--block", "16"], "pkg", "malformed --block '16'"),
    (["--block", "0,4"], "pkg", "malformed --block '0,4'"),
    (["--block", "16x16"], "pkg", "malformed --block '16x16'"),
    (["--layout", "coo"], "pkg", "unknown --layout 'coo'"),
    (["--scope", "model"], "pkg", "unknown --scope 'model'"),
    (["--pattern", "block", "--scope", "global"], "pkg", "--scope global applies to --pattern unstructured"),
    (["--pattern", "semi_structured", "--sparsity", "0.9"], "pkg", "does not apply to --pattern semi_structured"),
    ([], "out.bin", "cannot tell what to write to out.bin"),
])
def test_bad_flags_exit_2_with_one_line_and_write_nothing(arguments, output, message, tmp_path, capsys,
                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["sparsify", "kiln.models:mlp", *arguments, "-o", output]) == 2  # not -q: nothing else is printed
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kiln: error: ") and message in lines[0], captured.err
    assert captured.out == ""
    assert list(tmp_path.iterdir()) == []


def test_help_says_pt2_holds_the_sparse_program(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["sparsify", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "OUT.pt2 the sparse program, which kiln compile and torch.export.load read" in text

"""Sparse layouts: construction, torch's invariants and messages, conversions both ways, accessors, the IR type."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir import sparse as layouts
from kiln.ir.errors import KilnError, ParseError
from kiln.ir.sparse import Layout, SparseInvariantError
from kiln.ir.types import TensorType
from tests.ir.samples.sparse import sparse_rand
from tests.torch_oracle import requires_torch, to_numpy, torch

KINDS = layouts.SPARSE_KINDS[:-1]  # torch's; semi_structured is kiln's CPU form of 2:4


def torch_conversion(dense, kind, **options):
    tensor = torch.from_numpy(dense)
    if kind == "sparse_coo":
        return tensor.to_sparse(**options)
    return getattr(tensor, f"to_{kind}")(**options)


def kiln_conversion(dense, kind, **options):
    tensor = kiln.tensor(dense)
    if kind == "sparse_coo":
        return tensor.to_sparse(**options)
    return getattr(tensor, f"to_{kind}")(**options)


CASES = [("sparse_coo", {}), ("sparse_csr", {}), ("sparse_csc", {}), ("sparse_bsr", {"blocksize": (2, 3)}),
         ("sparse_bsc", {"blocksize": (2, 2)}), ("sparse_coo", {"sparse_dim": 1}),
         ("sparse_csr", {"dense_dim": 1}), ("sparse_bsr", {"blocksize": (2, 2), "dense_dim": 1})]


@requires_torch
@pytest.mark.parametrize("kind,options", CASES, ids=[f"{k}-{o}" for k, o in CASES])
def test_conversion_from_dense_gives_torch_components(kind, options):
    rng = np.random.default_rng(0)
    dense = sparse_rand(rng, 6, 12, *([3] if options.get("dense_dim") or "sparse_dim" in options else []),
                        block=(2, 3) if kind == "sparse_bsr" else (2, 2) if kind == "sparse_bsc" else (1, 1))
    expected = torch_conversion(dense, kind, **options)
    actual = kiln_conversion(dense, kind, **options)
    assert actual.layout == str(expected.layout).removeprefix("torch.")
    assert actual._nnz() == expected._nnz()
    assert actual.dense_dim() == expected.dense_dim() and actual.sparse_dim() == expected.sparse_dim()
    for name in layouts.COMPONENTS[kind]:
        np.testing.assert_array_equal(getattr(actual, name)().numpy(), to_numpy(getattr(expected, name)()),
                                      err_msg=name)
    np.testing.assert_array_equal(actual.to_dense().numpy(), dense)


@requires_torch
@pytest.mark.parametrize("kind", KINDS)
def test_torch_sparse_tensors_convert_back_to_kiln(kind):
    """torch's components fed to kiln's constructors (check_invariants on) give the same tensor."""
    rng = np.random.default_rng(1)
    dense = sparse_rand(rng, 4, 8, block=(2, 2))
    options = {"blocksize": (2, 2)} if kind in ("sparse_bsr", "sparse_bsc") else {}
    source = torch_conversion(dense, kind, **options)
    parts = [to_numpy(getattr(source, name)()) for name in layouts.COMPONENTS[kind]]
    constructor = getattr(kiln, f"{kind}_tensor")
    extra = {"is_coalesced": source.is_coalesced()} if kind == "sparse_coo" else {}
    built = constructor(*parts, tuple(source.shape), check_invariants=True, **extra)
    assert built.layout == kind
    np.testing.assert_array_equal(built.to_dense().numpy(), dense)
    # and kiln's to torch: the same components make torch's tensor
    rebuilt = getattr(torch, f"{kind}_tensor")(*[torch.from_numpy(getattr(built, name)().numpy())
                                                 for name in layouts.COMPONENTS[kind]], built.shape,
                                               check_invariants=True)
    torch.testing.assert_close(rebuilt.to_dense(), torch.from_numpy(dense))


# Broken components per constructor: (compressed/indices, plain/values, values, size); torch's message must match.
I = np.array  # noqa: E741
BAD_COMPRESSED = [
    ("first compressed index", I([1, 1, 2]), I([0, 1]), [1.0, 2.0], (2, 3)),
    ("last compressed index", I([0, 1, 3]), I([0, 1]), [1.0, 2.0], (2, 3)),
    ("decreasing compressed", I([0, 2, 1]), I([0, 1]), [1.0, 2.0], (2, 3)),
    ("plain index out of range", I([0, 1, 2]), I([0, 5]), [1.0, 2.0], (2, 3)),
    ("unsorted plain indices", I([0, 2, 2]), I([1, 0]), [1.0, 2.0], (2, 3)),
    ("repeated plain indices", I([0, 2, 2]), I([1, 1]), [1.0, 2.0], (2, 3)),
    ("nnz mismatch", I([0, 1, 2]), I([0, 1]), [1.0, 2.0, 3.0], (2, 3)),
    ("index dtypes differ", I([0, 1, 2]), I([0, 1], np.int32), [1.0, 2.0], (2, 3)),
    ("float plain indices", I([0, 1, 2]), I([0.0, 1.0]), [1.0, 2.0], (2, 3)),
    ("compressed length", I([0, 1, 2, 3]), I([0, 1, 1]), [1.0, 2.0, 3.0], (2, 3)),
    ("dims of the indices", I([0, 1, 2]), I([[0, 1]]), [1.0, 2.0], (2, 3)),
    ("rank of the size", I([0, 1, 2]), I([0, 1]), [1.0, 2.0], (2, 3, 4)),
]


def _blocked(values, kind):
    return np.ones((len(values), 1, 2), np.float32) if kind in ("sparse_bsr", "sparse_bsc") else \
        np.asarray(values, np.float32)


@requires_torch
@pytest.mark.parametrize("kind", layouts.COMPRESSED_KINDS)
@pytest.mark.parametrize("case", BAD_COMPRESSED, ids=[c[0] for c in BAD_COMPRESSED])
def test_compressed_invariants_raise_torchs_message(kind, case):
    _, compressed, plain, values, size = case
    values = _blocked(values, kind)
    if kind in ("sparse_bsr", "sparse_bsc"):  # 1x2 blocks: the size counts blocks of columns
        size = (size[0], size[1] * 2, *size[2:])
    if kind in ("sparse_csc", "sparse_bsc"):
        size = (size[1], size[0], *size[2:]) if kind == "sparse_csc" else (size[1] // 2, size[0] * 2, *size[2:])
    with pytest.raises(RuntimeError) as expected:
        getattr(torch, f"{kind}_tensor")(torch.from_numpy(compressed), torch.from_numpy(plain),
                                        torch.from_numpy(values), size, check_invariants=True)
    with pytest.raises(KilnError) as actual:
        getattr(kiln, f"{kind}_tensor")(compressed, plain, values, size, check_invariants=True)
    assert str(actual.value).splitlines()[0] == str(expected.value).splitlines()[0]


BAD_COO = [
    ("index past the size", I([[0, 2], [0, 1]]), [1.0, 2.0], (2, 3)),
    ("negative index", I([[0, -1], [0, 1]]), [1.0, 2.0], (2, 3)),
    ("nnz mismatch", I([[0, 1], [0, 1]]), [1.0, 2.0, 3.0], (2, 3)),
    ("size rank", I([[0, 1]]), [1.0, 2.0], (2, 3)),
    ("1-D indices", I([0, 1]), [1.0, 2.0], (2, 3)),
    ("values' dense dims", I([[0, 1]]), np.ones((2, 4), np.float32), (2, 3)),
]


@requires_torch
@pytest.mark.parametrize("case", BAD_COO, ids=[c[0] for c in BAD_COO])
def test_coo_invariants_raise_torchs_message(case):
    _, indices, values, size = case
    values = np.asarray(values, np.float32)
    with pytest.raises(RuntimeError) as expected:
        torch.sparse_coo_tensor(torch.from_numpy(indices), torch.from_numpy(values), size, check_invariants=True)
    with pytest.raises(KilnError) as actual:
        kiln.sparse_coo_tensor(indices, values, size, check_invariants=True)
    assert str(actual.value).splitlines()[0] == str(expected.value).splitlines()[0]


def test_invariants_checked_only_when_asked_and_under_the_context_manager():
    bad = (np.array([0, 2, 2]), np.array([1, 0]), np.array([1.0, 2.0], np.float32), (2, 3))
    kiln.sparse_csr_tensor(*bad)  # unchecked, like torch's default
    with kiln.sparse.check_sparse_tensor_invariants():
        assert kiln.sparse.check_sparse_tensor_invariants.is_enabled()
        with pytest.raises(SparseInvariantError, match="sorted and distinct"):
            kiln.sparse_csr_tensor(*bad)
        kiln.sparse_csr_tensor(*bad, check_invariants=False)  # an explicit argument wins
    assert not kiln.sparse.check_sparse_tensor_invariants.is_enabled()


def test_coalesce_and_uncoalesced_accessors():
    value = kiln.sparse_coo_tensor(np.array([[1, 0, 1]]), np.array([1.0, 2.0, 3.0], np.float32), (3,))
    assert not value.is_coalesced()
    with pytest.raises(KilnError, match="uncoalesced"):
        value.indices()
    np.testing.assert_array_equal(value._values().numpy(), [1.0, 2.0, 3.0])
    merged = value.coalesce()
    assert merged.is_coalesced()
    np.testing.assert_array_equal(merged.indices().numpy(), [[0, 1]])
    np.testing.assert_array_equal(merged.values().numpy(), [2.0, 4.0])
    np.testing.assert_array_equal(value.to_dense().numpy(), [2.0, 4.0, 0.0])


def test_semi_structured_round_trip_and_metadata():
    rng = np.random.default_rng(2)
    dense = rng.standard_normal((4, 16)).astype(np.float32)
    groups = dense.reshape(4, 4, 4)
    np.put_along_axis(groups, np.argsort(np.abs(groups), axis=-1)[..., :2], 0, axis=-1)  # keep the 2 largest
    groups[0, 1] = 0  # a group with no nonzero, and one with a single nonzero
    groups[1, 2, :3] = 0
    value = kiln.tensor(dense).to_sparse_semi_structured()
    assert value.layout == "semi_structured"
    np.testing.assert_array_equal(value.to_dense().numpy(), dense)
    stored = value._sparse_value("test")
    assert stored.values.shape == (4, 8) and stored.components["metadata"].shape == (4, 2)
    # hand-computed: row 0 group 0 keeps positions p0 < p1, packed as p0 | p1 << 2 in the low nibble of byte 0
    kept = np.flatnonzero(dense[0, :4])
    positions = list(kept) + [p for p in range(4) if p not in kept][:2 - len(kept)]
    p0, p1 = sorted(positions)
    assert stored.components["metadata"][0, 0] & 0xF == p0 | p1 << 2


def test_semi_structured_refuses_three_nonzeros_in_a_group():
    dense = np.zeros((2, 8), np.float32)
    dense[1, 4:7] = 1.0
    with pytest.raises(KilnError, match="row 1, columns 4..7 hold 3 nonzeros"):
        kiln.tensor(dense).to_sparse_semi_structured()


LAYOUT_TYPES = [Layout("sparse_coo"), Layout("sparse_coo", dense_dim=1, coalesced=True), Layout("sparse_csr"),
                Layout("sparse_csc", index_dtype="int32"), Layout("sparse_bsr", blocksize=(16, 16)),
                Layout("sparse_bsc", blocksize=(4, 8), index_dtype="int32", dense_dim=1),
                Layout("semi_structured", meta="2bit")]


@pytest.mark.parametrize("layout", LAYOUT_TYPES, ids=str)
def test_layout_prints_and_parses_in_programs(layout):
    """A program with a sparse-typed input prints, parses back identically, verifies and runs."""
    from kiln.ir.program import ExportedProgram, GraphBuilder
    from kiln.ir.registry import ops
    shape = [16, 32, 3] if layout.dense_dim else [16, 32]
    builder = GraphBuilder()
    x = builder.add_input("x", TensorType.of(shape, "f32", layout))
    with builder:
        program = builder.build([ops.aten._to_dense.default(x)])
    text = program.to_mlir()
    assert layout.text() in text
    reparsed = ExportedProgram.from_mlir(text)
    assert reparsed.to_mlir() == text
    reparsed.verify()
    assert list(reparsed.body.args)[0].type.layout == layout


def test_unknown_layouts_and_options_are_parse_errors():
    with pytest.raises(ParseError, match="unknown layout"):
        layouts.parse_layout("sparse_dia")
    with pytest.raises(ParseError, match="unknown layout option"):
        layouts.parse_layout("sparse_bsr<block=[2]>")


def test_ops_without_sparse_support_refuse_with_a_fix():
    value = kiln.randn(4, 4).to_sparse_csr()
    with pytest.raises(KilnError, match="does not support sparse_csr tensors") as error:
        value.exp()
    assert "to_dense()" in str(error.value)


def test_a_sparse_parameter_exports_and_runs():
    """A model holding a CSR weight exports with a sparse-typed parameter, and the program runs on the interpreter."""
    rng = np.random.default_rng(3)
    weight = sparse_rand(rng, 8, 6)

    class SparseLinear(kiln.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = kiln.nn.Parameter(kiln.tensor(weight).to_sparse_csr(), requires_grad=False)

        def forward(self, x):
            return kiln.nn.functional.linear(x, self.weight).relu()

    x = rng.standard_normal((3, 6)).astype(np.float32)
    program = kiln.export(SparseLinear(), (kiln.tensor(x),))
    assert "sparse_csr" in program.to_mlir()
    np.testing.assert_allclose(program(x), np.maximum(x @ weight.T, 0), rtol=1.3e-6, atol=1e-5)

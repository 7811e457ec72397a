"""The Triton backend's sort / topk (kiln/codegen/triton/sorting.py), upsampling, grid sampling and pairwise distances
(kiln/codegen/triton/sampling.py) on CPU through Triton's interpreter, in the forms the registry samples may miss:
NaN, ties and rows longer than one block; scales and align_corners; every grid-sampler mode and padding with points
outside the input; every p-norm, both Euclidean formulas and symbolic sizes. Checked against torch and kiln's
interpreter."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # tests/conftest.py sets it before triton's first import
torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import kiln  # noqa: E402
from kiln.frontend.tensor import dispatch as call  # noqa: E402
from tests.runtime.support import assert_outputs_close, compile_function  # noqa: E402

aten = kiln.ops.aten


def _compile(fn, arrays, tmp_path, dynamic=None):
    return compile_function(fn, arrays, tmp_path / "model", "triton", dynamic)


def _interpreted(program, arrays):
    result = program(*arrays)
    result = result if isinstance(result, (tuple, list)) else (result,)
    return [r.__kiln_array__() if hasattr(r, "__kiln_array__") else np.asarray(r) for r in result]


def _row_values(rng, shape, dtype=np.float32):
    """Values with many ties (a few distinct levels), NaNs and infinities, so order and stability both show."""
    x = rng.integers(-4, 5, shape).astype(dtype)
    if np.issubdtype(dtype, np.floating):
        x.flat[rng.choice(x.size, max(1, x.size // 10), replace=False)] = np.nan
        x.flat[rng.choice(x.size, max(1, x.size // 20), replace=False)] = np.inf
        x.flat[rng.choice(x.size, max(1, x.size // 20), replace=False)] = -np.inf
        x.flat[: x.size // 3] += rng.standard_normal(x.size // 3).astype(dtype)
    return x


@pytest.mark.parametrize("descending", [False, True])
def test_sort_is_stable_with_nan_and_long_rows(descending, tmp_path):
    """Rows of 3000 (many blocks) along the last dim, short rows along dim 0, float64 and int64, a fused producer
    and a row that is one value broadcast (every element ties): values and indices as torch's stable sort."""
    def fn(x, y, z, w, b):
        return (*call(aten.sort.default, x, -1, descending), *call(aten.sort.default, y, 0, descending),
                *call(aten.sort.default, z, 1, descending), *call(aten.sort.default, w * 2.0, -1, descending),
                *call(aten.sort.default, b.expand(3, 70), 1, descending))

    rng = np.random.default_rng(1)
    x = _row_values(rng, (2, 3000))
    y = _row_values(rng, (37, 3), np.float64)
    z = rng.integers(-3, 4, (4, 130)).astype(np.int64)
    w = _row_values(rng, (3, 65))
    b = rng.standard_normal((3, 1)).astype(np.float32)
    arrays = [x, y, z, w, b]
    program, model = _compile(fn, arrays, tmp_path)
    got = model(*arrays)
    expected = []
    for t, dim in ((x, -1), (y, 0), (z, 1), (w * np.float32(2.0), -1), (np.broadcast_to(b, (3, 70)), 1)):
        values, indices = torch.sort(torch.from_numpy(np.ascontiguousarray(t)), dim=dim, descending=descending,
                                     stable=True)
        expected += [values, indices]
    assert_outputs_close(got, expected)
    assert_outputs_close(got, _interpreted(program, arrays))


@pytest.mark.parametrize("largest", [True, False])
def test_topk_with_nan_ties_and_long_rows(largest, tmp_path):
    """k of 1, a few and the whole row; NaN counts as the largest; ties keep their input order (the interpreter's
    stable order: torch leaves it unspecified, so indices are compared with the interpreter)."""
    def fn(x, y):
        return (*call(aten.topk.default, x, 5, -1, largest), *call(aten.topk.default, x, 1, 1, largest),
                *call(aten.topk.default, y, 9, 0, largest), *call(aten.topk.default, y, 4, 1, largest))

    rng = np.random.default_rng(2)
    x = _row_values(rng, (3, 3000))
    y = _row_values(rng, (9, 4), np.float64)
    program, model = _compile(fn, [x, y], tmp_path)
    got = model(x, y)
    assert_outputs_close(got, _interpreted(program, [x, y]))
    expected = [torch.topk(torch.from_numpy(t), k, dim=dim, largest=largest)[0]
                for t, k, dim in ((x, 5, -1), (x, 1, 1), (y, 9, 0), (y, 4, 1))]
    assert_outputs_close(got[0::2], expected)


def test_sort_over_a_symbolic_row(tmp_path):
    length = kiln.Dim("length", max=5000)
    program, model = _compile(lambda x: call(aten.sort.default, x, -1, True), [np.zeros((2, 8), np.float32)],
                              tmp_path, ({1: length},))
    for n in (1, 64, 65, 1500):
        x = _row_values(np.random.default_rng(n), (2, n))
        assert_outputs_close(model(x), _interpreted(program, [x]))


@pytest.mark.parametrize("align_corners", [False, True])
def test_upsample_with_scales_and_sizes(align_corners, tmp_path):
    """Nearest and bilinear at output sizes (growing, shrinking, doubling, one pixel) and at scale factors that
    do not divide the size (the source position uses 1 / scale, not in / out); float32 and float64."""
    def fn(x, d):
        return (call(aten.upsample_nearest2d.vec, x, [11, 4], None),
                call(aten.upsample_nearest2d.vec, x, None, [1.7, 2.0]),
                call(aten.upsample_nearest2d.vec, x, [1, 14], None),
                call(aten.upsample_bilinear2d.vec, x, [11, 4], align_corners, None),
                call(aten.upsample_bilinear2d.vec, x, None, align_corners, [1.7, 0.6]),
                call(aten.upsample_bilinear2d.vec, x, [1, 7], align_corners, None),
                call(aten.upsample_bilinear2d.vec, d, None, align_corners, [2.5, 3.0]))

    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    d = rng.standard_normal((1, 2, 4, 3))
    program, model = _compile(fn, [x, d], tmp_path)
    got = model(x, d)
    tx, td = torch.from_numpy(x), torch.from_numpy(d)
    up = torch.ops.aten
    expected = [up.upsample_nearest2d.vec(tx, [11, 4], None), up.upsample_nearest2d.vec(tx, None, [1.7, 2.0]),
                up.upsample_nearest2d.vec(tx, [1, 14], None),
                up.upsample_bilinear2d.vec(tx, [11, 4], align_corners, None),
                up.upsample_bilinear2d.vec(tx, None, align_corners, [1.7, 0.6]),
                up.upsample_bilinear2d.vec(tx, [1, 7], align_corners, None),
                up.upsample_bilinear2d.vec(td, None, align_corners, [2.5, 3.0])]
    assert_outputs_close(got, expected)
    assert_outputs_close(got, _interpreted(program, [x, d]))


def test_upsample_over_symbolic_sizes(tmp_path):
    height = kiln.Dim("height", max=64)

    def fn(x):
        return (call(aten.upsample_bilinear2d.vec, x, None, False, [2.0, 1.5]),
                call(aten.upsample_nearest2d.vec, x, None, [3.0, 0.5]))

    program, model = _compile(fn, [np.zeros((1, 2, 4, 6), np.float32)], tmp_path, ({2: height},))
    for h in (2, 5, 9):
        x = np.random.default_rng(h).standard_normal((1, 2, h, 6)).astype(np.float32)
        assert_outputs_close(model(x), _interpreted(program, [x]))


@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_every_mode_and_padding(align_corners, tmp_path):
    """Bilinear, nearest and bicubic, each with zeros, border and reflection padding, at grid points well outside
    [-1, 1] and at exact pixel centres (nearest's half-way ties)."""
    forms = [(mode, padding) for mode in (0, 1, 2) for padding in (0, 1, 2)]

    def fn(x, grid):
        return tuple(call(aten.grid_sampler_2d.default, x, grid, mode, padding, align_corners)
                     for mode, padding in forms)

    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    grid = rng.uniform(-2.5, 2.5, (2, 7, 8, 2)).astype(np.float32)
    grid[0, 0, :, 0] = np.linspace(-1, 1, 8)  # on the sampling lattice: ties for nearest's rounding
    grid[0, 1, :3] = [[-1, -1], [1, 1], [0, 0]]
    program, model = _compile(fn, [x, grid], tmp_path)
    got = model(x, grid)
    tx, tg = torch.from_numpy(x), torch.from_numpy(grid)
    expected = [torch.ops.aten.grid_sampler_2d(tx, tg, mode, padding, align_corners) for mode, padding in forms]
    assert_outputs_close(got, expected)
    assert_outputs_close(got, _interpreted(program, [x, grid]))


def test_grid_sample_non_finite_points_and_float64(tmp_path):
    """NaN and infinite grid points read 0 (or the padding's clamp of NaN), as the interpreter; float64 inputs."""
    forms = [(mode, padding, align) for mode in (0, 1, 2) for padding in (0, 1, 2) for align in (False, True)]

    def fn(x, grid):
        return tuple(call(aten.grid_sampler_2d.default, x, grid, *form) for form in forms)

    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 2, 1, 4))  # a one-pixel-high input: reflection's span is 0 with align_corners
    grid = rng.uniform(-3, 3, (1, 3, 5, 2))
    grid[0, 0, :3, 0] = [np.nan, np.inf, -np.inf]
    grid[0, 1, :2, 1] = [np.nan, 1e30]
    program, model = _compile(fn, [x, grid], tmp_path)
    assert_outputs_close(model(x, grid), _interpreted(program, [x, grid]))


P_NORMS = [0.0, 1.0, 2.0, math.inf, 3.0, 0.5]


@pytest.mark.parametrize("p", P_NORMS)
def test_cdist_every_norm(p, tmp_path):
    """Direct differences (compute_mode 2, and small inputs by default) against torch; batch dims broadcast; more
    columns than one step reads. Equal rows give p = 0 its zero counts."""
    def fn(a, b, c, d):
        return (call(aten._cdist_forward.default, a, b, p, 2), call(aten._cdist_forward.default, a, b, p, None),
                call(aten._cdist_forward.default, c, d, p, 2))

    rng = np.random.default_rng(7)
    a = rng.standard_normal((2, 5, 3)).astype(np.float32)
    b = rng.standard_normal((1, 4, 3)).astype(np.float32)
    b[0, 1] = a[0, 2]
    c = rng.standard_normal((6, 70))
    d = rng.standard_normal((3, 70))
    program, model = _compile(fn, [a, b, c, d], tmp_path)
    got = model(a, b, c, d)
    ta, tb, tc, td = map(torch.from_numpy, (a, b, c, d))
    expected = [torch.ops.aten._cdist_forward(ta, tb, p, 2), torch.ops.aten._cdist_forward(ta, tb, p, None),
                torch.ops.aten._cdist_forward(tc, td, p, 2)]
    assert_outputs_close(got, expected)
    assert_outputs_close(got, _interpreted(program, [a, b, c, d]))


def test_cdist_euclidean_formulas_and_non_finite_inputs(tmp_path):
    """The matrix-product formula (compute_mode 1, and by default past 25 rows: decided at run time for a symbolic
    row count) and NaN / inf inputs, against the interpreter (which computes both formulas in float64 as kiln)."""
    rows = kiln.Dim("rows", max=64)

    def fn(a, b):
        return (call(aten._cdist_forward.default, a, b, 2.0, None), call(aten._cdist_forward.default, a, b, 2.0, 1),
                call(aten._cdist_forward.default, a, b, 2.0, 2),
                call(aten._cdist_forward.default, a, b, math.inf, None),
                call(aten._cdist_forward.default, a, b, 0.0, None))

    examples = [np.zeros((4, 3), np.float32), np.zeros((5, 3), np.float32)]
    program, model = _compile(fn, examples, tmp_path, ({0: rows}, None))
    for n in (3, 25, 26, 40):
        rng = np.random.default_rng(n)
        a = rng.standard_normal((n, 3)).astype(np.float32)
        b = rng.standard_normal((5, 3)).astype(np.float32)
        a[0, 1], b[2, 0], b[3, 2] = np.nan, np.inf, -np.inf
        assert_outputs_close(model(a, b), _interpreted(program, [a, b]))


@pytest.mark.parametrize("p", P_NORMS)
def test_pdist_every_norm(p, tmp_path):
    """Pairs i < j in row-major order over more rows than one program's block (70), and a NaN row for the
    NaN-propagating max (against the interpreter)."""
    def fn(x, y):
        return call(aten._pdist_forward.default, x, p), call(aten._pdist_forward.default, y, p)

    rng = np.random.default_rng(8)
    x = rng.standard_normal((70, 5)).astype(np.float32)
    x[3] = x[60]
    y = rng.standard_normal((6, 40))
    y[2, 7] = np.nan
    program, model = _compile(fn, [x, y], tmp_path)
    got = model(x, y)
    assert_outputs_close(got[0], torch.ops.aten._pdist_forward(torch.from_numpy(x), p))
    assert_outputs_close(got, _interpreted(program, [x, y]))

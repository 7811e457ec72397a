"""The prune and sparsify passes: masks against torch.ao.pruning's WeightNormSparsifier and torch.nn.utils.prune,
the patterns they leave, and sparsified programs that compute what the pruned dense ones do."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.passes.sparsity import SparsityError, choose_layout, pattern_mask, sparse_weights
from tests.torch_oracle import requires_torch, torch


def mlp(seed: int = 0, features=(32, 64, 16)):
    kiln.manual_seed(seed)
    layers = []
    for index, (fan_in, fan_out) in enumerate(zip(features, features[1:])):
        layers += [kiln.nn.Linear(fan_in, fan_out)] + ([kiln.nn.ReLU()] if index < len(features) - 2 else [])
    return kiln.nn.Sequential(*layers).eval()


def weights_of(program):
    return {name: value for name, value in {**program.state_dict, **program.constants}.items()
            if name.endswith("weight") and getattr(value, "ndim", 0) == 2}


@requires_torch
@pytest.mark.parametrize("sparsity,block,zeros", [(0.9, (1, 1), 1), (0.5, (1, 1), 1), (0.8, (4, 4), 16),
                                                  (0.6, (8, 4), 32), (1.0, (1, 4), 2), (0.5, (3, 5), 15)])
def test_masks_match_weight_norm_sparsifier(sparsity, block, zeros):
    from torch.ao.pruning import WeightNormSparsifier
    from kiln.passes.sparsity import weight_norm_mask
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(40, 30))
    weight = model[0].weight.detach().numpy().copy()
    sparsifier = WeightNormSparsifier(sparsity_level=sparsity, sparse_block_shape=block, zeros_per_block=zeros)
    sparsifier.prepare(model, config=[{"tensor_fqn": "0.weight"}])
    sparsifier.step()
    sparsifier.squash_mask()
    expected = model[0].weight.detach().numpy() != 0
    np.testing.assert_array_equal(weight_norm_mask(weight, sparsity, block, zeros), expected)


@requires_torch
def test_global_scope_matches_torch_global_unstructured():
    import torch.nn.utils.prune as torch_prune
    module = mlp()
    program = kiln.export(module, (kiln.randn(2, 32),))
    pruned = kiln.passes.run(program, "prune{sparsity=0.75 scope=global}")
    reference = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))
    reference.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in module.state_dict().items()})
    torch_prune.global_unstructured([(reference[0], "weight"), (reference[2], "weight")],
                                    pruning_method=torch_prune.L1Unstructured, amount=0.75)
    for name, layer in (("0.weight", reference[0]), ("2.weight", reference[2])):
        np.testing.assert_array_equal(pruned.state_dict[name], layer.weight.detach().numpy(), err_msg=name)


@pytest.mark.parametrize("pipeline,check", [
    ("prune{sparsity=0.9}", lambda w: np.isclose((w == 0).mean(), 0.9, atol=0.01)),
    ("prune{pattern=block block=8,8 sparsity=0.5}",
     lambda w: set(np.unique((w.reshape(w.shape[0] // 8, 8, -1, 8) != 0).sum(axis=(1, 3)))) <= {0, 64}),
    ("prune{pattern=semi_structured}", lambda w: (w.reshape(w.shape[0], -1, 4) != 0).sum(axis=-1).max() == 2
     and (w == 0).mean() == 0.5),
])
def test_prune_leaves_its_pattern_and_the_program_runs(pipeline, check):
    program = kiln.export(mlp(), (kiln.randn(2, 32),))
    pruned = kiln.passes.run(program, pipeline)
    for name, weight in weights_of(pruned).items():
        assert check(weight), f"{pipeline}: {name}"
    x = np.random.default_rng(0).standard_normal((2, 32)).astype(np.float32)
    state = {k: v for k, v in pruned.state_dict.items()}
    dense = mlp()
    dense.load_state_dict({k: kiln.tensor(v) for k, v in state.items()})
    np.testing.assert_allclose(pruned(x), dense(kiln.tensor(x)).numpy(), rtol=1.3e-6, atol=1e-5)


@pytest.mark.parametrize("pipeline,layout", [
    ("prune{sparsity=0.9},sparsify", "sparse_csr"),
    ("prune{pattern=block block=8,8 sparsity=0.75},sparsify{block=8,8}", "sparse_bsr"),
    ("prune{pattern=semi_structured},sparsify{layout=semi_structured}", "semi_structured"),
    ("prune{sparsity=0.9},sparsify{layout=bsr block=4,4 min_sparsity=0}", "sparse_bsr"),
])
def test_sparsify_stores_sparse_weights_and_computes_the_same(pipeline, layout):
    program = kiln.export(mlp(), (kiln.randn(2, 32),))
    pruned = kiln.passes.run(program, pipeline.split(",sparsify")[0])
    sparse = kiln.passes.run(pruned, pipeline)
    text = sparse.to_mlir()
    assert text.count(f"f32, {layout}") >= 2, text
    x = np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)
    np.testing.assert_allclose(sparse(x), pruned(x), rtol=1.3e-6, atol=1e-5)


def test_sparsify_keeps_dense_weights_dense():
    program = kiln.export(mlp(), (kiln.randn(2, 32),))
    assert "f32, sparse" not in kiln.passes.run(program, "sparsify").to_mlir()


def test_choose_layout():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((16, 32)).astype(np.float32)
    assert choose_layout(weight, (4, 4), 0.5) is None
    two_four = weight * pattern_mask(weight, "semi_structured", 0.5)
    assert choose_layout(two_four, (4, 4), 0.5, rows=1)[0] == "semi_structured"  # reading weights bounds it
    assert choose_layout(two_four, (4, 4), 0.5, rows=2)[0] == "semi_structured"  # the expanded weights, too
    for rows in (3, 8, 15):  # 50% zeros: units of 8 or 16 rows, part empty, do not beat dense on every build
        assert choose_layout(two_four, (4, 4), 0.5, rows=rows) is None
    for rows in (16, 32, 1024):  # the pair kernel
        assert choose_layout(two_four, (4, 4), 0.5, rows=rows)[0] == "semi_structured"
    assert choose_layout(two_four, (4, 4), 0.5) is None  # rows not static
    blocks = weight * pattern_mask(weight, "block", 0.75, (4, 4))
    assert choose_layout(blocks, (4, 4), 0.5) == ("sparse_bsr", {"blocksize": (4, 4)})
    scattered = weight * pattern_mask(weight, "unstructured", 0.9)
    assert choose_layout(scattered, (4, 4), 0.5)[0] == "sparse_csr"
    assert choose_layout(weight * pattern_mask(weight, "unstructured", 0.6), (4, 4), 0.5) is None  # below break-even


def test_bad_options_are_clear_errors():
    with pytest.raises(kiln.KilnError, match="unknown pattern 'diagonal'"):
        kiln.passes.run(kiln.export(mlp(), (kiln.randn(2, 32),)), "prune{pattern=diagonal}")
    with pytest.raises(kiln.KilnError, match="global applies to pattern=unstructured"):
        kiln.passes.run(kiln.export(mlp(), (kiln.randn(2, 32),)), "prune{pattern=semi_structured scope=global}")
    with pytest.raises(SparsityError, match="multiple of 4 input features"):
        pattern_mask(np.ones((4, 6), np.float32), "semi_structured", 0.5)


class ConvNet(kiln.nn.Module):
    """Convolutions of every kind `sparsify` meets: 3x3 with bias, strided, 1x1, 1-D, grouped (left dense)."""

    def __init__(self):
        super().__init__()
        kiln.manual_seed(0)
        self.first = kiln.nn.Conv2d(16, 32, 3, padding=1)
        self.strided = kiln.nn.Conv2d(32, 32, 3, stride=2, padding=1, bias=False)
        self.pointwise = kiln.nn.Conv2d(32, 16, 1)
        self.grouped = kiln.nn.Conv2d(16, 16, 3, padding=1, groups=2)
        self.line = kiln.nn.Conv1d(16, 16, 3, padding=2, dilation=2)

    def forward(self, x):
        y = self.grouped(self.pointwise(kiln.relu(self.strided(kiln.relu(self.first(x))))))
        return self.line(y.flatten(2))


def test_block_pruning_of_a_convolution_zeroes_whole_channel_blocks():
    """A convolution's block is (output channels x input channels) with all their taps: the hybrid BSR's block."""
    program = kiln.export(ConvNet().eval(), (kiln.randn(2, 16, 8, 8),))
    pruned = kiln.passes.run(program, "prune{pattern=block block=8,4 sparsity=0.5}")
    weight = pruned.state_dict["strided.weight"]  # [32, 32, 3, 3]
    blocks = (weight.reshape(4, 8, 8, 4 * 9) != 0).sum(axis=(1, 3))
    assert set(np.unique(blocks)) == {0, 8 * 4 * 9} and (blocks == 0).mean() == 0.5


def test_sparsify_stores_convolutions_as_hybrid_bsr():
    program = kiln.export(ConvNet().eval(), (kiln.randn(2, 16, 8, 8),))
    pruned = kiln.passes.run(program, "prune{pattern=block block=8,4 sparsity=0.75}")
    sparse = kiln.passes.run(pruned, "sparsify{block=8,4}")
    text = sparse.to_mlir()
    assert "!kiln.tensor<[32, 16, 3, 3], f32, sparse_bsr<block=[8, 4], dense_dim=2>>" in text
    assert "!kiln.tensor<[16, 16, 3], f32, sparse_bsr<block=[8, 4], dense_dim=1>>" in text
    # every ungrouped convolution; the grouped one stays dense
    assert sorted(sparse_weights(sparse)) == [
        f"{name}_weight_sparse_bsr_0" for name in ("first", "line", "pointwise", "strided")]
    x = np.random.default_rng(1).standard_normal((2, 16, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(sparse(x), pruned(x), rtol=1.3e-6, atol=1e-5)
    # below the break-even (and for layout=csr, which convolutions do not take) they stay dense
    lightly_pruned = kiln.passes.run(program, "prune{pattern=block block=8,4 sparsity=0.3}")
    assert sparse_weights(kiln.passes.run(lightly_pruned, "sparsify{block=8,4}")) == []
    assert sparse_weights(kiln.passes.run(pruned, "sparsify{layout=csr block=8,4}")) == []


def test_choose_layout_for_convolutions():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    blocks = weight * pattern_mask(weight, "block", 0.75, (8, 8))
    assert choose_layout(blocks, (8, 8), 0.0) == ("sparse_bsr", {"blocksize": (8, 8)})
    assert choose_layout(weight * pattern_mask(weight, "block", 0.25, (8, 8)), (8, 8), 0.0) is None
    # scattered zeros leave no whole channel block empty: a convolution is never CSR or 2:4
    assert choose_layout(weight * pattern_mask(weight, "unstructured", 0.95), (8, 8), 0.0) is None
    pointwise = rng.standard_normal((16, 16, 1, 1)).astype(np.float32)
    assert choose_layout(pointwise * pattern_mask(pointwise, "semi_structured", 0.5), (8, 8), 0.0, rows=1) is None

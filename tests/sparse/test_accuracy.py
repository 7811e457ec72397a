"""Accuracy after pruning on a real data set: scikit-learn's bundled handwritten digits (the split of
tests/datasets.py), an MLP trained with kiln's eager autograd and kiln.optim on half of it, pruned 80% unstructured
and 2:4, then fine-tuned with the masks held (torch.ao.pruning's semantic: pruned weights stay zero), evaluated on
the other half. Run with `pytest -s` to see the baseline, one-shot and fine-tuned accuracies."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
from kiln.passes.sparsity import pattern_mask
from kiln.testing import assert_close
from tests.datasets import digits as load_digits

# The quantization accuracy test's MLP and recipe (full-batch Adam, lr 1e-2, 150 steps from seed 0), in kiln.
TRAIN_STEPS = 150
FINE_TUNE_EPOCHS = 100  # full-batch epochs at the same learning rate: about 2 s for the MLP on two cores


@pytest.fixture(scope="module")
def digits():
    return load_digits()


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def _train(model: nn.Module, data: tuple[np.ndarray, np.ndarray], steps: int,
           masks: dict[str, np.ndarray] | None = None) -> nn.Module:
    """Full-batch Adam on cross entropy; with `masks`, every masked parameter is multiplied by its mask after each
    step (and before the first), so pruned weights stay exactly zero."""
    images, labels = kiln.tensor(data[0]), kiln.tensor(data[1])
    parameters = dict(model.named_parameters())
    held = {name: kiln.tensor(mask.astype(np.float32)) for name, mask in (masks or {}).items()}

    def hold() -> None:
        with kiln.no_grad():
            for name, mask in held.items():
                parameters[name].mul_(mask)

    model.train()
    optimizer = kiln.optim.Adam(model.parameters(), lr=1e-2)
    hold()
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()
        hold()
    return model.eval()


def fine_tune_with_masks(model: nn.Module, masks: dict[str, np.ndarray], data: tuple[np.ndarray, np.ndarray],
                         epochs: int) -> nn.Module:
    """Fine-tune `model` on `data` (images, labels) for `epochs` full-batch epochs with kiln's eager autograd and
    Adam, keeping each parameter named in `masks` (name -> bool array, True keeps) multiplied by its mask after
    every optimizer step, as torch.ao.pruning's mask parametrization keeps pruned weights zero."""
    return _train(model, data, epochs, masks)


def _masks(model: nn.Module, pattern: str, sparsity: float) -> dict[str, np.ndarray]:
    """pattern_mask of every Linear weight."""
    return {name: pattern_mask(parameter.numpy(), pattern, sparsity)
            for name, parameter in model.named_parameters() if name.endswith("weight")}


def _accuracy(run, images: np.ndarray, labels: np.ndarray) -> float:
    return float((np.argmax(_logits(run, images), axis=1) == labels).mean() * 100)


def _logits(run, images: np.ndarray) -> np.ndarray:
    if isinstance(run, nn.Module):
        with kiln.no_grad():
            return run(kiln.tensor(images)).numpy()
    return np.asarray(run(images))


def _load(state: dict[str, np.ndarray]) -> nn.Module:
    model = _mlp()
    model.load_state_dict({name: kiln.tensor(value.copy()) for name, value in state.items()})
    return model.eval()


def _export(model: nn.Module, images: np.ndarray):
    return kiln.export(model, (kiln.tensor(images),), dynamic_shapes=({0: kiln.Dim("batch", min=1, max=4096)},))


@pytest.fixture(scope="module")
def trained(digits):
    """(float state dict as numpy arrays, baseline top-1 on the held-out split)."""
    train_x, train_y, test_x, test_y = digits
    kiln.manual_seed(0)
    model = _train(_mlp(), (train_x, train_y), TRAIN_STEPS)
    baseline = _accuracy(model, test_x, test_y)
    assert baseline > 90, f"the digits MLP trained to only {baseline:.2f}%: the fixture is broken"
    return {name: value.numpy().copy() for name, value in model.state_dict().items()}, baseline


@pytest.mark.parametrize("pattern,sparsity,pipeline,layout", [
    ("unstructured", 0.8, "prune{sparsity=0.8}", "sparse_csr"),
    ("semi_structured", 0.5, "prune{pattern=semi_structured}", "semi_structured"),
], ids=["unstructured-80", "2:4"])
def test_pruned_and_fine_tuned_accuracy(digits, trained, pattern, sparsity, pipeline, layout, tmp_path):
    train_x, train_y, test_x, test_y = digits
    state, baseline = trained

    # One-shot: the masks of pattern_mask are the prune pass's, on the eager model and on the exported program.
    model = _load(state)
    masks = _masks(model, pattern, sparsity)
    pruned_program = kiln.passes.run(_export(model, test_x), pipeline)
    for name, mask in masks.items():
        np.testing.assert_array_equal(pruned_program.state_dict[name], np.where(mask, state[name], 0), err_msg=name)
    one_shot = _accuracy(pruned_program, test_x, test_y)

    fine_tune_with_masks(model, masks, (train_x, train_y), FINE_TUNE_EPOCHS)
    fine_tuned = _accuracy(model, test_x, test_y)
    print(f"\ndigits mlp {pattern} (sparsity {sparsity}): baseline {baseline:.2f}%, one-shot {one_shot:.2f}%, "
          f"fine-tuned {fine_tuned:.2f}% ({FINE_TUNE_EPOCHS} epochs)")

    weights = {name: parameter.numpy() for name, parameter in model.named_parameters() if name in masks}
    for name, weight in weights.items():
        assert not weight[~masks[name]].any(), f"{name}: a pruned weight is nonzero after fine-tuning"
        if pattern == "unstructured":
            assert (weight == 0).mean() >= sparsity, f"{name}: {(weight == 0).mean():.4f} zeros"
        else:
            assert (weight.reshape(weight.shape[0], -1, 4) != 0).sum(axis=-1).max() <= 2, f"{name}: not 2:4"
    assert fine_tuned >= baseline - 1.0, \
        f"{pattern}: baseline {baseline:.2f}%, one-shot {one_shot:.2f}%, fine-tuned {fine_tuned:.2f}%"

    # The fine-tuned model, sparsified and compiled, predicts what kiln's interpreter does.
    program = _export(model, test_x)
    sparse = kiln.passes.run(program, f"sparsify{{layout={'csr' if layout == 'sparse_csr' else layout}}}")
    assert sparse.to_mlir().count(f"f32, {layout}") >= len(masks), "sparsify left a pruned weight dense"
    expected = np.asarray(program(test_x))
    assert_close(np.asarray(sparse(test_x)), expected)
    compiled = kiln.compile(sparse, output=tmp_path / "pkg")
    actual = np.asarray(compiled(test_x))
    np.testing.assert_array_equal(np.argmax(actual, axis=1), np.argmax(expected, axis=1))
    assert_close(actual, expected)

"""Training programs compiled to C: the joint forward+backward program of small models covering every backward op
(through its decomposition, kiln/codegen/legalize.py) matches the interpreter, for several batch sizes of one
compiled package."""

from __future__ import annotations

import copy
import shutil

import numpy as np
import pytest

import kiln
import kiln.nn as nn
import kiln.nn.functional as F
from kiln.training import WithLoss
from kiln.ir.interpreter import run_program
from kiln.ir.program import OutputKind
from kiln.ir.registry import REGISTRY
from kiln.passes import joint_program
from kiln.compiler import compile as compile_c
from tests.ir.test_ops import _trace_sample
from tests.runtime.test_c_backend import _op_samples
from tests.torch_oracle import requires_torch, torch

pytestmark = [pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler"), requires_torch]

# The backward ops the joint program emits for kiln.nn's layers: core ops, which the C backend computes through their
# decompositions. (Composite backward ops, like fake quantize's, decompose in kiln.compile's pipeline instead.)
BACKWARD_OPS = sorted(name for name, opdef in REGISTRY.items() if "backward" in opdef.tags and opdef.is_core)



class Tokens(nn.Module):
    """Embeddings (one with a padding row, one scaled by frequency) and layer norm. (The C backend's forward layer
    norm takes the last dim only; the backward of a norm over several dims compiles, see the one-op test below.)"""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(12, 8, padding_idx=0)
        self.scaled = nn.Embedding(12, 8, scale_grad_by_freq=True)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 4)

    def forward(self, tokens):
        return self.head(self.norm(self.embed(tokens) + self.scaled(tokens)).mean(1))


def _images(n: int, size: int, seed: int):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 4, size, size)).astype(np.float32), rng.integers(0, 5, n).astype(np.int64)


def _tokens(n: int, size: int, seed: int):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 12, (n, size)).astype(np.int64), rng.integers(0, 4, n).astype(np.int64)


def _models():
    """(name, model, inputs(batch, size, seed)): together they reach every backward op. `size` is the images' height
    and width, the sequences' length."""
    kiln.manual_seed(0)
    convolutions = nn.Sequential(  # grouped, strided and padded; batch norm on the batch's statistics
        nn.Conv2d(4, 8, 3, stride=2, padding=1, groups=2), nn.BatchNorm2d(8), nn.ReLU(),
        nn.ConvTranspose2d(8, 6, 3, stride=2, padding=1, output_padding=1, groups=2), nn.GELU(),
        nn.Conv2d(6, 6, 3, padding=1, groups=6, bias=False),  # depthwise
        nn.MaxPool2d(3, stride=2, padding=1), nn.GroupNorm(3, 6), nn.AvgPool2d(2, ceil_mode=True),
        nn.AdaptiveAvgPool2d((2, 2)), nn.Flatten(), nn.Linear(24, 5))
    kiln.manual_seed(1)
    pools = nn.Sequential(  # overlapping windows, padding not counted, adaptive pooling that widens
        nn.Conv2d(4, 4, 1), nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False), nn.Tanh(),
        nn.MaxPool2d(2, stride=1, dilation=2), nn.AdaptiveAvgPool2d((5, 3)), nn.Flatten(), nn.Linear(60, 5))
    kiln.manual_seed(2)
    return [("convolutions", convolutions, _images), ("pools", pools, _images), ("tokens", Tokens(), _tokens)]


def _ops_of(program) -> set[str]:
    return {op.name for op in program.nodes()}


def test_the_models_reach_every_backward_op():
    reached = set()
    for _, model, inputs in _models():
        example = tuple(kiln.tensor(a) for a in inputs(3, 12, 0))
        reached |= _ops_of(joint_program(kiln.export(WithLoss(model, F.cross_entropy), example)))
    assert set(BACKWARD_OPS) <= reached, f"no model reaches {sorted(set(BACKWARD_OPS) - reached)}"


@pytest.mark.parametrize("sizes", ["batch", "batch and size"])
@pytest.mark.parametrize("name", [name for name, _, _ in _models()])
def test_joint_program_compiles_and_matches_the_interpreter(name, sizes, tmp_path):
    """One package, compiled with a symbolic batch (and image size or sequence length), run at other sizes: odd sizes
    change how strided windows meet the input's end, which the backward ops' decompositions must follow."""
    _, model, inputs = next(entry for entry in _models() if entry[0] == name)
    batch, size = kiln.Dim("batch", min=2, max=64), kiln.Dim("size", min=8, max=64)
    dims = {0: batch} if sizes == "batch" else {0: batch, 1: size} if name == "tokens" else {0: batch, 2: size, 3: size}
    example = tuple(kiln.tensor(a) for a in inputs(3, 12, 0))
    joint = joint_program(kiln.export(WithLoss(model, F.cross_entropy), example, dynamic_shapes=(dims, {0: batch})))
    compiled = kiln.compile(joint, output=tmp_path / name)
    kinds = [spec.kind for spec in joint.graph_signature.output_specs]
    assert OutputKind.LOSS_OUTPUT in kinds and OutputKind.GRADIENT_TO_PARAMETER in kinds
    specs = joint.graph_signature.output_specs
    for n, length in ((2, 12), (7, 12 if sizes == "batch" else 9)):
        arrays = inputs(n, length, seed=n)
        # Every output in the signature's order: the loss and the gradients as the package returns them, and batch
        # norm's running statistics as the state it keeps (each call from the exported values)
        compiled.reset_state()
        returned, expected = compiled(*arrays), run_program(joint, list(arrays))
        returned = iter(returned if isinstance(returned, tuple) else (returned,))
        state = dict(compiled.named_buffers())
        produced = [state[spec.target] if spec.kind is OutputKind.BUFFER_MUTATION else next(returned)
                    for spec in specs]
        assert next(returned, None) is None and len(produced) == len(expected) == len(kinds)
        for kind, mine, reference in zip(kinds, produced, expected):
            reference = np.asarray(reference)
            assert mine.shape == reference.shape and mine.dtype == reference.dtype, kind
            torch.testing.assert_close(torch.from_numpy(np.asarray(mine)), torch.from_numpy(reference),
                                       msg=lambda message, kind=kind: f"{name}, {n} x {length}, {kind.name}: {message}")


@pytest.mark.parametrize("name", BACKWARD_OPS)
def test_backward_op_compiles_through_its_decomposition(name, tmp_path):
    """Every C-dtype sample of the op (groups, transposed, 1-D and 3-D convolutions, ceil mode, dilation, ...) as a
    one-op program."""
    samples = list(_op_samples(name))
    assert samples, f"{name} has no sample in the C backend's dtypes"
    for index, sample in enumerate(samples):
        program, inputs = _trace_sample(REGISTRY[name], copy.deepcopy(sample), decompose=False)
        produced = compile_c(program, output=tmp_path / f"sample{index}")(*inputs)
        expected = program(*inputs)
        produced = produced if isinstance(produced, tuple) else (produced,)
        expected = expected if isinstance(expected, (tuple, list)) else (expected,)
        for mine, reference in zip(produced, expected):
            torch.testing.assert_close(torch.from_numpy(np.asarray(mine)), torch.from_numpy(np.asarray(reference)),
                                       msg=lambda message: f"{name} {sample}: {message}")

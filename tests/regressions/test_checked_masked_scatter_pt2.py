"""Vision-language models (LLaVA) put the image's features into the prompt with `masked_scatter`, after
`torch._check_tensor_all(n_image_tokens * hidden == features.numel())`. torch.export writes that check as
`_is_all_true`, `item`, `torch.sym_ite` and three `_assert_scalar`s, and a model output's empty field as a None
output: kiln's reader knew none of these. Now the check's bool is read into a 0/1 size the program asserts is 1 (dead
code elimination keeps the read, which only the assertion uses), the None output is a None in the output structure,
and C computes masked_scatter through its decomposition. The interpreter, ONNX and C match torch, and C refuses a
prompt whose image tokens do not match the features, as torch does."""

import pytest

import kiln
from kiln.ir.errors import KilnError
from tests.serde.support import assert_same

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
IMAGE_TOKEN = 9


class ImageIntoPrompt(torch.nn.Module):
    def forward(self, embeds, ids, features):
        mask = ids == IMAGE_TOKEN
        torch._check_tensor_all(mask.sum() * embeds.shape[-1] == features.numel())
        return embeds.masked_scatter(mask.unsqueeze(-1), features), (embeds.sum(), None)


def _inputs(length, image_at):
    ids = torch.ones(2, length, dtype=torch.long)
    for row, start in enumerate(image_at):
        ids[row, start:start + 2] = IMAGE_TOKEN  # two image tokens a row: four features
    return torch.randn(2, length, 4), ids, torch.randn(4, 4)


def test_checked_masked_scatter_loads_and_runs_everywhere(tmp_path):
    seq = torch.export.Dim("seq", min=3, max=32)
    exported = torch.export.export(ImageIntoPrompt(), _inputs(6, (1, 0)), dynamic_shapes=({1: seq}, {1: seq}, None))
    torch.export.save(exported, tmp_path / "model.pt2")
    program = kiln.load(tmp_path / "model.pt2")
    compiled = kiln.compile(program, output=tmp_path / "pkg")
    session = ort.InferenceSession(kiln.onnx.export(program).model_proto.SerializeToString())
    for length, image_at in ((6, (1, 0)), (17, (15, 3)), (3, (0, 1))):
        inputs = _inputs(length, image_at)
        scattered, (total, nothing) = ImageIntoPrompt()(*inputs)
        arrays = [value.numpy() for value in inputs]
        got = program(*arrays)  # the interpreter answers in the model's structure
        assert_same(got[0], scattered)
        assert_same(got[1][0], total)
        assert got[1][1] is None
        got = compiled(*arrays)  # a package returns its arrays
        assert_same(got[0], scattered)
        assert_same(got[1], total)
        onnx_outputs = session.run(None, dict(zip([i.name for i in session.get_inputs()], arrays)))
        assert_same(onnx_outputs[0], scattered)
    embeds, ids, features = _inputs(8, (1, 4))
    ids[1, 7] = IMAGE_TOKEN  # five image tokens for four features
    with pytest.raises(RuntimeError):
        ImageIntoPrompt()(embeds, ids, features)
    with pytest.raises(KilnError, match="the value read from a tensor is 0, but the program was exported for u0 in "
                                        "VR\\[1, 1\\]"):
        program(embeds.numpy(), ids.numpy(), features.numpy())
    with pytest.raises(KilnError, match="the data-dependent size u0 = 0 .* is outside its range \\[1, 1\\]"):
        compiled(embeds.numpy(), ids.numpy(), features.numpy())

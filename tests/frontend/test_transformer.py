"""kiln.nn.MultiheadAttention and the Transformer layers against torch: parameters, reprs, masks, outputs, export.

Each configuration is built in both libraries, torch's weights are copied into kiln with load_state_dict, and
eval-mode outputs must match under assert_close defaults (torch runs its slow path: its parameters require
grad). Exported programs take dynamic batch and sequence dims and must equal kiln eager at the example sizes
and at two others of each dim.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir.errors import KilnError
from tests.torch_oracle import module_pair

torch = pytest.importorskip("torch")

# torch's note that kiln-irrelevant nested-tensor fastpaths are off
pytestmark = pytest.mark.filterwarnings("ignore:enable_nested_tensor is True:UserWarning")

E, HEADS, L, S, N = 8, 2, 3, 4, 2


def _kiln(value):
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return kiln.Tensor(value.detach().numpy().copy())


def _close(kiln_value, torch_value) -> None:
    if torch_value is None:
        assert kiln_value is None
        return
    torch.testing.assert_close(torch.from_numpy(np.asarray(kiln_value.numpy())), torch_value.detach())


def _same_structure(module, reference) -> None:
    assert repr(module) == repr(reference)
    assert [(k, tuple(v.shape)) for k, v in module.state_dict().items()] == \
        [(k, tuple(v.shape)) for k, v in reference.state_dict().items()]


def _bool_mask(*shape: int) -> "torch.Tensor":
    """A random bool mask that never hides the first key, so no row is fully masked."""
    mask = torch.rand(*shape) > 0.6
    mask[..., 0] = False
    return mask


def _float_mask(*shape: int) -> "torch.Tensor":
    return torch.randn(*shape)


# ---------------------------------------------------------------------------------------------
# MultiheadAttention

MHA_CONFIGS = [
    {},
    {"batch_first": True},
    {"bias": False},
    {"add_bias_kv": True},
    {"add_zero_attn": True, "batch_first": True},
    {"kdim": 6, "vdim": 5},
    {"dropout": 0.2, "add_bias_kv": True, "add_zero_attn": True},  # eval mode: no dropout
]
MHA_IDS = ["-".join(f"{k}={v}" for k, v in config.items()) or "default" for config in MHA_CONFIGS]

# (name, attention kind, forward kwargs maker(batch, tgt_len, src_len) -> dict of torch values)
MHA_CALLS = [
    ("self-weights", "self", lambda n, tgt, src: {}),
    ("self-no-weights", "self", lambda n, tgt, src: {"need_weights": False}),
    ("self-per-head-weights", "self", lambda n, tgt, src: {"average_attn_weights": False}),
    ("cross", "cross", lambda n, tgt, src: {}),
    ("cross-no-weights", "cross", lambda n, tgt, src: {"need_weights": False}),
    ("separate-kv", "separate", lambda n, tgt, src: {}),
    ("mask2d-bool", "cross", lambda n, tgt, src: {"attn_mask": _bool_mask(tgt, src)}),
    ("mask2d-float-no-weights", "cross",
     lambda n, tgt, src: {"attn_mask": _float_mask(tgt, src), "need_weights": False}),
    ("mask3d-bool-no-weights", "cross",
     lambda n, tgt, src: {"attn_mask": _bool_mask(n * HEADS, tgt, src), "need_weights": False}),
    ("mask3d-float", "cross", lambda n, tgt, src: {"attn_mask": _float_mask(n * HEADS, tgt, src)}),
    ("padding-bool", "cross", lambda n, tgt, src: {"key_padding_mask": _bool_mask(n, src)}),
    ("padding-float-no-weights", "cross",
     lambda n, tgt, src: {"key_padding_mask": _float_mask(n, src), "need_weights": False}),
    ("both-bool-no-weights", "cross",
     lambda n, tgt, src: {"key_padding_mask": _bool_mask(n, src), "attn_mask": _bool_mask(tgt, src),
                          "need_weights": False}),
    ("both-float", "cross",
     lambda n, tgt, src: {"key_padding_mask": _float_mask(n, src), "attn_mask": _float_mask(n * HEADS, tgt, src)}),
    ("causal-no-weights", "self",
     lambda n, tgt, src: {"attn_mask": torch.nn.Transformer.generate_square_subsequent_mask(tgt), "is_causal": True,
                          "need_weights": False}),
    ("causal-weights", "self",
     lambda n, tgt, src: {"attn_mask": torch.nn.Transformer.generate_square_subsequent_mask(tgt), "is_causal": True}),
]


def _mha_inputs(config: dict, kind: str, batched: bool = True):
    """query, key, value as torch tensors, keeping the identities self-attention relies on."""
    def make(length: int, features: int):
        if not batched:
            return torch.randn(length, features)
        return torch.randn(N, length, features) if config.get("batch_first") else torch.randn(length, N, features)
    kdim, vdim = config.get("kdim", E), config.get("vdim", E)
    query = make(L, E)
    if kind == "self" and kdim == vdim == E:
        return query, query, query
    src_len = L if kind == "self" else S
    if kind in ("self", "cross") and kdim == vdim:
        key = make(src_len, kdim)
        return query, key, key
    return query, make(src_len, kdim), make(src_len, vdim)


def _run_mha(reference, module, query, key, value, call_kwargs):
    """Both modules on the same inputs; kiln sees the same identities between query, key and value."""
    kq = _kiln(query)
    kk = kq if key is query else _kiln(key)
    kv = kk if value is key else _kiln(value)
    expected = reference(query, key, value, **call_kwargs)
    actual = module(kq, kk, kv, **{k: _kiln(v) for k, v in call_kwargs.items()})
    return actual, expected


@pytest.mark.parametrize("config", MHA_CONFIGS, ids=MHA_IDS)
def test_mha_structure_matches_torch(config: dict) -> None:
    reference, module = module_pair("MultiheadAttention", E, HEADS, **config)
    _same_structure(module, reference)
    assert module._qkv_same_embed_dim == reference._qkv_same_embed_dim
    assert module.head_dim == reference.head_dim


@pytest.mark.parametrize("call", MHA_CALLS, ids=[c[0] for c in MHA_CALLS])
@pytest.mark.parametrize("config", MHA_CONFIGS, ids=MHA_IDS)
def test_mha_matches_torch(config: dict, call) -> None:
    _, kind, make_kwargs = call
    reference, module = module_pair("MultiheadAttention", E, HEADS, **config)
    query, key, value = _mha_inputs(config, kind)
    src_len = (key.shape[1] if config.get("batch_first") else key.shape[0])
    actual, expected = _run_mha(reference, module, query, key, value, make_kwargs(N, L, src_len))
    _close(actual[0], expected[0])
    _close(actual[1], expected[1])


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("config", [MHA_CONFIGS[0], MHA_CONFIGS[3], MHA_CONFIGS[5]], ids=lambda c: str(c))
def test_mha_unbatched_matches_torch(config: dict, need_weights: bool) -> None:
    reference, module = module_pair("MultiheadAttention", E, HEADS, **config)
    query, key, value = _mha_inputs(config, "cross", batched=False)
    call = {"need_weights": need_weights, "key_padding_mask": _bool_mask(key.shape[0]),
            "attn_mask": _bool_mask(HEADS, L, key.shape[0])}
    actual, expected = _run_mha(reference, module, query, key, value, call)
    _close(actual[0], expected[0])
    _close(actual[1], expected[1])


def test_mha_initialization_follows_torch() -> None:
    module = kiln.nn.MultiheadAttention(16, 4, add_bias_kv=True)
    bound = (6.0 / (16 + 48)) ** 0.5  # xavier_uniform_ on the (3E, E) in_proj_weight
    weight = module.in_proj_weight.numpy()
    assert np.all(np.abs(weight) <= bound) and weight.std() > bound / 4
    np.testing.assert_array_equal(module.in_proj_bias.numpy(), 0)
    np.testing.assert_array_equal(module.out_proj.bias.numpy(), 0)
    assert module.bias_k.numpy().std() > 0


def test_mha_errors() -> None:
    with pytest.raises(KilnError, match="embed_dim must be divisible by num_heads"):
        kiln.nn.MultiheadAttention(E, 3)
    module = kiln.nn.MultiheadAttention(E, HEADS)
    x = kiln.randn(L, N, E)
    with pytest.raises(KilnError, match="Need attn_mask if specifying the is_causal hint"):
        module(x, x, x, is_causal=True)
    with pytest.raises(KilnError, match="The shape of the 2D attn_mask"):
        module(x, x, x, attn_mask=kiln.zeros(L, L + 1))
    with pytest.raises(KilnError, match="only bool and floating types"):
        module(x, x, x, attn_mask=kiln.zeros(L, L, dtype=kiln.int64))
    with pytest.raises(KilnError, match="expected `key` and `value` to be 3-D"):
        module(x, kiln.randn(L, E), kiln.randn(L, E))
    with pytest.warns(UserWarning, match="mismatched key_padding_mask and attn_mask"):
        module(x, x, x, key_padding_mask=kiln.zeros(N, L, dtype=kiln.bool), attn_mask=kiln.zeros(L, L))


# ---------------------------------------------------------------------------------------------
# Encoder and decoder layers

LAYER_CONFIGS = [
    {},
    {"batch_first": True},
    {"norm_first": True},
    {"activation": "gelu", "layer_norm_eps": 1e-6},
    {"bias": False, "batch_first": True, "norm_first": True},
]
LAYER_IDS = ["-".join(f"{k}={v}" for k, v in config.items()) or "default" for config in LAYER_CONFIGS]


def _layer_input(config: dict, length: int = L, batch: int = N) -> "torch.Tensor":
    return torch.randn(batch, length, E) if config.get("batch_first") else torch.randn(length, batch, E)


ENCODER_MASKS = [
    ("no-mask", lambda: {}),
    ("causal-float", lambda: {"src_mask": torch.nn.Transformer.generate_square_subsequent_mask(L)}),
    ("causal-hint", lambda: {"src_mask": torch.nn.Transformer.generate_square_subsequent_mask(L),
                             "is_causal": True}),
    ("bool-mask-and-padding", lambda: {"src_mask": _bool_mask(L, L), "src_key_padding_mask": _bool_mask(N, L)}),
    ("float-padding", lambda: {"src_key_padding_mask": _float_mask(N, L)}),
]


@pytest.mark.parametrize("masks", ENCODER_MASKS, ids=[m[0] for m in ENCODER_MASKS])
@pytest.mark.parametrize("config", LAYER_CONFIGS, ids=LAYER_IDS)
def test_encoder_layer_matches_torch(config: dict, masks) -> None:
    reference, module = module_pair("TransformerEncoderLayer", E, HEADS, 16, **config)
    _same_structure(module, reference)
    x = _layer_input(config)
    call = masks[1]()
    _close(module(_kiln(x), **{k: _kiln(v) for k, v in call.items()}), reference(x, **call))


def test_encoder_layer_activation_callables() -> None:
    torch.manual_seed(0)
    for torch_activation, kiln_activation in [(torch.nn.functional.gelu, kiln.nn.functional.gelu),
                                              (torch.nn.GELU(), kiln.nn.GELU()), (torch.tanh, kiln.tanh)]:
        reference = torch.nn.TransformerEncoderLayer(E, HEADS, 16, activation=torch_activation).eval()
        module = kiln.nn.TransformerEncoderLayer(E, HEADS, 16, activation=kiln_activation).eval()
        module.load_state_dict(reference.state_dict())
        assert repr(module) == repr(reference)
        assert module.activation_relu_or_gelu == reference.activation_relu_or_gelu
        x = _layer_input({})
        _close(module(_kiln(x)), reference(x))


def test_encoder_layer_unbatched_matches_torch() -> None:
    reference, module = module_pair("TransformerEncoderLayer", E, HEADS, 16)
    x = torch.randn(L, E)
    padding = _bool_mask(L)
    _close(module(_kiln(x), src_key_padding_mask=_kiln(padding)), reference(x, src_key_padding_mask=padding))


def test_training_mode_applies_dropout() -> None:
    kiln.manual_seed(0)
    layer = kiln.nn.TransformerEncoderLayer(E, HEADS, 16, dropout=0.5)
    x = kiln.randn(L, N, E)
    assert not np.array_equal(layer.train()(x).numpy(), layer.eval()(x).numpy())
    attention = kiln.nn.MultiheadAttention(E, HEADS, dropout=0.5)
    trained = attention.train()(x, x, x)[1].numpy()
    assert not np.array_equal(trained, attention.eval()(x, x, x)[1].numpy())
    # dropout=0 in training mode is the eval computation
    plain = kiln.nn.TransformerEncoderLayer(E, HEADS, 16, dropout=0.0)
    np.testing.assert_array_equal(plain.train()(x).numpy(), plain.eval()(x).numpy())


@pytest.mark.parametrize("with_norm", [False, True], ids=["no-norm", "norm"])
@pytest.mark.parametrize("config", [LAYER_CONFIGS[0], LAYER_CONFIGS[1], LAYER_CONFIGS[2]], ids=LAYER_IDS[:3])
def test_encoder_matches_torch(config: dict, with_norm: bool) -> None:
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(E) if with_norm else None
    reference = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(E, HEADS, 16, **config), 2, norm=norm,
                                            enable_nested_tensor=False).eval()
    module = kiln.nn.TransformerEncoder(kiln.nn.TransformerEncoderLayer(E, HEADS, 16, **config), 2,
                                        norm=kiln.nn.LayerNorm(E) if with_norm else None,
                                        enable_nested_tensor=False).eval()
    module.load_state_dict(reference.state_dict())
    _same_structure(module, reference)
    assert module.layers[0] is not module.layers[1]  # deep copies, like torch
    x = _layer_input(config)
    _close(module(_kiln(x)), reference(x))
    causal = torch.nn.Transformer.generate_square_subsequent_mask(L)
    padding = _float_mask(N, L)
    _close(module(_kiln(x), mask=_kiln(causal), src_key_padding_mask=_kiln(padding)),
           reference(x, mask=causal, src_key_padding_mask=padding))
    _close(module(_kiln(x), mask=_kiln(causal)), reference(x, mask=causal))  # causal mask detected eagerly


def test_encoder_layers_are_independent_copies() -> None:
    layer = kiln.nn.TransformerEncoderLayer(E, HEADS, 16)
    encoder = kiln.nn.TransformerEncoder(layer, 3)
    weights = [encoder.layers[i].linear1.weight for i in range(3)]
    assert len({id(w) for w in weights}) == 3
    with kiln.no_grad():  # an in-place update of a parameter, as torch also requires
        weights[0].fill_(1.0)
    assert not np.array_equal(weights[1].numpy(), weights[0].numpy())
    np.testing.assert_array_equal(encoder.layers[1].linear1.weight.numpy(), layer.linear1.weight.numpy())


DECODER_MASKS = [
    ("no-mask", lambda: {}),
    ("causal-and-padding", lambda: {"tgt_mask": torch.nn.Transformer.generate_square_subsequent_mask(L),
                                    "tgt_key_padding_mask": _float_mask(N, L),
                                    "memory_key_padding_mask": _bool_mask(N, S)}),
    ("memory-mask", lambda: {"memory_mask": _float_mask(L, S), "tgt_is_causal": False}),
]


@pytest.mark.parametrize("masks", DECODER_MASKS, ids=[m[0] for m in DECODER_MASKS])
@pytest.mark.parametrize("config", LAYER_CONFIGS, ids=LAYER_IDS)
def test_decoder_layer_matches_torch(config: dict, masks) -> None:
    reference, module = module_pair("TransformerDecoderLayer", E, HEADS, 16, **config)
    _same_structure(module, reference)
    tgt, memory = _layer_input(config), _layer_input(config, S)
    call = masks[1]()
    _close(module(_kiln(tgt), _kiln(memory), **{k: _kiln(v) for k, v in call.items()}),
           reference(tgt, memory, **call))


@pytest.mark.parametrize("config", [LAYER_CONFIGS[0], LAYER_CONFIGS[1], LAYER_CONFIGS[2]], ids=LAYER_IDS[:3])
def test_transformer_matches_torch(config: dict) -> None:
    reference, module = module_pair("Transformer", E, HEADS, 2, 2, 16, **config)
    _same_structure(module, reference)
    src, tgt = _layer_input(config, S), _layer_input(config, L)
    tgt_mask = torch.nn.Transformer.generate_square_subsequent_mask(L)
    np.testing.assert_array_equal(kiln.nn.Transformer.generate_square_subsequent_mask(L).numpy(), tgt_mask.numpy())
    _close(module(_kiln(src), _kiln(tgt), tgt_mask=_kiln(tgt_mask)), reference(src, tgt, tgt_mask=tgt_mask))


# ---------------------------------------------------------------------------------------------
# Export with dynamic batch and sequence dims


def _assert_same(program_out, eager_out) -> None:
    program_leaves = program_out if isinstance(program_out, (tuple, list)) else [program_out]
    eager_leaves = eager_out if isinstance(eager_out, (tuple, list)) else [eager_out]
    eager_leaves = [leaf for leaf in eager_leaves if leaf is not None]
    assert len(program_leaves) == len(eager_leaves)
    for got, want in zip(program_leaves, eager_leaves):
        torch.testing.assert_close(torch.from_numpy(got.numpy()), torch.from_numpy(want.numpy()))


def _sizes_to_check(example_batch: int, example_seq: int) -> list[tuple[int, int]]:
    """The example, then two other values of each dim."""
    return [(example_batch, example_seq), (1, example_seq), (5, example_seq), (example_batch, 1),
            (example_batch, 6), (3, 5)]


class _SelfAttention(kiln.nn.Module):
    def __init__(self, attention: kiln.nn.MultiheadAttention, need_weights: bool):
        super().__init__()
        self.attention = attention
        self.need_weights = need_weights

    def forward(self, x, key_padding_mask, attn_mask):
        output, weights = self.attention(x, x, x, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                                         need_weights=self.need_weights)
        return (output, weights) if self.need_weights else output


@pytest.mark.parametrize("need_weights", [True, False], ids=["weights", "no-weights"])
@pytest.mark.parametrize("config", [MHA_CONFIGS[0], MHA_CONFIGS[1], MHA_CONFIGS[4], MHA_CONFIGS[3]],
                         ids=lambda c: str(c))
def test_mha_export_with_dynamic_batch_and_sequence(config: dict, need_weights: bool) -> None:
    _, attention = module_pair("MultiheadAttention", E, HEADS, **config)
    module = _SelfAttention(attention, need_weights).eval()
    batch_first = config.get("batch_first", False)
    batch, seq = kiln.Dim("batch"), kiln.Dim("seq")

    def inputs(n: int, length: int) -> tuple:
        x = kiln.randn(n, length, E) if batch_first else kiln.randn(length, n, E)
        return x, _kiln(_bool_mask(n, length)), _kiln(_bool_mask(length, length))

    x_dims = {0: batch, 1: seq} if batch_first else {0: seq, 1: batch}
    program = kiln.export(module, inputs(N, L),
                          dynamic_shapes=(x_dims, {0: batch, 1: seq}, {0: seq, 1: seq}))
    for n, length in _sizes_to_check(N, L):
        args = inputs(n, length)
        _assert_same(program(*args), module(*args))


class _Encode(kiln.nn.Module):
    def __init__(self, encoder: kiln.nn.Module, is_causal: bool):
        super().__init__()
        self.encoder = encoder
        self.is_causal = is_causal

    def forward(self, src, mask, padding):
        return self.encoder(src, mask, padding, is_causal=self.is_causal)


ENCODER_EXPORTS = [(LAYER_CONFIGS[0], False), (LAYER_CONFIGS[1], False), (LAYER_CONFIGS[3], False),
                   (LAYER_CONFIGS[2], True)]


@pytest.mark.parametrize("config,is_causal", ENCODER_EXPORTS, ids=lambda v: str(v))
@pytest.mark.parametrize("stacked", [False, True], ids=["layer", "encoder"])
def test_encoder_export_with_dynamic_batch_and_sequence(config: dict, is_causal: bool, stacked: bool) -> None:
    kiln.manual_seed(0)
    layer = kiln.nn.TransformerEncoderLayer(E, HEADS, 16, **config)
    inner = kiln.nn.TransformerEncoder(layer, 2, norm=kiln.nn.LayerNorm(E)) if stacked else layer
    module = _Encode(inner, is_causal).eval()
    batch_first = config.get("batch_first", False)
    batch, seq = kiln.Dim("batch"), kiln.Dim("seq")

    def inputs(n: int, length: int) -> tuple:
        x = kiln.randn(n, length, E) if batch_first else kiln.randn(length, n, E)
        # A float causal mask and a float padding mask (torch warns when their dtypes differ).
        return x, kiln.nn.Transformer.generate_square_subsequent_mask(length), _kiln(_float_mask(n, length))

    x_dims = {0: batch, 1: seq} if batch_first else {0: seq, 1: batch}
    program = kiln.export(module, inputs(N, L), dynamic_shapes=(x_dims, {0: seq, 1: seq}, {0: batch, 1: seq}))
    for n, length in _sizes_to_check(N, L):
        args = inputs(n, length)
        _assert_same(program(*args), module(*args))


class _Decode(kiln.nn.Module):
    def __init__(self, decoder: kiln.nn.Module):
        super().__init__()
        self.decoder = decoder

    def forward(self, tgt, memory, tgt_mask):
        return self.decoder(tgt, memory, tgt_mask=tgt_mask)


def test_decoder_export_with_dynamic_batch_and_sequences() -> None:
    kiln.manual_seed(0)
    decoder = kiln.nn.TransformerDecoder(kiln.nn.TransformerDecoderLayer(E, HEADS, 16, batch_first=True), 2)
    module = _Decode(decoder).eval()
    batch, tgt_len, src_len = kiln.Dim("batch"), kiln.Dim("tgt_len"), kiln.Dim("src_len")

    def inputs(n: int, length: int, memory_length: int) -> tuple:
        return (kiln.randn(n, length, E), kiln.randn(n, memory_length, E),
                kiln.nn.Transformer.generate_square_subsequent_mask(length))

    program = kiln.export(module, inputs(N, L, S), dynamic_shapes=(
        {0: batch, 1: tgt_len}, {0: batch, 1: src_len}, {0: tgt_len, 1: tgt_len}))
    for n, length, memory_length in [(N, L, S), (1, L, S), (4, 2, 7), (N, 5, 1), (3, 1, S)]:
        args = inputs(n, length, memory_length)
        _assert_same(program(*args), module(*args))

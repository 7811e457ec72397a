"""Hugging Face `transformers` architectures from small configs with random weights (no download), for the tests and
benchmarks/hf_sweep.py: each entry builds the model (eval mode, seeded), makes inputs at (batch, length), and names
the dynamic dims of each input."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

SIZES = [(2, 8), (3, 13)]  # (batch, length): the example and a second size, both inside the dims' ranges


@dataclass
class Architecture:
    name: str
    build: Callable[[], Any]  # -> torch.nn.Module in eval mode
    inputs: Callable[[int, int], dict[str, Any]]  # (batch, length) -> keyword inputs
    dims: dict[str, dict[int, str]]  # input name -> {axis: dim name}

    def dynamic_shapes(self) -> dict[str, dict[int, Any]]:
        import torch
        limits = {"batch": (1, 16), "seq": (2, 32)}
        made = {name: torch.export.Dim(name, min=low, max=high) for name, (low, high) in limits.items()}
        return {key: {axis: made[dim] for axis, dim in axes.items()} for key, axes in self.dims.items()}

    def model(self) -> Any:
        import torch
        torch.manual_seed(0)
        return self.build().eval()

    def make_inputs(self, batch: int, length: int) -> dict[str, Any]:
        import torch
        torch.manual_seed(1000 * batch + length)
        return self.inputs(batch, length)


def _tokens(*keys: str, vocab: int = 100, mask: str | None = None) -> Callable[[int, int], dict[str, Any]]:
    def make(batch: int, length: int) -> dict[str, Any]:
        import torch
        made = {key: torch.randint(3, vocab, (batch, length)) for key in keys}
        if mask is not None:  # the first sequence is padded at its end, so the mask matters
            made[mask] = torch.ones(batch, length, dtype=torch.long)
            made[mask][0, length - 3:] = 0
        return made
    return make


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=64,
                                      use_cache=False))


def _bert():
    from transformers import BertConfig, BertModel
    return BertModel(BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                vocab_size=100, max_position_embeddings=64))


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=128, vocab_size=100,
                                        max_position_embeddings=64, use_cache=False))


def _t5():
    from transformers import T5Config, T5Model
    return T5Model(T5Config(num_layers=1, num_decoder_layers=1, d_model=32, d_ff=64, num_heads=4, d_kv=8,
                            vocab_size=100, use_cache=False))


def _distilbert():
    from transformers import DistilBertConfig, DistilBertModel
    return DistilBertModel(DistilBertConfig(n_layers=1, dim=32, hidden_dim=64, n_heads=4, vocab_size=100,
                                            max_position_embeddings=64))


def _vit():
    from transformers import ViTConfig, ViTModel
    return ViTModel(ViTConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=4, intermediate_size=64,
                              image_size=32, patch_size=8))


def _whisper():
    from transformers import WhisperConfig, WhisperModel
    return WhisperModel(WhisperConfig(encoder_layers=1, decoder_layers=1, d_model=32, encoder_ffn_dim=64,
                                      decoder_ffn_dim=64, encoder_attention_heads=4, decoder_attention_heads=4,
                                      vocab_size=100, num_mel_bins=16, max_source_positions=32,
                                      max_target_positions=32, use_cache=False, pad_token_id=0, bos_token_id=1,
                                      eos_token_id=2, decoder_start_token_id=1))


def _pixels(batch: int, length: int) -> dict[str, Any]:
    import torch
    return {"pixel_values": torch.randn(batch, 3, 32, 32)}


def _audio_features(batch: int, length: int) -> dict[str, Any]:
    import torch
    return {"input_features": torch.randn(batch, 16, 64), "decoder_input_ids": torch.randint(3, 100, (batch, length))}


SEQUENCE = {0: "batch", 1: "seq"}
ARCHITECTURES = {a.name: a for a in [
    Architecture("gpt2", _gpt2, _tokens("input_ids"), {"input_ids": SEQUENCE}),
    Architecture("bert", _bert, _tokens("input_ids", mask="attention_mask"),
                 {"input_ids": SEQUENCE, "attention_mask": SEQUENCE}),
    Architecture("llama", _llama, _tokens("input_ids"), {"input_ids": SEQUENCE}),
    Architecture("t5", _t5, _tokens("input_ids", "decoder_input_ids"),
                 {"input_ids": SEQUENCE, "decoder_input_ids": SEQUENCE}),
    Architecture("distilbert", _distilbert, _tokens("input_ids", mask="attention_mask"),
                 {"input_ids": SEQUENCE, "attention_mask": SEQUENCE}),
    Architecture("vit", _vit, _pixels, {"pixel_values": {0: "batch"}}),
    Architecture("whisper", _whisper, _audio_features, {"input_features": {0: "batch"},
                                                        "decoder_input_ids": SEQUENCE}),
]}

"""Hugging Face `transformers` architectures from small configs with random weights (no download), for the tests and
benchmarks/hf_sweep.py: each entry builds the model (eval mode, seeded), makes inputs at (batch, length), and names
the dynamic dims of each input. Also the two halves of the end-to-end check both share: `export_to_folder` (torch:
export, save, inputs) and `run_in_kiln` (a process where torch cannot be imported loads the .pt2 and runs each
stage, writing outputs, errors and timings)."""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tests.no_torch import without_torch

ROOT = Path(__file__).resolve().parents[2]
SIZES = [(2, 8), (3, 13)]  # (batch, length): the example and a second size, both inside the dims' ranges
# each dim's (min, max). Waveforms start at 320 samples: from 80 or 100, torch cannot prove its guard on wav2vec2's
# feature-encoder length ((samples // 10 - 1)^2 > 1) for the whole range, though it holds from 30 on
LIMITS = {"batch": (1, 16), "seq": (2, 32), "samples": (320, 1280), "frames": (8, 128)}


@dataclass
class Architecture:
    name: str
    build: Callable[[], Any]  # -> torch.nn.Module in eval mode
    inputs: Callable[[int, int], dict[str, Any]]  # (batch, length) -> keyword inputs
    dims: dict[str, dict[int, str]]  # input name -> {axis: dim name}
    limits: dict[str, tuple[int, int]] = field(default_factory=dict)  # a dim's (min, max) where LIMITS' fails
    sizes: list[tuple[int, int]] = field(default_factory=lambda: list(SIZES))  # where a dim must stay static

    def dynamic_shapes(self) -> dict[str, dict[int, Any]]:
        import torch
        limits = {**LIMITS, **self.limits}
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


def _hf(model: str, config: str, *, randomize: tuple[str, ...] = (), **options: Any) -> Callable[[], Any]:
    """A builder for `transformers.<model>(transformers.<config>(**options))`. `randomize` names parameters (by suffix)
    that transformers initializes to zeros and that must not be: a zero router scores every expert alike, and which
    of the tied experts topk keeps is then torch's sort order, not the model's."""
    def build():
        import torch
        import transformers
        built = getattr(transformers, model)(getattr(transformers, config)(**options))
        with torch.no_grad():
            for name, parameter in built.named_parameters():
                if name.endswith(randomize):
                    parameter.normal_(0, 0.2)
        return built
    return build


# Small shapes shared by most text models: two layers, hidden 64, 4 heads, vocabulary 100.
TEXT = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=100,
            max_position_embeddings=64)
DECODER = dict(TEXT, use_cache=False)
LLAMA_LIKE = dict(DECODER, num_key_value_heads=2)
SLIDING = dict(LLAMA_LIKE, head_dim=16, sliding_window=4)  # local attention in some layers
MOE = dict(num_experts_per_tok=2, experts_implementation="batched_mm")  # experts as gathers + bmm (mixtral, below)
# The recent decoders (below): every expert or head option their configs name, in one dict; each config reads its own
EXPERTS = dict(LLAMA_LIKE, **MOE, head_dim=16, num_local_experts=4, num_experts=4, n_routed_experts=4,
               moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, pad_token_id=0, bos_token_id=1,
               eos_token_id=2)
SEQ2SEQ = dict(encoder_layers=1, decoder_layers=1, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64,
               encoder_attention_heads=4, decoder_attention_heads=4, vocab_size=100, max_position_embeddings=64,
               use_cache=False, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
VISION = dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=4, intermediate_size=64, image_size=32,
              patch_size=8)
AUDIO = dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=32,
             conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
             num_conv_pos_embedding_groups=4)


def _pixels(batch: int, length: int) -> dict[str, Any]:
    import torch
    return {"pixel_values": torch.randn(batch, 3, 32, 32)}


def _image_prompt(tokens: int, images: tuple[int, ...] = ()) -> Callable[[int, int], dict[str, Any]]:
    """Inputs of a vision-language model: a prompt whose tokens from 2 on stand for its 32x32 image (token 99, as
    many as the model makes of the image's features), and the image (`images`: a dim of images per prompt)."""
    def make(batch: int, length: int) -> dict[str, Any]:
        import torch
        input_ids = torch.randint(3, 90, (batch, length))
        input_ids[:, 2:2 + tokens] = 99
        return {"input_ids": input_ids, "pixel_values": torch.randn(batch, *images, 3, 32, 32)}
    return make


def _pixels28(batch: int, length: int) -> dict[str, Any]:
    import torch
    return {"pixel_values": torch.randn(batch, 3, 28, 28)}  # two 14-pixel patches a side


def _pixels64(batch: int, length: int) -> dict[str, Any]:
    import torch
    return {"pixel_values": torch.randn(batch, 3, 64, 64)}


def _video(batch: int, length: int) -> dict[str, Any]:
    import torch
    return {"pixel_values": torch.randn(batch, 4, 3, 32, 32)}


def _audio_features(batch: int, length: int) -> dict[str, Any]:
    import torch
    return {"input_features": torch.randn(batch, 16, 64), "decoder_input_ids": torch.randint(3, 100, (batch, length))}


def _waveform(batch: int, length: int) -> dict[str, Any]:
    import torch
    return {"input_values": torch.randn(batch, 40 * length)}


def _features(batch: int, length: int) -> dict[str, Any]:
    import torch
    return {"input_features": torch.randn(batch, 4 * length, 16)}


def _series(batch: int, length: int) -> dict[str, Any]:
    import torch
    return {"past_values": torch.randn(batch, 32, 3)}  # 32 steps of 3 channels


def _clip_text(batch: int, length: int) -> dict[str, Any]:
    import torch
    ids = torch.randint(3, 99, (batch, length))
    ids[:, -1] = 99  # the end token, which CLIP's text pooling finds by argmax
    return {"input_ids": ids}


def _waveform_and_tokens(batch: int, length: int) -> dict[str, Any]:
    import torch
    # 4000 samples: Moonshine's three strided convolutions leave 9 frames
    return {"input_values": torch.randn(batch, 4000), "decoder_input_ids": torch.randint(3, 100, (batch, length))}


def _spectrogram(batch: int, length: int) -> dict[str, Any]:
    import torch
    return {"input_values": torch.randn(batch, 64, 16)}  # 64 frames of 16 mel bins


def _mel_image(batch: int, length: int) -> dict[str, Any]:
    import torch
    return {"input_features": torch.randn(batch, 1, 64, 16)}  # CLAP: one channel of 64 frames x 16 mel bins


def _filterbank(batch: int, length: int) -> dict[str, Any]:
    import torch
    return {"input_features": torch.randn(batch, 4 * length, 16),
            "decoder_input_ids": torch.randint(3, 100, (batch, length))}


SEQUENCE = {0: "batch", 1: "seq"}
TOKENS = {"input_ids": SEQUENCE}
MASKED = {"input_ids": SEQUENCE, "attention_mask": SEQUENCE}
ENCODER_DECODER = {"input_ids": SEQUENCE, "decoder_input_ids": SEQUENCE}
PIXELS = {"pixel_values": {0: "batch"}}
IMAGE_PROMPT = {"input_ids": {1: "seq"}, "pixel_values": {}}  # the batch stays: the image-token check fixes it
# vision towers of the vision-language models: 32x32 images in 8x8 patches
CLIP_VISION = dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, image_size=32, patch_size=8)
SIGLIP_VISION = dict(CLIP_VISION, model_type="siglip_vision_model")
WAVEFORM = {"input_values": {0: "batch", 1: "samples"}}
BATCH_ONLY = {"input_ids": {0: "batch"}, "attention_mask": {0: "batch"}}
STATIC_LENGTH = {"input_ids": {0: "batch"}}


def _encoder(name: str, model: str, config: str, **options: Any) -> Architecture:
    return Architecture(name, _hf(model, config, **options), _tokens("input_ids", mask="attention_mask"), MASKED)


def _decoder(name: str, model: str, config: str, **options: Any) -> Architecture:
    return Architecture(name, _hf(model, config, **options), _tokens("input_ids"), TOKENS)


def _seq2seq(name: str, model: str, config: str, **options: Any) -> Architecture:
    return Architecture(name, _hf(model, config, **options), _tokens("input_ids", "decoder_input_ids"),
                        ENCODER_DECODER)


def _vision(name: str, model: str, config: str, **options: Any) -> Architecture:
    return Architecture(name, _hf(model, config, **options), _pixels, PIXELS)


def _audio(name: str, model: str, config: str, **options: Any) -> Architecture:
    return Architecture(name, _hf(model, config, **options), _waveform, WAVEFORM)


ARCHITECTURES = {a.name: a for a in [
    # text encoders
    Architecture("bert", _bert, _tokens("input_ids", mask="attention_mask"), MASKED),
    Architecture("distilbert", _distilbert, _tokens("input_ids", mask="attention_mask"), MASKED),
    _encoder("roberta", "RobertaModel", "RobertaConfig", **dict(TEXT, max_position_embeddings=80)),
    _encoder("xlm-roberta", "XLMRobertaModel", "XLMRobertaConfig", **dict(TEXT, max_position_embeddings=80)),
    _encoder("camembert", "CamembertModel", "CamembertConfig", **dict(TEXT, max_position_embeddings=80)),
    _encoder("albert", "AlbertModel", "AlbertConfig", **dict(TEXT, embedding_size=32)),
    _encoder("electra", "ElectraModel", "ElectraConfig", **dict(TEXT, embedding_size=32)),
    _encoder("deberta", "DebertaModel", "DebertaConfig", **TEXT),
    _encoder("deberta-v2", "DebertaV2Model", "DebertaV2Config", **TEXT),
    _encoder("mpnet", "MPNetModel", "MPNetConfig", **dict(TEXT, max_position_embeddings=80)),
    _encoder("megatron-bert", "MegatronBertModel", "MegatronBertConfig", **TEXT),
    _encoder("convbert", "ConvBertModel", "ConvBertConfig", **dict(TEXT, embedding_size=64)),
    _encoder("roformer", "RoFormerModel", "RoFormerConfig", **TEXT),
    _encoder("ernie", "ErnieModel", "ErnieConfig", **TEXT),
    # MobileBERT's trigram embedding pads seq - 1 positions, and torch guards seq - 1 != 1: seq starts at 3
    Architecture("mobilebert", _hf("MobileBertModel", "MobileBertConfig", **dict(
        TEXT, embedding_size=32, intra_bottleneck_size=32, num_feedforward_networks=2)),
        _tokens("input_ids", mask="attention_mask"), MASKED, limits={"seq": (3, 32)}),
    _encoder("data2vec-text", "Data2VecTextModel", "Data2VecTextConfig", **dict(TEXT, max_position_embeddings=80)),
    _encoder("modernbert", "ModernBertModel", "ModernBertConfig", **dict(TEXT, pad_token_id=0, bos_token_id=1,
                                                                          eos_token_id=2, cls_token_id=1,
                                                                          sep_token_id=2)),
    _decoder("fnet", "FNetModel", "FNetConfig", **dict(TEXT, use_tpu_fourier_optimizations=False)),  # no mask
    _encoder("squeezebert", "SqueezeBertModel", "SqueezeBertConfig", **dict(TEXT, embedding_size=64, q_groups=2,
                                                                            k_groups=2, v_groups=2,
                                                                            post_attention_groups=2,
                                                                            intermediate_groups=4, output_groups=2)),
    _encoder("rembert", "RemBertModel", "RemBertConfig", **dict(TEXT, input_embedding_size=32,
                                                                output_embedding_size=32)),
    _encoder("esm", "EsmModel", "EsmConfig", **dict(TEXT, pad_token_id=1, position_embedding_type="rotary")),
    _encoder("roberta-prelayernorm", "RobertaPreLayerNormModel", "RobertaPreLayerNormConfig",
             **dict(TEXT, max_position_embeddings=80)),
    _encoder("xlm", "XLMModel", "XLMConfig", n_layers=2, emb_dim=64, n_heads=4, vocab_size=100,
             max_position_embeddings=64),
    # torch specializes Funnel's pooled length, and cannot prove XLNet's relative-position guard
    # ((2 * seq - 1) % seq != 0) over a range: their batch stays dynamic and both sizes share one length
    Architecture("funnel", _hf("FunnelBaseModel", "FunnelConfig", block_sizes=[1, 1], d_model=32, n_head=4, d_head=8,
                               d_inner=64, vocab_size=100), _tokens("input_ids", mask="attention_mask"),
                 BATCH_ONLY, sizes=[(2, 8), (3, 8)]),
    Architecture("xlnet", _hf("XLNetModel", "XLNetConfig", n_layer=2, d_model=64, n_head=4, d_inner=128,
                              vocab_size=100), _tokens("input_ids", mask="attention_mask"), BATCH_ONLY,
                 sizes=[(2, 8), (3, 8)]),
    # torch.export specializes CANINE's character length to the example's ("Constraints violated (seq)")
    Architecture("canine", _hf("CanineModel", "CanineConfig", **dict(TEXT, downsampling_rate=2, num_hash_functions=2,
                                                                      num_hash_buckets=64, local_transformer_stride=4)),
                 _tokens("input_ids", mask="attention_mask"), BATCH_ONLY, sizes=[(2, 8), (3, 8)]),
    _encoder("eurobert", "EuroBertModel", "EuroBertConfig", **dict(TEXT, num_key_value_heads=2, pad_token_id=0)),
    _encoder("nomic-bert", "NomicBertModel", "NomicBertConfig", **TEXT),
    Architecture("clip-text", _hf("CLIPTextModel", "CLIPTextConfig", **dict(TEXT, eos_token_id=99)), _clip_text,
                 TOKENS),
    _encoder("big-bird", "BigBirdModel", "BigBirdConfig", **dict(TEXT, attention_type="original_full")),
    _encoder("yoso", "YosoModel", "YosoConfig", **dict(TEXT, use_expectation=True, max_position_embeddings=80)),
    _encoder("luke", "LukeModel", "LukeConfig", **dict(TEXT, entity_vocab_size=10, entity_emb_size=16,
                                                       max_position_embeddings=80)),
    _encoder("ibert", "IBertModel", "IBertConfig", **dict(TEXT, max_position_embeddings=80, quant_mode=False)),
    _encoder("flaubert", "FlaubertModel", "FlaubertConfig", n_layers=2, emb_dim=64, n_heads=4, vocab_size=100,
             max_position_embeddings=64),
    _encoder("splinter", "SplinterModel", "SplinterConfig", **TEXT),
    _encoder("layoutlm", "LayoutLMModel", "LayoutLMConfig", **TEXT),
    _encoder("markuplm", "MarkupLMModel", "MarkupLMConfig", **dict(TEXT, max_position_embeddings=80)),
    # X-MOD's language adapters pick rows by a language mask: data-dependent sizes, which C reads while running
    _encoder("xmod", "XmodModel", "XmodConfig", **dict(TEXT, max_position_embeddings=80, default_language="en_XX",
                                                       languages=["en_XX"])),
    _decoder("bert-generation", "BertGenerationEncoder", "BertGenerationConfig", **TEXT),
    _decoder("xlm-roberta-xl", "XLMRobertaXLModel", "XLMRobertaXLConfig", **dict(TEXT, max_position_embeddings=80)),
    # text decoders
    Architecture("gpt2", _gpt2, _tokens("input_ids"), TOKENS),
    Architecture("llama", _llama, _tokens("input_ids"), TOKENS),
    _decoder("mistral", "MistralForCausalLM", "MistralConfig", **LLAMA_LIKE),
    _decoder("qwen2", "Qwen2ForCausalLM", "Qwen2Config", **LLAMA_LIKE),
    _decoder("qwen3", "Qwen3ForCausalLM", "Qwen3Config", **dict(LLAMA_LIKE, head_dim=16)),
    _decoder("phi", "PhiForCausalLM", "PhiConfig", **DECODER),
    _decoder("phi3", "Phi3ForCausalLM", "Phi3Config", **dict(LLAMA_LIKE, pad_token_id=0)),
    _decoder("gemma", "GemmaForCausalLM", "GemmaConfig", **dict(LLAMA_LIKE, head_dim=16)),
    _decoder("gemma2", "Gemma2ForCausalLM", "Gemma2Config", **dict(LLAMA_LIKE, head_dim=16, sliding_window=4)),
    _decoder("gpt-neo", "GPTNeoForCausalLM", "GPTNeoConfig",
             num_layers=2, attention_types=[[["global", "local"], 1]], hidden_size=64, num_heads=4, vocab_size=100,
             max_position_embeddings=64, window_size=4, use_cache=False),
    _decoder("gpt-j", "GPTJForCausalLM", "GPTJConfig", n_layer=2, n_embd=64, n_head=4, rotary_dim=8, vocab_size=100,
             n_positions=64, use_cache=False),
    _decoder("opt", "OPTForCausalLM", "OPTConfig", num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
             ffn_dim=128, vocab_size=100, max_position_embeddings=64, word_embed_proj_dim=64, use_cache=False),
    _decoder("bloom", "BloomForCausalLM", "BloomConfig", n_layer=2, hidden_size=64, n_head=4, vocab_size=100,
             use_cache=False),
    _decoder("falcon", "FalconForCausalLM", "FalconConfig", num_hidden_layers=2, hidden_size=64,
             num_attention_heads=4, vocab_size=100, use_cache=False),
    _decoder("stablelm", "StableLmForCausalLM", "StableLmConfig", **LLAMA_LIKE),
    _decoder("codegen", "CodeGenForCausalLM", "CodeGenConfig", n_layer=2, n_embd=64, n_head=4, rotary_dim=8,
             vocab_size=100, n_positions=64, n_ctx=64, use_cache=False),
    _decoder("gpt-neox", "GPTNeoXForCausalLM", "GPTNeoXConfig", **DECODER),
    _decoder("gpt-bigcode", "GPTBigCodeForCausalLM", "GPTBigCodeConfig", n_layer=2, n_embd=64, n_head=4,
             vocab_size=100, n_positions=64, use_cache=False),
    _decoder("olmo", "OlmoForCausalLM", "OlmoConfig", **dict(LLAMA_LIKE, pad_token_id=0)),
    _decoder("starcoder2", "Starcoder2ForCausalLM", "Starcoder2Config", **LLAMA_LIKE),
    _decoder("biogpt", "BioGptForCausalLM", "BioGptConfig", **DECODER),
    _decoder("xglm", "XGLMForCausalLM", "XGLMConfig", num_layers=2, d_model=64, attention_heads=4, ffn_dim=128,
             vocab_size=100, max_position_embeddings=64, use_cache=False),
    _decoder("cohere", "CohereForCausalLM", "CohereConfig", **LLAMA_LIKE),
    _decoder("granite", "GraniteForCausalLM", "GraniteConfig", **LLAMA_LIKE),
    # experts through transformers' batched_mm (gathers + bmm): its default grouped_mm path exports as the custom op
    # transformers::grouped_mm_fallback, which no .pt2 reader outside transformers knows
    _decoder("mixtral", "MixtralForCausalLM", "MixtralConfig",
             **dict(LLAMA_LIKE, num_local_experts=4, num_experts_per_tok=2, experts_implementation="batched_mm")),
    _decoder("qwen2-moe", "Qwen2MoeForCausalLM", "Qwen2MoeConfig",  # with a shared expert and its sigmoid gate
             **dict(LLAMA_LIKE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                    shared_expert_intermediate_size=96, experts_implementation="batched_mm")),
    _decoder("qwen3-moe", "Qwen3MoeForCausalLM", "Qwen3MoeConfig",
             **dict(LLAMA_LIKE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                    experts_implementation="batched_mm")),
    _decoder("olmoe", "OlmoeForCausalLM", "OlmoeConfig",
             **dict(LLAMA_LIKE, num_experts=4, num_experts_per_tok=2, experts_implementation="batched_mm")),
    _decoder("gemma3", "Gemma3ForCausalLM", "Gemma3TextConfig", **SLIDING),
    _decoder("glm", "GlmForCausalLM", "GlmConfig", **dict(LLAMA_LIKE, head_dim=16, pad_token_id=0)),
    _decoder("glm4", "Glm4ForCausalLM", "Glm4Config", **dict(LLAMA_LIKE, head_dim=16, pad_token_id=0)),
    _decoder("helium", "HeliumForCausalLM", "HeliumConfig", **dict(LLAMA_LIKE, head_dim=16)),
    _decoder("olmo2", "Olmo2ForCausalLM", "Olmo2Config", **dict(LLAMA_LIKE, pad_token_id=0)),
    _decoder("olmo3", "Olmo3ForCausalLM", "Olmo3Config", **dict(SLIDING, pad_token_id=0)),
    _decoder("cohere2", "Cohere2ForCausalLM", "Cohere2Config", **SLIDING),
    _decoder("smollm3", "SmolLM3ForCausalLM", "SmolLM3Config", **dict(LLAMA_LIKE, pad_token_id=0)),
    _decoder("exaone4", "Exaone4ForCausalLM", "Exaone4Config", **SLIDING),
    _decoder("ernie4.5", "Ernie4_5ForCausalLM", "Ernie4_5Config", **dict(LLAMA_LIKE, head_dim=16)),
    _decoder("arcee", "ArceeForCausalLM", "ArceeConfig", **LLAMA_LIKE),
    _decoder("apertus", "ApertusForCausalLM", "ApertusConfig", **LLAMA_LIKE),
    _decoder("seed-oss", "SeedOssForCausalLM", "SeedOssConfig", **dict(LLAMA_LIKE, head_dim=16)),
    _decoder("ministral", "MinistralForCausalLM", "MinistralConfig", **SLIDING),
    _decoder("vaultgemma", "VaultGemmaForCausalLM", "VaultGemmaConfig", **SLIDING),
    _decoder("diffllama", "DiffLlamaForCausalLM", "DiffLlamaConfig", **LLAMA_LIKE),
    _decoder("persimmon", "PersimmonForCausalLM", "PersimmonConfig", **DECODER),
    _decoder("nemotron", "NemotronForCausalLM", "NemotronConfig", **LLAMA_LIKE),
    _decoder("bitnet", "BitNetForCausalLM", "BitNetConfig", **LLAMA_LIKE),
    _decoder("lfm2", "Lfm2ForCausalLM", "Lfm2Config", **dict(LLAMA_LIKE, layer_types=["conv", "full_attention"])),
    _decoder("mpt", "MptForCausalLM", "MptConfig", n_layers=2, d_model=64, n_heads=4, vocab_size=100, max_seq_len=64,
             expansion_ratio=2, use_cache=False),
    _decoder("openai-gpt", "OpenAIGPTLMHeadModel", "OpenAIGPTConfig", n_layer=2, n_embd=64, n_head=4, vocab_size=100,
             n_positions=64),
    _decoder("ctrl", "CTRLLMHeadModel", "CTRLConfig", n_layer=2, n_embd=64, n_head=4, dff=128, vocab_size=100,
             n_positions=64, use_cache=False),
    _decoder("granitemoe", "GraniteMoeForCausalLM", "GraniteMoeConfig", **dict(LLAMA_LIKE, num_local_experts=4, **MOE)),
    _decoder("phimoe", "PhimoeForCausalLM", "PhimoeConfig", **dict(LLAMA_LIKE, num_local_experts=4, **MOE)),
    _decoder("deepseek-v3", "DeepseekV3ForCausalLM", "DeepseekV3Config", **dict(
        LLAMA_LIKE, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=16, n_routed_experts=4, n_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1,
        n_group=1, topk_group=1, **MOE)),
    _decoder("gpt-oss", "GptOssForCausalLM", "GptOssConfig", **dict(SLIDING, num_local_experts=4, **MOE)),
    _decoder("hunyuan", "HunYuanDenseV1ForCausalLM", "HunYuanDenseV1Config", **dict(LLAMA_LIKE, head_dim=16)),
    _decoder("minicpm3", "MiniCPM3ForCausalLM", "MiniCPM3Config", **dict(  # multi-head latent attention
        LLAMA_LIKE, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=16)),
    _decoder("gemma3n", "Gemma3nForCausalLM", "Gemma3nTextConfig", **dict(  # AltUp, Laurel, per-layer inputs
        SLIDING, num_kv_shared_layers=0, laurel_rank=8, altup_num_inputs=2, hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=100, activation_sparsity_pattern=[0.0, 0.0],
        layer_types=["sliding_attention", "full_attention"])),
    _decoder("jetmoe", "JetMoeForCausalLM", "JetMoeConfig", hidden_size=64, num_hidden_layers=2, num_key_value_heads=2,
             kv_channels=16, intermediate_size=64, vocab_size=100, num_local_experts=4, num_experts_per_tok=2,
             max_position_embeddings=64, use_cache=False),
    _decoder("modernbert-decoder", "ModernBertDecoderForCausalLM", "ModernBertDecoderConfig", **dict(
        TEXT, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, use_cache=False)),
    _decoder("gptneox-japanese", "GPTNeoXJapaneseForCausalLM", "GPTNeoXJapaneseConfig", num_hidden_layers=2,
             hidden_size=64, num_attention_heads=4, intermediate_multiple_size=2, vocab_size=100,
             max_position_embeddings=64, use_cache=False),
    # rotary embeddings as complex products (torch.polar, view_as_complex): C and ONNX run them as real pairs
    _decoder("llama4", "Llama4ForCausalLM", "Llama4TextConfig", **dict(
        LLAMA_LIKE, head_dim=16, num_local_experts=4, num_experts_per_tok=1, intermediate_size_mlp=128,
        interleave_moe_layer_step=1, attention_chunk_size=4, no_rope_layers=[1, 0])),
    _decoder("deepseek-v2", "DeepseekV2ForCausalLM", "DeepseekV2Config", **dict(
        LLAMA_LIKE, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=16, n_routed_experts=4, n_shared_experts=1, moe_intermediate_size=32, first_k_dense_replace=1,
        **MOE)),
    # state space: Mamba2's chunked scan pads the sequence to a multiple of its chunk size, whose guards torch
    # cannot prove over a range of lengths: the batch stays dynamic and both sizes share one length (two chunks)
    Architecture("mamba2", _hf("Mamba2ForCausalLM", "Mamba2Config", num_hidden_layers=2, hidden_size=64,
                               vocab_size=100, state_size=16, num_heads=8, head_dim=16, n_groups=1, expand=2,
                               chunk_size=8, use_cache=False),
                 _tokens("input_ids"), STATIC_LENGTH, sizes=[(2, 13), (3, 13)]),
    # Mamba and RWKV scan their sequence in a Python loop (unrolled by torch.export), RecurrentGemma's RG-LRU too;
    # the hybrids' chunked scans pad to their chunk size, as Mamba2's: the batch stays dynamic
    Architecture("mamba", _hf("MambaForCausalLM", "MambaConfig", num_hidden_layers=2, hidden_size=32, vocab_size=100,
                              state_size=8, expand=2, conv_kernel=4, use_cache=False),
                 _tokens("input_ids"), STATIC_LENGTH, sizes=[(2, 8), (3, 8)]),
    Architecture("falcon-mamba", _hf("FalconMambaForCausalLM", "FalconMambaConfig", num_hidden_layers=2,
                                     hidden_size=32, vocab_size=100, state_size=8, expand=2, conv_kernel=4,
                                     use_cache=False),
                 _tokens("input_ids"), STATIC_LENGTH, sizes=[(2, 8), (3, 8)]),
    Architecture("rwkv", _hf("RwkvForCausalLM", "RwkvConfig", num_hidden_layers=2, hidden_size=32,
                             attention_hidden_size=32, intermediate_size=64, vocab_size=100, context_length=64,
                             rescale_every=0, use_cache=False),  # (rescaling divides its weights in place)
                 _tokens("input_ids"), STATIC_LENGTH, sizes=[(2, 8), (3, 8)]),
    Architecture("recurrent-gemma", _hf("RecurrentGemmaForCausalLM", "RecurrentGemmaConfig", num_hidden_layers=2,
                                        hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                        intermediate_size=128, vocab_size=100, attention_window_size=4, lru_width=64,
                                        block_types=["recurrent", "attention"]),
                 _tokens("input_ids"), STATIC_LENGTH, sizes=[(2, 8), (3, 8)]),
    Architecture("bamba", _hf("BambaForCausalLM", "BambaConfig", **dict(
        LLAMA_LIKE, attn_layer_indices=[1], mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16,
        mamba_chunk_size=8)), _tokens("input_ids"), STATIC_LENGTH, sizes=[(2, 13), (3, 13)]),
    Architecture("jamba", _hf("JambaForCausalLM", "JambaConfig", **dict(
        LLAMA_LIKE, num_experts=4, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
        expert_layer_offset=1, mamba_d_state=8, mamba_expand=2, use_mamba_kernels=False, **MOE)),
        _tokens("input_ids"), STATIC_LENGTH, sizes=[(2, 8), (3, 8)]),
    Architecture("granitemoehybrid", _hf("GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig", **dict(
        LLAMA_LIKE, num_local_experts=4, layer_types=["mamba", "attention"], mamba_n_heads=8, mamba_d_head=16,
        mamba_n_groups=1, mamba_d_state=16, mamba_chunk_size=8, **MOE)),
        _tokens("input_ids"), STATIC_LENGTH, sizes=[(2, 13), (3, 13)]),
    Architecture("qwen3-next", _hf("Qwen3NextForCausalLM", "Qwen3NextConfig", **dict(  # gated delta-net layers
        LLAMA_LIKE, head_dim=16, num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
        layer_types=["linear_attention", "full_attention"], **MOE)),
        _tokens("input_ids"), STATIC_LENGTH, sizes=[(2, 13), (3, 13)]),
    Architecture("falcon-h1", _hf("FalconH1ForCausalLM", "FalconH1Config", **dict(  # attention and Mamba2 in parallel
        LLAMA_LIKE, head_dim=16, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16,
        mamba_chunk_size=8)), _tokens("input_ids"), STATIC_LENGTH, sizes=[(2, 8), (3, 8)]),
    Architecture("zamba2", _hf("Zamba2ForCausalLM", "Zamba2Config", hidden_size=64, num_hidden_layers=2,
                               num_attention_heads=4, vocab_size=100, mamba_d_state=16, mamba_headdim=16,
                               n_mamba_heads=8, mamba_ngroups=1, chunk_size=8, layers_block_type=["mamba", "hybrid"],
                               use_cache=False), _tokens("input_ids"), STATIC_LENGTH, sizes=[(2, 8), (3, 8)]),
    Architecture("nemotron-h", _hf("NemotronHForCausalLM", "NemotronHConfig", **dict(
        LLAMA_LIKE, head_dim=16, mamba_num_heads=8, mamba_head_dim=16, n_groups=1, ssm_state_size=16, chunk_size=8,
        hybrid_override_pattern="M*")), _tokens("input_ids"), STATIC_LENGTH, sizes=[(2, 8), (3, 8)]),
    # recent decoders, base models (dense, mixture-of-experts, sliding-window and hybrid attention)
    _decoder("afmoe", "AfmoeModel", "AfmoeConfig", randomize=("router.gate.weight",), **EXPERTS),
    _decoder("cohere2-moe", "Cohere2MoeModel", "Cohere2MoeConfig", **EXPERTS),
    _decoder("dots1", "Dots1Model", "Dots1Config", **EXPERTS),
    _decoder("ernie4.5-moe", "Ernie4_5_MoeModel", "Ernie4_5_MoeConfig", **EXPERTS),
    _decoder("exaone-moe", "ExaoneMoeModel", "ExaoneMoeConfig", **EXPERTS),
    _decoder("flex-olmo", "FlexOlmoModel", "FlexOlmoConfig", **EXPERTS),
    _decoder("glm4-moe", "Glm4MoeModel", "Glm4MoeConfig", **EXPERTS),
    _decoder("granitemoe-shared", "GraniteMoeSharedModel", "GraniteMoeSharedConfig", **EXPERTS),
    _decoder("granite-swa", "GraniteSWAModel", "GraniteSWAConfig", **EXPERTS),
    _decoder("granitemoe-swa", "GraniteMoeSWAModel", "GraniteMoeSWAConfig", **EXPERTS),
    _decoder("hunyuan-moe", "HunYuanMoEV1Model", "HunYuanMoEV1Config", **EXPERTS),
    _decoder("jais2", "Jais2Model", "Jais2Config", **EXPERTS),
    _decoder("minimax-m2", "MiniMaxM2Model", "MiniMaxM2Config", **EXPERTS),
    _decoder("ministral3", "Ministral3Model", "Ministral3Config", **EXPERTS),
    _decoder("nanochat", "NanoChatModel", "NanoChatConfig", **EXPERTS),
    _decoder("solar-open", "SolarOpenModel", "SolarOpenConfig", **EXPERTS),
    _decoder("laguna", "LagunaModel", "LagunaConfig", **EXPERTS),
    _decoder("hy-v3", "HYV3Model", "HYV3Config", **EXPERTS),
    _decoder("cwm", "CwmModel", "CwmConfig", **EXPERTS),
    _decoder("mimo-v2-flash", "MiMoV2FlashModel", "MiMoV2FlashConfig", **EXPERTS),
    # their linear-attention, recurrent and hybrid layers make torch specialize the length: the batch stays dynamic
    *[Architecture(name, _hf(model, f"{model.removesuffix('Model')}Config", **EXPERTS), _tokens("input_ids"),
                   STATIC_LENGTH, sizes=[(2, 8), (3, 8)])
      for name, model in (("kimi-linear", "KimiLinearModel"), ("minimax", "MiniMaxModel"),
                          ("olmo-hybrid", "OlmoHybridModel"), ("lara-mini", "LaraMiniModel"),
                          ("qwen3.5", "Qwen3_5TextModel"), ("qwen3.5-moe", "Qwen3_5MoeTextModel"),
                          ("xlstm", "xLSTMModel"))],
    # encoder-decoders
    Architecture("t5", _t5, _tokens("input_ids", "decoder_input_ids"), ENCODER_DECODER),
    _seq2seq("mt5", "MT5Model", "MT5Config", num_layers=1, num_decoder_layers=1, d_model=32, d_ff=64, num_heads=4,
             d_kv=8, vocab_size=100, use_cache=False),
    _seq2seq("umt5", "UMT5Model", "UMT5Config", num_layers=1, num_decoder_layers=1, d_model=32, d_ff=64, num_heads=4,
             d_kv=8, vocab_size=100, use_cache=False),
    _seq2seq("bart", "BartModel", "BartConfig", **SEQ2SEQ),
    _seq2seq("mbart", "MBartModel", "MBartConfig", **SEQ2SEQ),
    _seq2seq("pegasus", "PegasusModel", "PegasusConfig", **SEQ2SEQ),
    _seq2seq("marian", "MarianModel", "MarianConfig", **dict(SEQ2SEQ, decoder_start_token_id=1)),
    _seq2seq("blenderbot", "BlenderbotModel", "BlenderbotConfig", **SEQ2SEQ),
    _seq2seq("blenderbot-small", "BlenderbotSmallModel", "BlenderbotSmallConfig", **SEQ2SEQ),
    _seq2seq("plbart", "PLBartModel", "PLBartConfig", **SEQ2SEQ),
    _seq2seq("m2m100", "M2M100Model", "M2M100Config", **SEQ2SEQ),
    # vision
    Architecture("vit", _vit, _pixels, PIXELS),
    _vision("deit", "DeiTModel", "DeiTConfig", **VISION),
    _vision("beit", "BeitModel", "BeitConfig", **dict(VISION, use_relative_position_bias=True)),
    _vision("data2vec-vision", "Data2VecVisionModel", "Data2VecVisionConfig", **VISION),
    _vision("dinov2", "Dinov2Model", "Dinov2Config", **dict(VISION, mlp_ratio=2)),
    _vision("yolos", "YolosModel", "YolosConfig", **dict(VISION, image_size=[32, 32], num_detection_tokens=4)),
    _vision("convnext", "ConvNextModel", "ConvNextConfig", num_stages=2, hidden_sizes=[16, 32], depths=[1, 1],
            patch_size=4, image_size=32),
    _vision("convnextv2", "ConvNextV2Model", "ConvNextV2Config", num_stages=2, hidden_sizes=[16, 32], depths=[1, 1],
            patch_size=4, image_size=32),
    _vision("resnet", "ResNetModel", "ResNetConfig", embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
            layer_type="basic"),
    _vision("regnet", "RegNetModel", "RegNetConfig", embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
            groups_width=8),
    _vision("bit", "BitModel", "BitConfig", embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
            num_groups=4),
    _vision("swin", "SwinModel", "SwinConfig", image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
            num_heads=[2, 4], window_size=4),
    _vision("swinv2", "Swinv2Model", "Swinv2Config", image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
            num_heads=[2, 4], window_size=4),
    _vision("mobilevit", "MobileViTModel", "MobileViTConfig", image_size=32, patch_size=2,
            hidden_sizes=[32, 40, 48], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], num_attention_heads=4),
    _vision("segformer", "SegformerModel", "SegformerConfig", num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
            hidden_sizes=[16, 32], num_attention_heads=[1, 2], mlp_ratios=[2, 2], patch_sizes=[7, 3],
            strides=[4, 2]),
    _vision("poolformer", "PoolFormerModel", "PoolFormerConfig", num_encoder_blocks=2, depths=[1, 1],
            hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2], padding=[2, 1]),
    _vision("mobilenet-v2", "MobileNetV2Model", "MobileNetV2Config", image_size=32, depth_multiplier=0.25),
    _vision("efficientnet", "EfficientNetModel", "EfficientNetConfig", image_size=32, width_coefficient=0.25,
            depth_coefficient=0.25, hidden_dim=320),
    _vision("clip-vision", "CLIPVisionModel", "CLIPVisionConfig", **VISION),
    _vision("siglip-vision", "SiglipVisionModel", "SiglipVisionConfig", **VISION),
    _vision("ijepa", "IJepaModel", "IJepaConfig", **VISION),
    _vision("vit-msn", "ViTMSNModel", "ViTMSNConfig", **VISION),
    _vision("dinov2-registers", "Dinov2WithRegistersModel", "Dinov2WithRegistersConfig",
            **dict(VISION, mlp_ratio=2, num_register_tokens=2)),
    _vision("dinov3-vit", "DINOv3ViTModel", "DINOv3ViTConfig", **dict(VISION, num_register_tokens=2)),
    _vision("dinov3-convnext", "DINOv3ConvNextModel", "DINOv3ConvNextConfig", hidden_sizes=[16, 32, 48, 64],
            depths=[1, 1, 1, 1]),
    _vision("vitdet", "VitDetModel", "VitDetConfig", **dict(VISION, pretrain_image_size=32)),
    _vision("hiera", "HieraModel", "HieraConfig", image_size=[32, 32], patch_size=[3, 3], patch_stride=[2, 2],
            patch_padding=[1, 1], embed_dim=16, num_heads=[1, 2], depths=[1, 1], query_stride=[2, 2],
            masked_unit_size=[4, 4], num_query_pool=1),
    _vision("pvt", "PvtModel", "PvtConfig", image_size=32, num_encoder_blocks=2, depths=[1, 1],
            sequence_reduction_ratios=[2, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
            patch_sizes=[4, 2], strides=[4, 2]),
    _vision("pvt-v2", "PvtV2Model", "PvtV2Config", num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
            hidden_sizes=[16, 32], num_attention_heads=[1, 2], mlp_ratios=[2, 2], patch_sizes=[7, 3], strides=[4, 2]),
    _vision("focalnet", "FocalNetModel", "FocalNetConfig", image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
            focal_levels=[2, 2], focal_windows=[3, 3]),
    _vision("levit", "LevitModel", "LevitConfig", image_size=32, hidden_sizes=[32, 48], num_attention_heads=[2, 3],
            depths=[1, 1], key_dim=[8, 8], drop_path_rate=0, mlp_ratio=[2, 2], attention_ratio=[2, 2],
            down_ops=[["Subsample", 8, 2, 4, 2, 2]]),
    _vision("mobilenet-v1", "MobileNetV1Model", "MobileNetV1Config", image_size=32, depth_multiplier=0.25),
    _vision("swiftformer", "SwiftFormerModel", "SwiftFormerConfig", image_size=32, depths=[1, 1, 1, 1],
            embed_dims=[8, 16, 24, 32]),
    _vision("glpn", "GLPNModel", "GLPNConfig", num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
            hidden_sizes=[16, 32], num_attention_heads=[1, 2], mlp_ratios=[2, 2], patch_sizes=[7, 3], strides=[4, 2]),
    _vision("donut-swin", "DonutSwinModel", "DonutSwinConfig", image_size=32, patch_size=4, embed_dim=16,
            depths=[1, 1], num_heads=[2, 4], window_size=4),
    _vision("textnet", "TextNetModel", "TextNetConfig"),
    _vision("dpt", "DPTModel", "DPTConfig", **dict(VISION, num_hidden_layers=4, out_indices=[0, 1, 2, 3],
                                                  neck_hidden_sizes=[8, 8, 16, 16], fusion_hidden_size=16)),
    _vision("swin2sr", "Swin2SRModel", "Swin2SRConfig", image_size=32, patch_size=1, embed_dim=16, depths=[1],
            num_heads=[2], window_size=4, upscale=1),
    _vision("regnet-y", "RegNetModel", "RegNetConfig", embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
            groups_width=8, layer_type="y"),  # squeeze-and-excitation blocks
    _vision("resnet-bottleneck", "ResNetModel", "ResNetConfig", embedding_size=16, hidden_sizes=[16, 32],
            depths=[1, 1], layer_type="bottleneck", downsample_in_bottleneck=True),
    _vision("bit-preact", "BitModel", "BitConfig", embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
            num_groups=4, layer_type="preactivation"),
    Architecture("mobilevitv2", _hf("MobileViTV2Model", "MobileViTV2Config", image_size=64, width_multiplier=0.25),
                 _pixels64, PIXELS),  # (F.fold: col2im)
    Architecture("depth-anything", _hf("DepthAnythingForDepthEstimation", "DepthAnythingConfig",
                                       backbone_config={"model_type": "dinov2", "hidden_size": 32,
                                                        "num_hidden_layers": 4, "num_attention_heads": 4,
                                                        "image_size": 28, "patch_size": 14, "mlp_ratio": 2,
                                                        "out_features": ["stage1", "stage2", "stage3", "stage4"],
                                                        "reshape_hidden_states": False},
                                       neck_hidden_sizes=[8, 16, 32, 32], fusion_hidden_size=16,
                                       head_hidden_size=8, reassemble_hidden_size=32, patch_size=14),
                 _pixels28, PIXELS),
    Architecture("sam-vision", _hf("SamVisionModel", "SamVisionConfig", hidden_size=32, output_channels=16,
                                   num_hidden_layers=2, num_attention_heads=4, image_size=64, patch_size=8,
                                   window_size=4, global_attn_indexes=[1], mlp_dim=64), _pixels64, PIXELS),
    _vision("owlvit-vision", "OwlViTVisionModel", "OwlViTVisionConfig", **VISION),
    _vision("blip-vision", "BlipVisionModel", "BlipVisionConfig", **VISION),
    _vision("git-vision", "GitVisionModel", "GitVisionConfig", **VISION),
    # video: 4 frames of 32 x 32
    Architecture("videomae", _hf("VideoMAEModel", "VideoMAEConfig", **dict(VISION, num_frames=4, tubelet_size=2)),
                 _video, PIXELS),
    Architecture("timesformer", _hf("TimesformerModel", "TimesformerConfig", **dict(VISION, num_frames=4)), _video,
                 PIXELS),
    Architecture("vivit", _hf("VivitModel", "VivitConfig", **dict(VISION, num_frames=4, tubelet_size=[2, 8, 8])),
                 _video, PIXELS),
    # audio
    Architecture("whisper", _whisper, _audio_features, {"input_features": {0: "batch"},
                                                        "decoder_input_ids": SEQUENCE}),
    _audio("wav2vec2", "Wav2Vec2Model", "Wav2Vec2Config", **AUDIO),
    _audio("hubert", "HubertModel", "HubertConfig", **AUDIO),
    _audio("wavlm", "WavLMModel", "WavLMConfig", **dict(AUDIO, num_buckets=32, max_bucket_distance=64)),
    _audio("data2vec-audio", "Data2VecAudioModel", "Data2VecAudioConfig", **dict(AUDIO, conv_pos_kernel_size=5,
                                                                                 num_conv_pos_embeddings=5)),
    _audio("unispeech", "UniSpeechModel", "UniSpeechConfig", **AUDIO),
    # torch cannot prove SEW's squeeze/upsample length guards over a range of waveform lengths (its error: "Not all
    # values of samples ... satisfy the generated guard min(((-1) + (samples // 10)) // 2, ...) >= 0 ..."), so only
    # the batch stays dynamic and both sizes share one length
    Architecture("sew", _hf("SEWModel", "SEWConfig", **dict(AUDIO, squeeze_factor=2)), _waveform,
                 {"input_values": {0: "batch"}}, sizes=[(2, 8), (3, 8)]),
    Architecture("speech2text", _hf("Speech2TextModel", "Speech2TextConfig", **dict(
        SEQ2SEQ, num_conv_layers=2, conv_kernel_sizes=[5, 5], conv_channels=32, input_feat_per_channel=16,
        max_source_positions=64, max_target_positions=64)), _filterbank,
        {"input_features": {0: "batch", 1: "frames"}, "decoder_input_ids": SEQUENCE}),
    # as SEW (below), torch cannot prove these two's length guards over a range of waveform lengths
    Architecture("wav2vec2-conformer", _hf("Wav2Vec2ConformerModel", "Wav2Vec2ConformerConfig", **dict(
        AUDIO, position_embeddings_type="rotary", conv_depthwise_kernel_size=3)), _waveform,
        {"input_values": {0: "batch"}}, sizes=[(2, 8), (3, 8)]),
    _audio("unispeech-sat", "UniSpeechSatModel", "UniSpeechSatConfig", **AUDIO),
    Architecture("sew-d", _hf("SEWDModel", "SEWDConfig", **dict(AUDIO, squeeze_factor=1, position_buckets=16,
                                                                 max_relative_positions=32)),
                 _waveform, {"input_values": {0: "batch"}}, sizes=[(2, 8), (3, 8)]),
    Architecture("wav2vec2-bert", _hf("Wav2Vec2BertModel", "Wav2Vec2BertConfig", **dict(
        num_hidden_layers=1, hidden_size=32, num_attention_heads=4, intermediate_size=64,
        feature_projection_input_dim=16, conv_depthwise_kernel_size=3, output_hidden_size=32)), _features,
        {"input_features": {0: "batch", 1: "frames"}}),
    Architecture("moonshine", _hf("MoonshineModel", "MoonshineConfig", vocab_size=100, hidden_size=32,
                                  intermediate_size=64, encoder_num_hidden_layers=1, decoder_num_hidden_layers=1,
                                  encoder_num_attention_heads=4, decoder_num_attention_heads=4, use_cache=False,
                                  pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1),
                 _waveform_and_tokens, {"input_values": {0: "batch"}, "decoder_input_ids": {0: "batch"}},
                 sizes=[(2, 8), (3, 8)]),
    Architecture("ast", _hf("ASTModel", "ASTConfig", hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                            intermediate_size=64, max_length=64, num_mel_bins=16, patch_size=8, frequency_stride=8,
                            time_stride=8), _spectrogram, {"input_values": {0: "batch"}}),
    Architecture("clap-audio", _hf("ClapAudioModel", "ClapAudioConfig", spec_size=64, window_size=4, num_mel_bins=16,
                                   patch_size=4, hidden_size=32, patch_embeds_hidden_size=16, depths=[1, 1],
                                   num_attention_heads=[2, 4], enable_fusion=False, patch_stride=[4, 4]),
                 _mel_image, {"input_features": {0: "batch"}}),
    # vision-language: the image's features replace the prompt's image tokens (masked_scatter), after a check that
    # their counts agree (torch._check of a data-dependent bool, which C reads while running); the checked count
    # fixes the batch. 16 patches an image, or 4 where the model merges 2x2 of them.
    Architecture("llava", _hf("LlavaForConditionalGeneration", "LlavaConfig", image_token_index=99,
                              vision_config=CLIP_VISION, text_config=dict(model_type="llama", **LLAMA_LIKE)),
                 _image_prompt(16), IMAGE_PROMPT, limits={"seq": (18, 40)}, sizes=[(2, 20), (2, 27)]),
    Architecture("vipllava", _hf("VipLlavaForConditionalGeneration", "VipLlavaConfig", image_token_index=99,
                                 vision_feature_layers=[-2, -1], vision_config=CLIP_VISION,
                                 text_config=dict(model_type="llama", **LLAMA_LIKE)),
                 _image_prompt(16), IMAGE_PROMPT, limits={"seq": (18, 40)}, sizes=[(2, 20), (2, 27)]),
    Architecture("gemma3-vision", _hf("Gemma3ForConditionalGeneration", "Gemma3Config", image_token_index=99,
                                      boi_token_index=97, eoi_token_index=98, mm_tokens_per_image=4,
                                      vision_config=SIGLIP_VISION,
                                      text_config=dict(model_type="gemma3_text", **SLIDING)),
                 _image_prompt(4), IMAGE_PROMPT, limits={"seq": (6, 40)}, sizes=[(2, 8), (2, 13)]),
    Architecture("aya-vision", _hf("AyaVisionForConditionalGeneration", "AyaVisionConfig", image_token_index=99,
                                   downsample_factor=2, vision_config=SIGLIP_VISION,
                                   text_config=dict(model_type="cohere2", **LLAMA_LIKE)),
                 _image_prompt(4), IMAGE_PROMPT, limits={"seq": (6, 40)}, sizes=[(2, 8), (2, 13)]),
    # SmolVLM and Idefics3 return the features of the prompts' real images (not all-zero ones): their count is read
    # while running, and C allocates that output
    *(Architecture(name, _hf(model, config, image_token_id=99, scale_factor=2, use_cache=False,
                             vision_config=dict(SIGLIP_VISION, model_type=vision),
                             text_config=dict(model_type="llama", **LLAMA_LIKE)),
                   _image_prompt(4, images=(1,)), IMAGE_PROMPT, limits={"seq": (6, 40)}, sizes=[(2, 8), (2, 13)])
      for name, model, config, vision in (
          ("smolvlm", "SmolVLMForConditionalGeneration", "SmolVLMConfig", "smolvlm_vision"),
          ("idefics3", "Idefics3ForConditionalGeneration", "Idefics3Config", "idefics3_vision"))),
    Architecture("cohere2-vision", _hf("Cohere2VisionForConditionalGeneration", "Cohere2VisionConfig",
                                       image_token_id=99, downsample_factor=2, vision_config=SIGLIP_VISION,
                                       text_config=dict(model_type="cohere2", **LLAMA_LIKE)),
                 _image_prompt(4), IMAGE_PROMPT, limits={"seq": (6, 40)}, sizes=[(2, 8), (2, 13)]),
    Architecture("internvl", _hf("InternVLForConditionalGeneration", "InternVLConfig", image_token_id=99,
                                 downsample_ratio=0.5, text_config=dict(model_type="qwen2", **LLAMA_LIKE),
                                 vision_config=dict(model_type="internvl_vision", hidden_size=32, intermediate_size=64,
                                                    num_hidden_layers=2, num_attention_heads=4, image_size=[32, 32],
                                                    patch_size=[8, 8])),
                 _image_prompt(4), IMAGE_PROMPT, limits={"seq": (6, 40)}, sizes=[(2, 8), (2, 13)]),
    # time series
    Architecture("patchtst", _hf("PatchTSTModel", "PatchTSTConfig", num_input_channels=3, context_length=32,
                                 patch_length=8, patch_stride=8, d_model=32, num_attention_heads=4,
                                 num_hidden_layers=1, ffn_dim=64), _series, {"past_values": {0: "batch"}}),
    Architecture("patchtsmixer", _hf("PatchTSMixerModel", "PatchTSMixerConfig", num_input_channels=3,
                                     context_length=32, patch_length=8, patch_stride=8, d_model=16, num_layers=2),
                 _series, {"past_values": {0: "batch"}}),
    # added 2026-12-07: a CNN backbone, a vision tower, encoders (GTE, MRA's multi-resolution attention, RoCBert's
    # glyph and pronunciation embeddings, UltraBERT), decoders (Doge's dynamic mask attention, ImageGPT)
    _vision("hgnet-v2", "HGNetV2Backbone", "HGNetV2Config", depths=[1, 1], hidden_sizes=[32, 64],
            stem_channels=[3, 8, 16], stage_in_channels=[16, 32], stage_mid_channels=[8, 16],
            stage_out_channels=[32, 64], stage_num_blocks=[1, 1], stage_downsample=[False, True],
            stage_downsample_strides=[2, 2], stage_light_block=[False, True], stage_kernel_size=[3, 5],
            stage_numb_of_layers=[2, 2], stage_names=["stem", "stage1", "stage2"], out_features=["stage2"]),
    _vision("mlcd-vision", "MLCDVisionModel", "MLCDVisionConfig", **VISION),
    _encoder("gte", "GteModel", "GteConfig", **TEXT),
    _encoder("mra", "MraModel", "MraConfig", **TEXT),
    _encoder("roc-bert", "RoCBertModel", "RoCBertConfig", **dict(TEXT, shape_vocab_size=50,
                                                                  pronunciation_vocab_size=50)),
    _encoder("ultrabert", "UltrabertModel", "UltrabertConfig", **TEXT),
    _decoder("doge", "DogeForCausalLM", "DogeConfig", **LLAMA_LIKE),
    _decoder("imagegpt", "ImageGPTModel", "ImageGPTConfig", n_embd=64, n_layer=2, n_head=4, vocab_size=100,
             n_positions=64, use_cache=False),
]}


# Architectures kiln cannot load yet, with the cause (docs/models.md has the details); test_sweep.py expects them to
# fail, strictly, so a fix shows up.
KNOWN_GAPS: dict[str, str] = {  # name -> cause
}


# -- generation with a static KV cache (tests/models/test_static_cache.py, benchmarks/static_cache*.py)

def export_with_static_cache(model: Any, max_cache_len: int) -> tuple[Any, Any]:
    """torch.export of a decoder through transformers' ExecuTorch recipe (`TorchExportableModuleForDecoderOnlyLM`: the
    cache is buffers the graph updates in place) with a static cache of `max_cache_len` positions and a dynamic
    sequence, saved to memory; returns (the .pt2 archive, torch's stateful `ep.module()`)."""
    import io

    import torch
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM
    for config in (model.config, model.config.get_text_config()):
        config.use_cache = True
    model.generation_config.use_cache = True
    model.generation_config.cache_implementation = "static"
    recipe = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=max_cache_len)
    seq = torch.export.Dim("seq", max=max_cache_len - 1)
    exported = torch.export.export(recipe.model, (), {"input_ids": torch.tensor([[5, 6, 7]]),
                                                      "cache_position": torch.arange(3)},
                                   dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}}, strict=False)
    archive = io.BytesIO()
    torch.export.save(exported, archive)
    archive.seek(0)
    return archive, exported.module()


# -- the end-to-end check: torch exports and saves; a child process with torch blocked loads and runs the file

def torch_outputs(model: Any, inputs: dict[str, Any]) -> list:
    """The model's flat outputs in the order kiln's pytree flattening gives them."""
    import torch
    from kiln.ir.pytree import tree_flatten
    with torch.no_grad():
        output = model(**inputs)
    # a ModelOutput's fields in order, without its Nones; a field may hold a tuple of tensors (XLNet's mems)
    return tree_flatten(list(output.to_tuple()) if hasattr(output, "to_tuple") else output)[0]


def export_to_folder(architecture: Architecture, model: Any, folder: Path, dynamic_shapes: Any = None) -> Any:
    """torch.export the model at the example size (dynamic dims from the architecture unless given), save it as
    folder/model.pt2 and each size's inputs as folder/inputs_<k>.npz; return the ExportedProgram."""
    import numpy as np
    import torch
    sizes = [architecture.make_inputs(*size) for size in architecture.sizes]
    shapes = architecture.dynamic_shapes() if dynamic_shapes is None else dynamic_shapes
    exported = torch.export.export(model, (), sizes[0], dynamic_shapes=shapes, strict=False)
    torch.export.save(exported, folder / "model.pt2")
    for k, inputs in enumerate(sizes):
        np.savez(folder / f"inputs_{k}.npz", **{key: value.numpy() for key, value in inputs.items()})
    return exported


# One job of the child: loads folder/model.pt2, runs each stage on each size's inputs and writes its flat outputs
# (<stage>_<k>.npz) and folder/report.json: per stage the first error (or null) and timings.
KILN_JOB = textwrap.dedent("""
    import json, statistics, sys, time, traceback

    folder, stages, count, repeat = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4])
    import numpy as np
    import kiln
    from kiln.ir.pytree import tree_flatten

    report = {"stages": {}, "seconds": {}, "latency": {}}

    def error(exc):
        lines = [line for line in f"{type(exc).__name__}: {exc}".splitlines() if line.strip()]
        return lines[0] if lines else type(exc).__name__

    def write():
        with open(folder + "/report.json", "w") as f:
            json.dump(report, f, indent=1)

    def median(fn):
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    sizes = []
    for k in range(count):
        with np.load(f"{folder}/inputs_{k}.npz") as saved:
            sizes.append({name: saved[name] for name in saved.files})
    try:
        start = time.perf_counter()
        program = kiln.load(folder + "/model.pt2")
        report["seconds"]["load"] = time.perf_counter() - start
        report["stages"]["load"] = None
    except Exception as exc:
        traceback.print_exc()
        report["stages"]["load"] = error(exc)
        write()
        sys.exit(1)
    write()
    runners = {}
    for stage in stages:
        try:
            if stage == "interpreter":
                runners[stage] = lambda inputs: program(**inputs)
            elif stage == "onnx":
                onnx_program = kiln.onnx.export(program)
                runners[stage] = lambda inputs: onnx_program(**inputs)
            elif stage == "c":
                start = time.perf_counter()
                compiled = kiln.compile(program, output=folder + "/package", num_threads=1)
                report["seconds"]["c_compile"] = time.perf_counter() - start
                names = [i["name"] for i in compiled.manifest["inputs"]]
                runners[stage] = lambda inputs: compiled(*[inputs[name] for name in names])
            for k, inputs in enumerate(sizes):
                leaves, _ = tree_flatten(runners[stage](inputs))
                np.savez(f"{folder}/{stage}_{k}.npz", *[np.asarray(leaf) for leaf in leaves])
            report["stages"][stage] = None
        except Exception as exc:
            traceback.print_exc()
            runners.pop(stage, None)
            report["stages"][stage] = error(exc)
        write()
    if repeat and "c" in runners and "onnx" in runners:  # same thread count (1) for both, example size
        import onnxruntime
        from kiln.codegen.onnx.program import flat_user_inputs
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads, options.log_severity_level = 1, 1, 3
        session = onnxruntime.InferenceSession(onnx_program.model_proto.SerializeToString(), options,
                                               providers=["CPUExecutionProvider"])
        feed = dict(zip([spec.name for spec in session.get_inputs()], flat_user_inputs(program, (), sizes[0])))
        session.run(None, feed)
        runners["c"](sizes[0])
        report["latency"] = {"onnx": median(lambda: session.run(None, feed)),
                             "c": median(lambda: runners["c"](sizes[0]))}
        write()
    assert "torch" not in sys.modules or sys.modules["torch"] is None
    sys.exit(0 if all(e is None for e in report["stages"].values()) else 1)
""")

# The child: torch blocked, numpy and kiln imported once (0.7 s a process, a sixth of a sweep test), then each job
# in a process forked from it, as fresh as a new one but for those imports: a job reads its
# [folder, stages, size count, repeat] line from stdin and its exit status comes back as a line on stdout, its
# output and tracebacks in folder/stderr.txt.
KILN_SERVER = without_torch("""
    import json, os, sys
    import numpy, kiln  # noqa: F401

    job = compile(sys.argv[1], "KILN_JOB", "exec")
    for line in sys.stdin:
        folder, stages, count, repeat = json.loads(line)
        pid = os.fork()
        if pid == 0:
            output = os.open(os.path.join(folder, "stderr.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(output, 1)
            os.dup2(output, 2)
            sys.argv = ["-c", folder, ",".join(stages), str(count), str(repeat)]
            code = 0
            try:
                exec(job, {"__name__": "__main__"})
            except SystemExit as stop:  # sys.exit(None) is success, sys.exit("message") failure
                code = 0 if stop.code is None else stop.code if isinstance(stop.code, int) else 1
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
""")
_server: dict[str, Any] = {}  # "process": the running KILN_SERVER, "environment": the variables it started with


def run_in_kiln(folder: Path, stages: list[str], *, repeat: int = 0, timeout: float = 900) -> tuple[dict, str]:
    """Run KILN_JOB on folder (written by export_to_folder) in a process where torch cannot be imported; return its
    report and its output's tail."""
    count = len(list(folder.glob("inputs_*.npz")))
    output, path = folder / "stderr.txt", folder / "report.json"
    path.unlink(missing_ok=True)  # (a job that dies writes none)
    server = _kiln_server()
    server.stdin.write(json.dumps([str(folder), stages, count, repeat]) + "\n")
    server.stdin.flush()
    if not select.select([server.stdout], [], [], timeout)[0]:
        _stop_kiln_server()
        raise subprocess.TimeoutExpired(f"KILN_JOB {folder}", timeout)
    status = server.stdout.readline().strip()
    if not status:  # the server itself died: start another for the next job
        _stop_kiln_server()
    report = json.loads(path.read_text()) if path.exists() else {"stages": {"load": f"child exited with "
                                                                            f"{status or 'no status'}"}}
    return report, output.read_text(errors="replace")[-4000:] if output.exists() else ""


def _kiln_server() -> subprocess.Popen:
    """The running KILN_SERVER, started anew when none runs or the environment changed since it started (a test
    may set a variable the job reads)."""
    environment = {key: value for key, value in os.environ.items() if key != "PYTEST_CURRENT_TEST"}
    if _server and (_server["process"].poll() is not None or _server["environment"] != environment):
        _stop_kiln_server()
    if not _server:
        _server["process"] = subprocess.Popen([sys.executable, "-c", KILN_SERVER, KILN_JOB], stdin=subprocess.PIPE,
                                              stdout=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)
        _server["environment"] = environment
    return _server["process"]


@atexit.register
def _stop_kiln_server() -> None:
    """Stop the server and any job it forked (they share its process group)."""
    process = _server.pop("process", None)
    _server.clear()
    if process is not None and process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def expected_outputs(architecture: Architecture, model: Any) -> list[list]:
    """torch eager's flat outputs at each of the architecture's sizes."""
    return [torch_outputs(model, architecture.make_inputs(*size)) for size in architecture.sizes]


def stage_mismatch(folder: Path, stage: str, expected: list[list]) -> str | None:
    """None when the stage's saved outputs match torch's (assert_close defaults) at every size, else the first
    difference as one line."""
    import numpy as np
    import torch
    for k, wanted in enumerate(expected):
        with np.load(folder / f"{stage}_{k}.npz") as saved:
            got = [torch.from_numpy(saved[f"arr_{i}"]) for i in range(len(saved.files))]
        if len(got) != len(wanted):
            return f"{len(got)} outputs, torch has {len(wanted)}"
        for index, (g, e) in enumerate(zip(got, wanted)):
            try:
                torch.testing.assert_close(g, e)
            except AssertionError as exc:
                detail = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
                return f"size {k} output {index}: {detail}"
    return None


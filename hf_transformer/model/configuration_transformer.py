"""Configuration of the encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

The defaults are the paper's base model (Table 3, row "base"); `TransformerConfig.from_preset("big")` gives the big one.
"""

import dataclasses
from typing import Any

import transformers
from huggingface_hub.dataclasses import strict
from transformers import PretrainedConfig
from transformers.activations import ACT2FN

# Saved folders run this file under the user's transformers. Every release from 5.4 on loads them exactly (tested at
# 5.4 and 5.17); before 5.4 configs were not dataclasses, and 5.3 left remote code's tied weights on the meta device.
MIN_TRANSFORMERS_VERSION = "5.4"
if not dataclasses.is_dataclass(PretrainedConfig):
    raise ImportError(
        f"This model needs transformers>={MIN_TRANSFORMERS_VERSION}, found {transformers.__version__}: "
        f"pip install -U 'transformers>={MIN_TRANSFORMERS_VERSION},<6'"
    )

# Table 3 of the paper. Both share a 37,000-token source-target vocabulary (WMT14 en-de, byte-pair encoding).
PRESETS: dict[str, dict[str, Any]] = {
    "base": dict(
        d_model=512,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
        encoder_ffn_dim=2048,
        decoder_ffn_dim=2048,
        dropout=0.1,
    ),
    "big": dict(
        d_model=1024,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=16,
        decoder_attention_heads=16,
        encoder_ffn_dim=4096,
        decoder_ffn_dim=4096,
        dropout=0.3,
    ),
}

# Section 6.1: "We set the maximum output length during inference to input length + 50, but terminate early when
# possible." The one rule of `generate()` (so of the translation pipeline), `translate()` and CTranslate2's.
MAX_LENGTH_OFFSET = 50


def max_new_tokens(source_length: Any, max_positions: int, offset: int = MAX_LENGTH_OFFSET) -> Any:
    """The most tokens a translation of `source_length` tokens takes (</s> included, the start token not): the source's
    length + `offset`, within the decoder's `max_positions` (of which the start token takes one). An int, or a tensor
    of lengths."""
    limit = source_length + offset
    return min(limit, max_positions - 1) if isinstance(limit, int) else limit.clamp(max=max_positions - 1)


# The fields that decide the shapes of the weights (a checkpoint of other values is another model).
SHAPE_FIELDS = (
    "vocab_size",
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
)


@strict
class TransformerConfig(PretrainedConfig):
    r"""
    Configuration of [`TransformerModel`] and [`TransformerForConditionalGeneration`].

    Args:
        vocab_size: size of the shared source-target vocabulary.
        d_model: width of every sub-layer output and of the embeddings.
        encoder_layers / decoder_layers: number of layers in each stack (N in the paper).
        encoder_attention_heads / decoder_attention_heads: attention heads per layer (h).
        encoder_ffn_dim / decoder_ffn_dim: inner size of the position-wise feed-forward networks (d_ff).
        dropout: P_drop, applied to each sub-layer output and to the sums of embeddings and positional encodings.
        attention_dropout: dropout on the attention weights (not in the paper; tensor2tensor's default is 0).
        activation_dropout: dropout after the feed-forward activation (tensor2tensor's "relu_dropout").
        activation_function: non-linearity of the feed-forward networks ("relu" in the paper).
        max_position_embeddings: longest sequence the model accepts (the sinusoids themselves have no limit).
        scale_embedding: multiply the embeddings by sqrt(d_model), as in section 3.4.
        normalize_before: False is the paper's post-LN `LayerNorm(x + Sublayer(x))`; True is pre-LN
            `x + Sublayer(LayerNorm(x))` with a final LayerNorm after each stack, which trains stably without warm-up.
        init_std: standard deviation of the embedding initialisation; None means d_model**-0.5, which keeps the
            scaled embeddings at unit variance. Linear layers use Xavier-uniform as in tensor2tensor.
        label_smoothing: epsilon_ls of the loss that `forward(labels=...)` returns (section 5.4: 0.1), so that any
            trainer (Lightning's, Hugging Face's) trains the paper's loss.
        tie_word_embeddings: one matrix for the source embeddings, the target embeddings and the pre-softmax
            projection (section 3.4).
    """

    model_type = "vaswani_transformer"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]  # the cache, named so before and from transformers 5.24
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "encoder_attention_heads",
        "num_hidden_layers": "encoder_layers",
    }

    vocab_size: int = 37000
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    activation_dropout: float | int = 0.0
    activation_function: str = "relu"
    max_position_embeddings: int = 1024
    scale_embedding: bool = True
    normalize_before: bool = False
    init_std: float | None = None
    label_smoothing: float | int = 0.1
    tie_word_embeddings: bool = True
    use_cache: bool = True
    is_encoder_decoder: bool = True
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    decoder_start_token_id: int | None = 1

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "TransformerConfig":
        """The paper's "base" or "big" model; `overrides` replace any field (e.g. `vocab_size`)."""
        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r}: choose one of {sorted(PRESETS)}.")
        return cls(**{**PRESETS[name], **overrides})

    def __post_init__(self, **kwargs):
        # After the parent's, which sets the `attribute_map` aliases (hidden_size=...) passed in `kwargs`. Checked here
        # rather than in `validate_*` hooks, which wrap the error in a non-ValueError exception.
        super().__post_init__(**kwargs)
        self.check_values()
        if self.init_std is None:  # what Hugging Face's initialisation of embeddings reads
            self.init_std = self.d_model**-0.5

    def check_values(self) -> None:
        """Sizes must be positive, heads must divide d_model, dropouts lie in [0, 1), special ids index the
        vocabulary. Raises ValueError naming the field and the value."""
        for field in (*SHAPE_FIELDS, "max_position_embeddings"):
            value = getattr(self, field)
            if value <= 0:
                raise ValueError(f"TransformerConfig.{field} must be a positive integer, got {value}.")
        for field in ("encoder_attention_heads", "decoder_attention_heads"):
            heads = getattr(self, field)
            if self.d_model % heads != 0:
                raise ValueError(
                    f"TransformerConfig.d_model ({self.d_model}) must be divisible by {field} ({heads}): each head "
                    f"gets d_model / heads dimensions. Change d_model or {field}."
                )
        for field in ("dropout", "attention_dropout", "activation_dropout", "label_smoothing"):
            value = getattr(self, field)
            if not 0 <= value < 1:
                raise ValueError(f"TransformerConfig.{field} must be in [0, 1), got {value}.")
        if self.activation_function not in ACT2FN:
            raise ValueError(
                f"TransformerConfig.activation_function={self.activation_function!r} is unknown; use one of "
                f"{sorted(ACT2FN)} ('relu' is the paper's)."
            )
        if self.init_std is not None and self.init_std <= 0:
            raise ValueError(f"TransformerConfig.init_std must be positive or None, got {self.init_std}.")
        for field in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            value = getattr(self, field)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(
                    f"TransformerConfig.{field}={value} is outside the vocabulary [0, {self.vocab_size}): set it to a "
                    "token id of your tokenizer, or set vocab_size to the tokenizer's length."
                )


__all__ = ["MAX_LENGTH_OFFSET", "MIN_TRANSFORMERS_VERSION", "PRESETS", "TransformerConfig", "max_new_tokens"]

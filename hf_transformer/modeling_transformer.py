"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017), from scratch.

Each class maps onto a part of the paper; section and equation numbers in the docstrings refer to it. The plumbing
(attention backends, masks, key/value cache, generation, save/load) is Hugging Face's, so the model behaves like any
other on the Hub.

Reading order: attention (eq. 1, section 3.2) -> feed-forward (eq. 2) -> "Add & Norm" -> positional encoding
(section 3.5) -> the tokens that need computing -> encoder and decoder layers and stacks (section 3.1) -> the models.
"""

import inspect
import math
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import SAFE_WEIGHTS_NAME, can_return_tuple

from .configuration_transformer import TransformerConfig
from .efficiency import (
    ComputedTokens,
    apply_dropout,
    keep_positions,
    parse_forward_signature_once,
    reorder_self_attention_cache,
    training_flops,
)
from .integrity import non_finite_tensors

# transformers 5.24 renamed the key/value cache from `past_key_values` to `cache`: in forward arguments, in the fields
# of model outputs and in the mask helpers. Saved folders run this file under the user's release (any from 5.4 on), so
# the model takes both names and builds outputs and masks with the one the installed release knows.
CACHE_NAME = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"


def scaled_dot_product_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V  (eq. 1), the "eager" backend.

    By default (`attn_implementation="sdpa"`) torch's fused `F.scaled_dot_product_attention` computes this formula
    instead, without materialising the weights; `model.set_attn_implementation("eager")` runs this function, and
    `output_attentions=True` does for that call (the tests check that both agree).

    q, k, v are [batch, heads, length, d_k]; returns the output as [batch, length, heads, d_k] and the attention
    weights. The mask may be boolean (True = attend) or additive, as torch's sdpa takes it.
    """
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask
    elif module.is_causal and query.shape[-2] > 1:
        # No mask with a causal module means "causal, nothing padded", as for sdpa's is_causal.
        future = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool, device=query.device)
        future = future.triu(key.shape[-2] - query.shape[-2] + 1)
        scores = scores.masked_fill(future, torch.finfo(scores.dtype).min)
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = apply_dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V) (3.2.2).

    The per-head projections W_i of all heads are stored side by side as one d_model x d_model matrix per input, and
    the inputs that come from the same tensor are projected in one matrix multiply (see the subclasses). This base
    class splits the heads, runs eq. 1 with the configured backend (eager, sdpa, flex or flash) and applies W^O.
    """

    def __init__(self, config: TransformerConfig, num_heads: int, is_causal: bool, layer_idx: int | None = None):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_dim = config.d_model // num_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        # Read by the sdpa backend: without a mask, a causal module gets sdpa's is_causal=True.
        self.is_causal = is_causal
        self.layer_idx = layer_idx
        self.out_proj = nn.Linear(config.d_model, config.d_model)

    def split_heads(self, projected: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """[batch, length, n * d_model] -> n tensors of [batch, heads, length, d_k], as views (no copies)."""
        batch, length, _ = projected.shape
        return tuple(
            part.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
            for part in projected.split(self.config.d_model, dim=-1)
        )

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        tokens: ComputedTokens,
        output_attentions: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attention: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, scaled_dot_product_attention
        )
        if output_attentions and attention is not scaled_dot_product_attention:
            if self.config._attn_implementation != "sdpa":
                raise ValueError(
                    f"output_attentions=True needs attn_implementation 'eager' or 'sdpa', not "
                    f"{self.config._attn_implementation!r}: call model.set_attn_implementation('eager') first."
                )
            attention = scaled_dot_product_attention  # fused kernels never materialise the weights
        dropout = self.attention_dropout if self.training else 0.0
        output, weights = attention(self, query, key, value, attention_mask, dropout=dropout, scaling=self.scaling)
        batch, length = output.shape[:2]
        return self.out_proj(tokens.pack(output.reshape(batch, length, -1))), weights


class SelfAttention(MultiHeadAttention):
    """Self-attention: queries, keys and values all come from the previous layer (3.2.3).

    In the decoder it is masked (`is_causal`) so that position i attends only to positions <= i, and during
    generation the keys and values of earlier steps come from the cache instead of being recomputed.
    """

    def __init__(self, config: TransformerConfig, num_heads: int, is_causal: bool, layer_idx: int | None = None):
        super().__init__(config, num_heads, is_causal, layer_idx)
        self.qkv_proj = nn.Linear(config.d_model, 3 * config.d_model)

    def forward(
        self,
        hidden_states: torch.Tensor,
        tokens: ComputedTokens,
        attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        query, key, value = self.split_heads(tokens.unpack(self.qkv_proj(hidden_states)))
        if cache is not None:
            key, value = cache.self_attention_cache.update(key, value, self.layer_idx)
        return self.attend(query, key, value, attention_mask, tokens, output_attentions)


class EncoderDecoderAttention(MultiHeadAttention):
    """Encoder-decoder attention: queries from the decoder, keys and values from the encoder output (3.2.3).

    The encoder output does not change while decoding, so its keys and values are computed at the first step and
    reused from the cache afterwards.
    """

    def __init__(self, config: TransformerConfig, num_heads: int, layer_idx: int | None = None):
        super().__init__(config, num_heads, is_causal=False, layer_idx=layer_idx)
        self.q_proj = nn.Linear(config.d_model, config.d_model)
        self.kv_proj = nn.Linear(config.d_model, 2 * config.d_model)

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        tokens: ComputedTokens,
        attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        (query,) = self.split_heads(tokens.unpack(self.q_proj(hidden_states)))
        if cache is not None and cache.is_updated.get(self.layer_idx):
            cached = cache.cross_attention_cache.layers[self.layer_idx]
            key, value = cached.keys, cached.values
        else:
            key, value = self.split_heads(self.kv_proj(encoder_hidden_states))
            if cache is not None:
                key, value = cache.cross_attention_cache.update(key, value, self.layer_idx)
                cache.is_updated[self.layer_idx] = True
        return self.attend(query, key, value, attention_mask, tokens, output_attentions)


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, applied to each position separately (eq. 2)."""

    def __init__(self, config: TransformerConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.activation = ACT2FN[config.activation_function]
        self.activation_dropout = config.activation_dropout

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.activation(self.fc1(hidden_states))
        hidden_states = apply_dropout(hidden_states, p=self.activation_dropout, training=self.training)
        return self.fc2(hidden_states)


class AddAndNorm(nn.Module):
    """The "Add & Norm" around every sub-layer (3.1, 5.4).

    Post-LN (the paper): LayerNorm(x + Dropout(Sublayer(x))). Pre-LN (`normalize_before`): x + Dropout(Sublayer(
    LayerNorm(x))). Use as `x = add_norm(x, sublayer(add_norm.sublayer_input(x)))`.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.layer_norm = nn.LayerNorm(config.d_model)
        self.dropout = config.dropout
        self.normalize_before = config.normalize_before

    def sublayer_input(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(hidden_states) if self.normalize_before else hidden_states

    def forward(self, residual: torch.Tensor, sublayer_output: torch.Tensor) -> torch.Tensor:
        hidden_states = residual + apply_dropout(sublayer_output, p=self.dropout, training=self.training)
        return hidden_states if self.normalize_before else self.layer_norm(hidden_states)


class SinusoidalPositionalEncoding(nn.Module):
    """PE(pos, 2i) = sin(pos / 10000^(2i / d_model)), PE(pos, 2i + 1) = cos(pos / 10000^(2i / d_model))  (3.5).

    A table of the first `num_positions` encodings, so that a decoding step reads one row instead of computing it.
    The table is a non-persistent buffer: it is not saved, and `_init_weights` recomputes it when `from_pretrained`
    builds the model on the meta device.
    """

    def __init__(self, num_positions: int, d_model: int):
        super().__init__()
        self.register_buffer("table", self.sinusoids(num_positions, d_model), persistent=False)

    @staticmethod
    def sinusoids(num_positions: int, d_model: int) -> torch.Tensor:
        """[num_positions, d_model] float32 encodings of positions 0, 1, ..."""
        exponents = torch.arange(0, d_model, 2, dtype=torch.float32) / d_model
        angles = torch.arange(num_positions, dtype=torch.float32)[:, None] / (10000.0**exponents)[None, :]
        return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)[:, :d_model]

    def forward(self, start: int, length: int) -> torch.Tensor:
        """The encodings of positions start, ..., start + length - 1: [length, d_model]."""
        return self.table[start : start + length]


def check_token_ids(
    input_ids: torch.Tensor, vocab_size: int, ignore_index: int | None = None, name: str = "input_ids"
) -> None:
    """Raise a readable error for an empty batch or ids outside [0, vocab_size) (other than `ignore_index`) instead
    of a reshape or index error deep inside torch. Skipped under `torch.compile`, whose graphs cannot raise on
    values."""
    if torch.compiler.is_compiling():
        return
    if input_ids.numel() == 0:
        raise ValueError(
            f"{name} has shape {tuple(input_ids.shape)}: a batch needs at least one sequence of at least one token "
            "(the tokenizer saved with the model encodes even an empty string as '</s>')."
        )
    out_of_range = ((input_ids < 0) | (input_ids >= vocab_size)) & (input_ids != ignore_index)
    if out_of_range.any():
        bad = input_ids[out_of_range].unique()[:5].tolist()
        raise ValueError(
            f"Token ids {bad} are outside the vocabulary [0, {vocab_size}). The input was encoded with a tokenizer "
            "whose vocabulary does not match this model: use the tokenizer saved with the model, or call "
            "model.resize_token_embeddings(len(tokenizer))."
        )


class EncoderLayer(GradientCheckpointingLayer):
    """Encoder layer: self-attention, then the feed-forward network, each wrapped in Add & Norm (3.1)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.self_attn = SelfAttention(config, config.encoder_attention_heads, is_causal=False)
        self.self_attn_add_norm = AddAndNorm(config)
        self.feed_forward = PositionwiseFeedForward(config, config.encoder_ffn_dim)
        self.feed_forward_add_norm = AddAndNorm(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        tokens: ComputedTokens,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        sublayer_input = self.self_attn_add_norm.sublayer_input(hidden_states)
        attended, self_attn_weights = self.self_attn(sublayer_input, tokens, attention_mask, None, output_attentions)
        hidden_states = self.self_attn_add_norm(hidden_states, attended)
        transformed = self.feed_forward(self.feed_forward_add_norm.sublayer_input(hidden_states))
        return self.feed_forward_add_norm(hidden_states, transformed), self_attn_weights


class DecoderLayer(GradientCheckpointingLayer):
    """Decoder layer: masked self-attention, encoder-decoder attention, feed-forward, each with Add & Norm (3.1)."""

    def __init__(self, config: TransformerConfig, layer_idx: int):
        super().__init__()
        heads = config.decoder_attention_heads
        self.self_attn = SelfAttention(config, heads, is_causal=True, layer_idx=layer_idx)
        self.self_attn_add_norm = AddAndNorm(config)
        self.encoder_attn = EncoderDecoderAttention(config, heads, layer_idx=layer_idx)
        self.encoder_attn_add_norm = AddAndNorm(config)
        self.feed_forward = PositionwiseFeedForward(config, config.decoder_ffn_dim)
        self.feed_forward_add_norm = AddAndNorm(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        tokens: ComputedTokens,
        attention_mask: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        sublayer_input = self.self_attn_add_norm.sublayer_input(hidden_states)
        attended, self_attn_weights = self.self_attn(
            sublayer_input, tokens, attention_mask, cache, output_attentions
        )
        hidden_states = self.self_attn_add_norm(hidden_states, attended)
        sublayer_input = self.encoder_attn_add_norm.sublayer_input(hidden_states)
        attended, cross_attn_weights = self.encoder_attn(
            sublayer_input, encoder_hidden_states, tokens, encoder_attention_mask, cache, output_attentions
        )
        hidden_states = self.encoder_attn_add_norm(hidden_states, attended)
        transformed = self.feed_forward(self.feed_forward_add_norm.sublayer_input(hidden_states))
        return self.feed_forward_add_norm(hidden_states, transformed), self_attn_weights, cross_attn_weights


class TransformerPreTrainedModel(PreTrainedModel):
    config: TransformerConfig
    config_class = TransformerConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["EncoderLayer", "DecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *args, **kwargs):
        """`PreTrainedModel.from_pretrained`, naming the source when its weights file cannot be read and refusing
        weights that hold a NaN or an infinity (a file whose bytes were overwritten loads without an error)."""
        source = pretrained_model_name_or_path
        if os.path.isdir(source) and os.path.isfile(os.path.join(source, SAFE_WEIGHTS_NAME)):
            source = os.path.join(source, SAFE_WEIGHTS_NAME)
        try:
            loaded = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        except SafetensorError as error:
            raise OSError(f"Cannot read the weights in {source}, a truncated or corrupt file: {error}") from error
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # (model, loading_info) when asked for both
        non_finite = non_finite_tensors(model.named_parameters())
        if non_finite:
            raise ValueError(
                f"The weights in {source} hold NaN or infinite values ({', '.join(non_finite[:3])}...): the file is "
                "corrupt, or was saved from a run that diverged. Export it again from a good checkpoint."
            )
        return loaded

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Xavier-uniform linear layers (tensor2tensor, fairseq); N(0, d_model^-0.5) embeddings, so that
        sqrt(d_model)-scaled embeddings start at unit variance; LayerNorm as identity; the sinusoid tables recomputed.

        Xavier on a fused [3 d_model, d_model] Q/K/V matrix equals fairseq's per-projection Xavier with gain 1/sqrt(2).
        """
        if isinstance(module, nn.Linear):
            init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            std = self.config.init_std or self.config.d_model**-0.5
            init.normal_(module.weight, mean=0.0, std=std)
            # Slicing drops the "already loaded" flag, so check it here or loaded weights would be overwritten.
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, SinusoidalPositionalEncoding):
            init.copy_(module.table, module.sinusoids(*module.table.shape))


def _resolve(flag: bool | None, config: TransformerConfig, name: str) -> bool:
    return getattr(config, name) if flag is None else flag


class TransformerStack(nn.Module):
    """What the encoder and decoder share: token embeddings * sqrt(d_model) + positional encodings, then dropout
    (3.4, 3.5, 5.4), N layers, and a final LayerNorm when pre-LN."""

    def __init__(self, config: TransformerConfig, layers: list[nn.Module]):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.positional_encoding = SinusoidalPositionalEncoding(config.max_position_embeddings, config.d_model)
        self.layers = nn.ModuleList(layers)
        self.layer_norm = nn.LayerNorm(config.d_model) if config.normalize_before else None

    def embed(
        self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, past_length: int = 0
    ) -> torch.Tensor:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids and inputs_embeds.")
        if inputs_embeds is None:
            if past_length == 0:  # later decoding steps feed back the model's own predictions: in range by design
                check_token_ids(input_ids, self.embed_tokens.weight.shape[0])
            inputs_embeds = self.embed_tokens(input_ids)
        length = inputs_embeds.shape[1]
        if past_length + length > self.config.max_position_embeddings:
            raise ValueError(
                f"Sequence of {past_length + length} tokens is longer than max_position_embeddings="
                f"{self.config.max_position_embeddings}: truncate the input (tokenizer(..., truncation=True, "
                "max_length=...)) or raise max_position_embeddings in the config."
            )
        positions = self.positional_encoding(past_length, length).to(inputs_embeds.dtype)
        embeddings = inputs_embeds * self.embed_scale + positions
        return apply_dropout(embeddings, p=self.config.dropout, training=self.training)

    def run_layers(
        self, hidden_states: torch.Tensor, tokens: ComputedTokens, output_hidden_states: bool, *args, **kwargs
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None, list[tuple[torch.Tensor | None, ...]]]:
        """The N layers (3.1), then the final LayerNorm of pre-LN. Returns the output [batch, length, d_model], the
        input of every layer and the output (if `output_hidden_states`), and the attention weights of each kind
        (self, cross) as one tuple per kind over the layers."""
        all_hidden_states, all_weights = [], []
        for layer in self.layers:
            if output_hidden_states:
                all_hidden_states.append(tokens.unpack(hidden_states))
            hidden_states, *weights = layer(hidden_states, *args, **kwargs)
            all_weights.append(weights)
        hidden_states = tokens.unpack(hidden_states if self.layer_norm is None else self.layer_norm(hidden_states))
        all_hidden_states = (*all_hidden_states, hidden_states) if output_hidden_states else None
        return hidden_states, all_hidden_states, list(zip(*all_weights, strict=True))


class TransformerEncoder(TransformerStack):
    """The encoder: N identical layers over the embedded source (3.1)."""

    def __init__(self, config: TransformerConfig):
        super().__init__(config, [EncoderLayer(config) for _ in range(config.encoder_layers)])

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
    ) -> BaseModelOutput:
        output_attentions = _resolve(output_attentions, self.config, "output_attentions")
        output_hidden_states = _resolve(output_hidden_states, self.config, "output_hidden_states")
        hidden_states = self.embed(input_ids, inputs_embeds)
        # Padding is masked as keys, so no real output depends on what the layers compute there: skip it (the
        # output there is zeros).
        tokens = ComputedTokens(attention_mask)
        # None when nothing is padded, so sdpa can take its fastest path.
        attention_mask = create_bidirectional_mask(self.config, hidden_states, attention_mask)
        hidden_states, all_hidden_states, (attentions,) = self.run_layers(
            tokens.pack(hidden_states), tokens, output_hidden_states, tokens, attention_mask, output_attentions
        )
        return BaseModelOutput(hidden_states, all_hidden_states, attentions if output_attentions else None)


class TransformerDecoder(TransformerStack):
    """The decoder: N identical layers over the embedded target, shifted right by one position (3.1)."""

    def __init__(self, config: TransformerConfig):
        super().__init__(config, [DecoderLayer(config, layer_idx=i) for i in range(config.decoder_layers)])

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        positions_needed: torch.Tensor | None = None,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        """positions_needed: boolean [batch, length], the positions whose outputs will be used (default: all). Without a
        cache, the positions after the last needed one of each row are not computed (zeros in the output): under the
        causal mask no earlier position depends on them, so this skips the target padding of a training batch."""
        if encoder_hidden_states is None:
            raise ValueError("The decoder attends to the encoder output: pass encoder_hidden_states.")
        output_attentions = _resolve(output_attentions, self.config, "output_attentions")
        output_hidden_states = _resolve(output_hidden_states, self.config, "output_hidden_states")
        if _resolve(use_cache, self.config, "use_cache") and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        if not _resolve(use_cache, self.config, "use_cache"):
            cache = None

        past_length = cache.get_seq_length() if cache is not None else 0
        hidden_states = self.embed(input_ids, inputs_embeds, past_length)
        tokens = ComputedTokens.causal(positions_needed if cache is None else None)
        self_attn_mask = create_causal_mask(
            self.config,
            hidden_states,
            attention_mask,
            **{CACHE_NAME: cache.self_attention_cache if cache is not None else None},
        )
        encoder_attention_mask = create_bidirectional_mask(
            self.config, hidden_states, encoder_attention_mask, encoder_hidden_states=encoder_hidden_states
        )

        hidden_states, all_hidden_states, (self_attentions, cross_attentions) = self.run_layers(
            tokens.pack(hidden_states),
            tokens,
            output_hidden_states,
            encoder_hidden_states,
            tokens,
            self_attn_mask,
            encoder_attention_mask,
            cache=cache,
            output_attentions=output_attentions,
        )
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states,
            **{CACHE_NAME: cache},
            hidden_states=all_hidden_states,
            attentions=self_attentions if output_attentions else None,
            cross_attentions=cross_attentions if output_attentions else None,
        )


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher forcing: the decoder input is the target shifted right by one, starting with the start token."""
    decoder_input_ids = labels.roll(1, dims=-1)  # not labels[:, :-1], whose length would make torch.compile
    decoder_input_ids[:, 0] = decoder_start_token_id  # specialise short targets
    return decoder_input_ids.masked_fill_(decoder_input_ids == -100, pad_token_id)


class TransformerModel(TransformerPreTrainedModel):
    """Encoder and decoder without the output projection; returns the decoder's last hidden states."""

    _tied_weights_keys = {"decoder.embed_tokens.weight": "encoder.embed_tokens.weight"}

    def __init__(self, config: TransformerConfig):
        super().__init__(config)
        self.encoder = TransformerEncoder(config)
        self.decoder = TransformerDecoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        if not self.config.tie_word_embeddings:  # the target side has its own matrix: keep it the same size
            self.decoder.embed_tokens = self._get_resized_embeddings(self.decoder.embed_tokens, value.num_embeddings)
        self.encoder.embed_tokens = value

    def get_encoder(self) -> TransformerEncoder:
        return self.encoder

    def get_decoder(self) -> TransformerDecoder:
        return self.decoder

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        decoder_positions_needed: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
    ) -> Seq2SeqModelOutput:
        r"""
        decoder_positions_needed: boolean [batch, target_length], the decoder positions whose outputs will be used; the
            positions after the last needed one of each row are then not computed (see `TransformerDecoder`).
        past_key_values: `cache` under its name before transformers 5.24.
        """
        cache = cache if cache is not None else past_key_values
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids, attention_mask, inputs_embeds, output_attentions, output_hidden_states
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        decoder_outputs = self.decoder(
            decoder_input_ids,
            encoder_outputs.last_hidden_state,
            decoder_attention_mask,
            attention_mask,
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            positions_needed=decoder_positions_needed,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            **{CACHE_NAME: getattr(decoder_outputs, CACHE_NAME)},
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


class TransformerForConditionalGeneration(TransformerPreTrainedModel, GenerationMixin):
    """The full translation model: encoder-decoder plus the pre-softmax projection onto the vocabulary (3.4).

    With `labels`, the decoder input is the labels shifted right and the loss is the mean token cross-entropy
    (positions labelled -100 ignored).
    """

    _tied_weights_keys = {"lm_head.weight": "model.encoder.embed_tokens.weight"}

    def __init__(self, config: TransformerConfig):
        super().__init__(config)
        self.model = TransformerModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()
        # The paper's decoding (6.1): beam size 4, length penalty 0.6. Saved as generation_config.json, so a loaded
        # model decodes the same way; a generation_config.json in the folder replaces these defaults.
        self.generation_config.num_beams = 4
        self.generation_config.length_penalty = 0.6
        self.generation_config.max_length = min(256, config.max_position_embeddings)

    def get_encoder(self) -> TransformerEncoder:
        return self.model.encoder

    def get_decoder(self) -> TransformerDecoder:
        return self.model.decoder

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def training_flops(self, source_lengths: torch.Tensor, target_lengths: torch.Tensor) -> torch.Tensor:
        """Model FLOPs of a training step on pairs of these lengths, the numerator of MFU (see `efficiency.py`)."""
        return training_flops(self.config, source_lengths, target_lengths)

    # Beam search in `generate()` calls this at every step to make the cache follow the surviving beams.
    _reorder_cache = staticmethod(reorder_self_attention_cache)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        past_key_values: Cache | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        r"""
        labels: target token ids [batch, target_length]; -100 marks positions that count in no loss.
        logits_to_keep: the decoder positions to project onto the vocabulary, as in other Hugging Face models: an int
            keeps the last that many (0: all), a boolean [batch, target_length] mask keeps its True positions and
            flattens the logits to [kept, vocab_size]. Training with `logits_to_keep=labels != -100` skips the output
            projection and the softmax on padding, which are the largest per-token costs after the layers; without a
            cache, a boolean mask also spares the decoder layers the positions after each row's last True.
        num_items_in_batch: number of target tokens over all accumulated micro-batches (passed by the HF Trainer);
            the summed loss is divided by it so that gradient accumulation weighs every token equally.
        past_key_values: `cache` under its name before transformers 5.24 (whose `generate()` passes it so).
        """
        cache = cache if cache is not None else past_key_values
        keeps_a_mask = isinstance(logits_to_keep, torch.Tensor) and logits_to_keep.dtype == torch.bool
        if labels is not None:
            check_token_ids(labels, self.config.vocab_size, ignore_index=-100, name="labels")
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
                use_cache = False
        outputs = self.model(
            input_ids,
            attention_mask,
            decoder_input_ids,
            decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            decoder_positions_needed=logits_to_keep if keeps_a_mask else None,
        )
        logits = self.lm_head(keep_positions(outputs.last_hidden_state, logits_to_keep))

        loss = None
        if labels is not None:
            kept_labels = keep_positions(labels[..., None], logits_to_keep)[..., 0]
            per_token = num_items_in_batch is not None
            reduction = "sum" if per_token else "mean"
            loss = F.cross_entropy(logits.flatten(0, -2), kept_labels.flatten(), ignore_index=-100, reduction=reduction)
            if per_token:
                loss = loss / num_items_in_batch
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            **{CACHE_NAME: getattr(outputs, CACHE_NAME)},
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )


parse_forward_signature_once(TransformerForConditionalGeneration)

__all__ = [
    "TransformerForConditionalGeneration",
    "TransformerModel",
    "TransformerPreTrainedModel",
    "shift_tokens_right",
]

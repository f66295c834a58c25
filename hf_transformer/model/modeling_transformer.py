"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017), from scratch.

Each class maps onto a part of the paper, in its order: attention (eq. 1, 3.2), feed-forward (eq. 2), "Add & Norm",
positional encoding (3.5), encoder and decoder layers and stacks (3.1), the models, their loss and decoding (3.4, 5.4,
6.1). The plumbing (attention backends, masks, cache, generation, recording outputs, save/load) is Hugging Face's.
Layers take the paper's arguments and return hidden states; the mask's type, `PackedMask` (`speed.py`), skips padding.
"""

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
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
from transformers.utils import can_return_tuple
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from .compat import CACHE_NAME, accepts_past_key_values
from .configuration_transformer import TransformerConfig, max_new_tokens
from .integrity import VerifiedLoading, check_attention_mask, check_labels, check_positions, check_token_ids
from .loss import IGNORE_INDEX, shift_tokens_right, target_span, translation_loss
from .speed import PackedMask, apply_dropout


def scaled_dot_product_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V  (eq. 1), the "eager" backend, which `output_attentions=True`
    runs (sdpa, the default, computes the same without materialising the weights). q, k, v are [batch, heads, length,
    d_k]; returns [batch, length, heads, d_k] and the weights. The mask is boolean (True = attend) or additive."""
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
    The W_i of all heads lie side by side in one matrix per input, and inputs from the same tensor are projected in one
    matrix multiply (the subclasses). This class splits the heads, runs eq. 1 with the configured backend and W^O."""

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

    def attend(self, query, key, value, mask: PackedMask, output_attentions: bool) -> tuple[torch.Tensor, ...]:
        """Eq. 1 on the heads [batch, heads, length, d_k], then W^O: the output (packed as `mask` packs) and the
        attention weights (if asked), which the stacks' `capture_outputs` records from this return."""
        implementation = self.config._attn_implementation
        attention: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, scaled_dot_product_attention)
        if output_attentions and attention is not scaled_dot_product_attention:
            if implementation != "sdpa":
                raise ValueError(
                    f"output_attentions=True needs attn_implementation 'eager' or 'sdpa', not {implementation!r}: "
                    "call model.set_attn_implementation('eager') first."
                )
            attention = scaled_dot_product_attention  # eq. 1 written out: sdpa's fused kernel never holds the weights
        dropout = self.attention_dropout if self.training else 0.0
        output, weights = attention(self, query, key, value, mask.mask, dropout=dropout, scaling=self.scaling)
        batch, length = output.shape[:2]
        return self.out_proj(mask.pack(output.reshape(batch, length, -1))), weights


class SelfAttention(MultiHeadAttention):
    """Self-attention: queries, keys and values all come from the previous layer (3.2.3). In the decoder, position i
    attends only to positions <= i (`is_causal`), and the keys and values of earlier steps come from the cache."""

    def __init__(self, config: TransformerConfig, num_heads: int, is_causal: bool, layer_idx: int | None = None):
        super().__init__(config, num_heads, is_causal, layer_idx)
        self.qkv_proj = nn.Linear(config.d_model, 3 * config.d_model)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: PackedMask,
        cache: EncoderDecoderCache | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        query, key, value = self.split_heads(attention_mask.unpack(self.qkv_proj(hidden_states)))
        if cache is not None:
            key, value = cache.self_attention_cache.update(key, value, self.layer_idx)
        return self.attend(query, key, value, attention_mask, output_attentions)


class EncoderDecoderAttention(MultiHeadAttention):
    """Encoder-decoder attention: queries from the decoder, keys and values from the encoder output (3.2.3), which
    do not change while decoding: computed at the first step, then read from the cache."""

    def __init__(self, config: TransformerConfig, num_heads: int, layer_idx: int | None = None):
        super().__init__(config, num_heads, is_causal=False, layer_idx=layer_idx)
        self.q_proj = nn.Linear(config.d_model, config.d_model)
        self.kv_proj = nn.Linear(config.d_model, 2 * config.d_model)

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: PackedMask,
        cache: EncoderDecoderCache | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        (query,) = self.split_heads(attention_mask.unpack(self.q_proj(hidden_states)))
        if cache is not None and cache.is_updated.get(self.layer_idx):
            cached = cache.cross_attention_cache.layers[self.layer_idx]
            key, value = cached.keys, cached.values
        else:
            key, value = self.split_heads(self.kv_proj(encoder_hidden_states))
            if cache is not None:
                key, value = cache.cross_attention_cache.update(key, value, self.layer_idx)
                cache.is_updated[self.layer_idx] = True
        return self.attend(query, key, value, attention_mask, output_attentions)


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
    """Add & Norm, around each sub-layer (3.1, 5.4): post-LN (the paper) LayerNorm(x + Dropout(Sublayer(x))), pre-LN
    (`normalize_before`) x + Dropout(Sublayer(LayerNorm(x))). x = add_norm(x, sublayer(add_norm.sublayer_input(x)))."""

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

    A table, so that a decoding step reads a row instead of computing it; not saved (`_init_weights` recomputes it
    when `from_pretrained` builds the model on the meta device)."""

    def __init__(self, num_positions: int, d_model: int):
        super().__init__()
        self.register_buffer("table", self.sinusoids(num_positions, d_model), persistent=False)

    @staticmethod
    def sinusoids(num_positions: int, d_model: int) -> torch.Tensor:
        """[num_positions, d_model] float32 encodings of positions 0, 1, ..."""
        exponents = torch.arange(0, d_model, 2, dtype=torch.float32) / d_model
        angles = torch.arange(num_positions, dtype=torch.float32)[:, None] / (10000.0**exponents)[None, :]
        return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)[:, :d_model]

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.table[positions]  # [length] -> [length, d_model]


class EncoderLayer(GradientCheckpointingLayer):
    """Encoder layer: self-attention, then the feed-forward network, each wrapped in Add & Norm (3.1)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.self_attn = SelfAttention(config, config.encoder_attention_heads, is_causal=False)
        self.self_attn_add_norm = AddAndNorm(config)
        self.feed_forward = PositionwiseFeedForward(config, config.encoder_ffn_dim)
        self.feed_forward_add_norm = AddAndNorm(config)

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: PackedMask, output_attentions: bool = False
    ) -> torch.Tensor:
        sublayer_input = self.self_attn_add_norm.sublayer_input(hidden_states)
        attended, _ = self.self_attn(sublayer_input, attention_mask, None, output_attentions)
        hidden_states = self.self_attn_add_norm(hidden_states, attended)
        transformed = self.feed_forward(self.feed_forward_add_norm.sublayer_input(hidden_states))
        return self.feed_forward_add_norm(hidden_states, transformed)


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
        attention_mask: PackedMask,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: PackedMask,
        cache: EncoderDecoderCache | None = None,
        output_attentions: bool = False,
    ) -> torch.Tensor:
        sublayer_input = self.self_attn_add_norm.sublayer_input(hidden_states)
        attended, _ = self.self_attn(sublayer_input, attention_mask, cache, output_attentions)
        hidden_states = self.self_attn_add_norm(hidden_states, attended)
        sublayer_input = self.encoder_attn_add_norm.sublayer_input(hidden_states)
        attended, _ = self.encoder_attn(
            sublayer_input, encoder_hidden_states, encoder_attention_mask, cache, output_attentions
        )
        hidden_states = self.encoder_attn_add_norm(hidden_states, attended)
        transformed = self.feed_forward(self.feed_forward_add_norm.sublayer_input(hidden_states))
        return self.feed_forward_add_norm(hidden_states, transformed)


class TransformerPreTrainedModel(VerifiedLoading, PreTrainedModel):
    config: TransformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["EncoderLayer", "DecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True  # any function registered in ALL_ATTENTION_FUNCTIONS
    _can_compile_fullgraph = True  # `PackedMask` and the input checks step aside under torch.compile

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Xavier-uniform linear layers (tensor2tensor; on the fused Q/K/V, fairseq's gain 1/sqrt(2)), N(0, init_std)
        embeddings (init_std = d_model^-0.5: scaled ones start at unit variance), identity LayerNorm, the sinusoids."""
        if isinstance(module, nn.Linear):
            init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, SinusoidalPositionalEncoding):
            init.copy_(module.table, module.sinusoids(*module.table.shape))
        else:
            super()._init_weights(module)


class TransformerStack(TransformerPreTrainedModel):
    """What the encoder and decoder share: token embeddings * sqrt(d_model) + positional encodings, then dropout (3.4,
    3.5, 5.4), N layers, a final LayerNorm when pre-LN. A model, as Marian's stacks, so that `capture_outputs` records
    what `_can_record_outputs` names; no `post_init`: its holder initializes all weights, in their usual order."""

    def __init__(self, config: TransformerConfig, layers: list[nn.Module]):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.positional_encoding = SinusoidalPositionalEncoding(config.max_position_embeddings, config.d_model)
        self.layers = nn.ModuleList(layers)
        self.layer_norm = nn.LayerNorm(config.d_model) if config.normalize_before else None
        # Set by `gradient_checkpointing_enable`; `merge_with_config_defaults` then turns the decoder's cache off.
        self.gradient_checkpointing = False

    def embed(
        self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, past_length: int | torch.Tensor = 0
    ) -> torch.Tensor:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(f"{self.positions_of.capitalize()} needs exactly one of {self.inputs}.")
        # Later decoding steps feed back predictions. In training on a GPU, the ids come from a data pipeline that
        # checks them once (this package's collate, on the CPU): checked here, each step would wait for the device.
        if inputs_embeds is None:
            if not isinstance(past_length, torch.Tensor) and past_length == 0:
                check_token_ids(input_ids, self.embed_tokens.weight.shape[0], training=self.training)
            inputs_embeds = self.embed_tokens(input_ids)
        length = inputs_embeds.shape[1]
        check_positions(past_length + length, self.config.max_position_embeddings, self.positions_of)
        positions = self.positional_encoding(torch.arange(length, device=inputs_embeds.device) + past_length)
        embeddings = inputs_embeds * self.embed_scale + positions.to(inputs_embeds.dtype)
        return apply_dropout(embeddings, p=self.config.dropout, training=self.training)

    def asked(self, flag: bool | None, name: str) -> bool:
        """An `output_*` flag as `capture_outputs` reads it: the argument, or where it is left out the config's."""
        return bool(getattr(self.config, name) if flag is None else flag)

    def run_layers(self, hidden_states: torch.Tensor, mask: PackedMask, *layer_args, **layer_kwargs) -> torch.Tensor:
        """The N layers (3.1) on the packed tokens, then pre-LN's final LayerNorm."""
        hidden_states = mask.pack(hidden_states)
        for layer in self.layers:
            # Tensors that need gradients go positionally (reentrant checkpointing differentiates only those), the
            # cache by keyword: `GradientCheckpointingLayer` drops only a keyword `cache` when it checkpoints.
            hidden_states = layer(hidden_states, mask, *layer_args, **layer_kwargs)
        return mask.unpack(hidden_states if self.layer_norm is None else self.layer_norm(hidden_states))


class TransformerEncoder(TransformerStack):
    """The encoder: N identical layers over the embedded source (3.1)."""

    positions_of, inputs = "the source", "input_ids and inputs_embeds"
    _can_record_outputs = {"hidden_states": EncoderLayer, "attentions": SelfAttention}

    def __init__(self, config: TransformerConfig):
        super().__init__(config, [EncoderLayer(config) for _ in range(config.encoder_layers)])

    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
    ) -> BaseModelOutput:
        hidden_states = self.embed(input_ids, inputs_embeds)
        check_attention_mask(attention_mask, hidden_states.shape[:2], "attention_mask", self.positions_of)
        # Padding is masked as keys, so no real output depends on what the layers compute there: skip it (zeros in the
        # output) unless each layer's output is recorded. The mask is None without padding: sdpa's fastest path.
        needed = None if self.asked(output_hidden_states, "output_hidden_states") else attention_mask
        mask = PackedMask(needed, create_bidirectional_mask(self.config, hidden_states, attention_mask))
        output_attentions = self.asked(output_attentions, "output_attentions")
        return BaseModelOutput(self.run_layers(hidden_states, mask, output_attentions=output_attentions))


class TransformerDecoder(TransformerStack):
    """The decoder: N identical layers over the embedded target, shifted right by one position (3.1). Without a cache,
    positions after each row's last one that `attention_mask` marks are not computed (zeros in the output): under the
    causal mask no earlier position depends on them."""

    positions_of = "the target"
    inputs = "decoder_input_ids and decoder_inputs_embeds (or labels: TransformerForConditionalGeneration shifts them)"
    _can_record_outputs = {
        "hidden_states": DecoderLayer,
        "attentions": SelfAttention,
        "cross_attentions": EncoderDecoderAttention,
    }

    def __init__(self, config: TransformerConfig):
        super().__init__(config, [DecoderLayer(config, layer_idx=i) for i in range(config.decoder_layers)])

    @accepts_past_key_values
    @merge_with_config_defaults
    @capture_outputs
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
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        if encoder_hidden_states is None:
            raise ValueError("The decoder attends to the encoder output: pass encoder_hidden_states.")
        if not use_cache:  # the config's use_cache where None (`merge_with_config_defaults`)
            cache = None
        elif cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))

        past_length = cache.get_seq_length() if cache is not None else 0
        hidden_states = self.embed(input_ids, inputs_embeds, past_length)
        batch, length = hidden_states.shape[:2]
        # With a cache, the mask covers the cached positions too (as `generate` extends it).
        check_attention_mask(attention_mask, (batch, past_length + length), "decoder_attention_mask", self.positions_of)
        check_attention_mask(
            encoder_attention_mask, encoder_hidden_states.shape[:2], "attention_mask", "the encoder output"
        )
        self_attention_cache = cache.self_attention_cache if cache is not None else None
        packed = cache is None and not self.asked(output_hidden_states, "output_hidden_states")
        self_mask = PackedMask.causal(
            attention_mask if packed else None,
            create_causal_mask(self.config, hidden_states, attention_mask, **{CACHE_NAME: self_attention_cache}),
        )
        encoder_mask = create_bidirectional_mask(
            self.config, hidden_states, encoder_attention_mask, encoder_hidden_states=encoder_hidden_states
        )
        cross_mask = self_mask.with_mask(encoder_mask)  # the same packing of the queries
        options = dict(cache=cache, output_attentions=self.asked(output_attentions, "output_attentions"))
        hidden_states = self.run_layers(hidden_states, self_mask, encoder_hidden_states, cross_mask, **options)
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden_states, **{CACHE_NAME: cache})


class TransformerModel(TransformerPreTrainedModel):
    """Encoder and decoder without the output projection (`AutoModel`): returns the decoder's last hidden states."""

    _tied_weights_keys = {"decoder.embed_tokens.weight": "encoder.embed_tokens.weight"}

    def __init__(self, config: TransformerConfig):
        super().__init__(config)
        self.encoder = TransformerEncoder(config)
        self.decoder = TransformerDecoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        if not self.config.tie_word_embeddings:  # the target side has its own matrix: resize it alike
            old = self.decoder.embed_tokens
            resized = nn.Embedding(value.num_embeddings, old.embedding_dim, old.padding_idx).to(old.weight)
            self._init_weights(resized)
            with torch.no_grad():  # the rows both have (a slice stops at the end)
                resized.weight[: old.num_embeddings] = old.weight[: value.num_embeddings]
            self.decoder.embed_tokens = resized
        self.encoder.embed_tokens = value

    @accepts_past_key_values
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
        return_dict: bool | None = None,  # taken by `can_return_tuple`
    ) -> Seq2SeqModelOutput:
        asked = dict(output_attentions=output_attentions, output_hidden_states=output_hidden_states)
        asked = {name: flag for name, flag in asked.items() if flag is not None}  # else the stacks read the config's
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids, attention_mask, inputs_embeds, **asked)
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        options = dict(cache=cache, inputs_embeds=decoder_inputs_embeds, use_cache=use_cache, **asked)
        decoder_outputs = self.decoder(
            decoder_input_ids, encoder_outputs.last_hidden_state, decoder_attention_mask, attention_mask, **options
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
            **{CACHE_NAME: getattr(decoder_outputs, CACHE_NAME)},
        )


class TransformerForConditionalGeneration(TransformerPreTrainedModel, GenerationMixin):
    """The full translation model: encoder-decoder and the pre-softmax projection onto the vocabulary (3.4). With
    `labels`, the decoder reads them shifted right; the loss is 5.4's, label-smoothed (`config.label_smoothing`)."""

    _tied_weights_keys = {"lm_head.weight": "model.encoder.embed_tokens.weight"}
    # The Hugging Face Trainer passes `num_items_in_batch` to a model that says so (or whose forward takes **kwargs).
    accepts_loss_kwargs = True

    def __init__(self, config: TransformerConfig):
        super().__init__(config)
        self.model = TransformerModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()
        # The paper's decoding (6.1), saved with the model (generation_config.json) unless a trainer sets others; the
        # output's length follows `max_new_tokens` below, which depends on the source, so it is not saved.
        self.generation_config.num_beams = 4
        self.generation_config.length_penalty = 0.6

    def generate(self, inputs: torch.Tensor | None = None, generation_config: GenerationConfig | None = None, **kwargs):
        """`GenerationMixin.generate`, whose output, where no bound is set (by argument, in a `generation_config` passed
        or in the model's), is at most `max_new_tokens` (6.1) of the source's length (a padded batch's longest)."""
        names, configs = ("max_new_tokens", "max_length"), (generation_config, self.generation_config)
        bounds = [kwargs.get(name) for name in names] + [getattr(c, name, None) for c in configs for name in names]
        source = kwargs.get("input_ids", kwargs.get("inputs_embeds", inputs))
        if all(bound is None for bound in bounds) and source is not None:
            kwargs["max_new_tokens"] = max_new_tokens(source.shape[1], self.config.max_position_embeddings)
        return super().generate(inputs, generation_config, **kwargs)

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    @staticmethod
    def _reorder_cache(cache: EncoderDecoderCache, beam_idx: torch.Tensor) -> EncoderDecoderCache:
        """Beam search in `generate()` calls this at every step: only the self-attention cache follows the surviving
        beams. All beams of a sentence hold the same encoder keys and values: reordering them would copy for nothing."""
        cache.self_attention_cache.reorder_cache(beam_idx)
        return cache

    @accepts_past_key_values
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
        return_dict: bool | None = None,  # taken by `can_return_tuple`
        logits_to_keep: int | torch.Tensor = 0,
        num_items_in_batch: int | torch.Tensor | None = None,
        label_smoothing: float | None = None,
        return_logits: bool | None = None,
    ) -> Seq2SeqLMOutput:
        r"""The arguments of Hugging Face's encoder-decoder models (any other is refused), and:

        Args:
            labels: target ids [batch, target_length], -100 where nothing counts in the loss; without a
                `decoder_attention_mask`, the decoder stops at each row's last target token (`target_span`).
            logits_to_keep: the positions to project onto the vocabulary: the last n for an int n (0: all), or a 1D
                tensor.
            num_items_in_batch: target tokens of all accumulated micro-batches (the Hugging Face Trainer passes it):
                the summed loss is divided by it instead of by this batch's, so that every token weighs equally.
            label_smoothing: this call's epsilon_ls instead of `config.label_smoothing` (0.0: plain log-likelihood).
            return_logits: with `labels`, whether to compute the logits too; by default in eval mode only, where
                Hugging Face's Trainer reads them for its metrics: training never holds them all (`loss.py`).
        """
        if labels is not None:
            # Training: a cache would hold every layer's keys and values for nothing and turn off padding removal.
            use_cache = False
            check_token_ids(labels, self.config.vocab_size, IGNORE_INDEX, "labels", training=self.training)
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
            check_labels(labels, decoder_input_ids if decoder_input_ids is not None else decoder_inputs_embeds)
            if decoder_attention_mask is None:
                decoder_attention_mask = target_span(labels)
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
        )
        hidden_states = outputs.last_hidden_state
        loss = logits = None
        if labels is not None:
            smoothing = self.config.label_smoothing if label_smoothing is None else label_smoothing
            loss = translation_loss(hidden_states, self.lm_head.weight, labels, smoothing, num_items_in_batch)
        if labels is None or (not self.training if return_logits is None else return_logits):
            keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
            logits = self.lm_head(hidden_states[:, keep])
        fields = {name: value for name, value in outputs.items() if name != "last_hidden_state"}  # cache, attentions...
        return Seq2SeqLMOutput(loss=loss, logits=logits, **fields)


__all__ = ["TransformerForConditionalGeneration", "TransformerModel", "TransformerPreTrainedModel"]

"""Speed machinery beside the paper's path in `modeling_transformer.py`. None of it changes a result (each piece is
tested equal to the plain computation), each was measured (README.md, "What the profiles showed"), and each steps aside
under `torch.compile`, whose graphs cannot hold data-dependent shapes or the CPU dropout's random words.

Saved model folders carry this file with their remote code (the modeling file imports it relatively).
"""

import inspect

import torch
import torch.nn.functional as F
from transformers.cache_utils import EncoderDecoderCache


def apply_dropout(hidden_states: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout (5.4) that is 2-3x faster on CPU than `F.dropout`, elsewhere and under `torch.compile` `F.dropout`.

    On CPU torch draws one Mersenne Twister number per element for the mask, which made dropout 6-8% of a training
    step; here every random 64-bit word gives the mask of four elements (p is rounded to a multiple of 2^-16). The
    boolean mask kept for the backward pass is also a quarter the size of torch's float one.
    """
    if not training or p == 0.0 or hidden_states.device.type != "cpu" or torch.compiler.is_compiling():
        return F.dropout(hidden_states, p=p, training=training)
    words = torch.empty((hidden_states.numel() + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
    uniform_int16 = words.view(torch.int16)[: hidden_states.numel()].view(hidden_states.shape)
    keep = uniform_int16 >= round(p * 2**16) - 2**15
    return torch.where(keep, hidden_states, 0.0).mul_(1.0 / (1.0 - p))


class ComputedTokens:
    """The positions of a [batch, length] batch whose outputs are needed, so that padding costs no computation.

    Every sub-layer but attention acts on each position separately (the projections, eq. 2, Add & Norm), so the layers
    carry only the needed tokens, packed as [tokens, d_model]. Attention unpacks them to [batch, length, ...], with
    zeros at the other positions, which the attention mask (or, after the last needed target token, the causal mask)
    keeps out of every needed output. This is the padding removal of EffectiveTransformer and TurboTransformers.

    Made from a 2D mask (nonzero = needed); from None, a prepared 4D mask, a mask with nothing to skip, or under
    `torch.compile` (the number of needed tokens is a data-dependent shape), `pack` and `unpack` return their input.
    """

    def __init__(self, needed: torch.Tensor | None):
        self.index = None
        if needed is not None and needed.dim() == 2 and not torch.compiler.is_compiling():
            index = needed.flatten().nonzero().squeeze(-1)
            if index.numel() < needed.numel():
                self.index, self.shape = index, needed.shape

    @classmethod
    def causal(cls, positions_needed: torch.Tensor | None) -> "ComputedTokens":
        """Under a causal mask: a position is computed if it or any later position in its row is needed, since no
        earlier position depends on the ones after it."""
        return cls(None if positions_needed is None else positions_needed.flip(-1).cumsum(-1).flip(-1) > 0)

    def pack(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[batch, length, ...] -> [tokens, ...]"""
        return hidden_states if self.index is None else hidden_states.flatten(0, 1).index_select(0, self.index)

    def unpack(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[tokens, ...] -> [batch, length, ...], zeros at the positions not computed."""
        if self.index is None:
            return hidden_states
        unpacked = hidden_states.new_zeros(self.shape.numel(), *hidden_states.shape[1:])
        return unpacked.index_copy_(0, self.index, hidden_states).unflatten(0, self.shape)


def keep_positions(hidden_states: torch.Tensor, logits_to_keep: int | torch.Tensor) -> torch.Tensor:
    """The decoder positions to project onto the vocabulary, with the meaning `logits_to_keep` has in every Hugging
    Face model: an int keeps the last that many (0: all), a 1D tensor those positions of every row, a 2D integer
    tensor those positions of each row, a 2D boolean mask its True positions, flattened to [kept, d_model].

    Written here rather than imported: saved folders run under the user's transformers, and
    `transformers.modeling_utils.slice_logits_to_keep` only exists in recent releases.
    """
    if isinstance(logits_to_keep, int):
        return hidden_states[:, -logits_to_keep:] if logits_to_keep else hidden_states
    if logits_to_keep.dim() == 2 and logits_to_keep.dtype == torch.bool:
        return hidden_states[logits_to_keep]
    if logits_to_keep.dim() == 2:
        return torch.take_along_dim(hidden_states, logits_to_keep[..., None], dim=1)
    return hidden_states[:, logits_to_keep]


def training_flops(config, source_lengths: torch.Tensor, target_lengths: torch.Tensor) -> torch.Tensor:
    """Model FLOPs of one training step (forward and backward) of a model with this `TransformerConfig` on pairs of
    these lengths: the numerator of MFU.

    Counts the matrix multiplies, at 2 FLOPs per multiply-add and 3x the forward for forward + backward (the
    convention of PaLM's appendix B): the projections and feed-forward layers of every real token, the attention
    scores and weighted sums in full (as fused kernels compute them, causal or not) and the output projection of
    every target token. Padding, which the model does not compute, does not count, nor does recomputation.
    Takes and returns tensors, so that counting on a GPU does not wait for it.
    """
    d = config.d_model
    source, target = source_lengths.long(), target_lengths.long()
    source_tokens, target_tokens = source.sum(), target.sum()
    encoder_layer = source_tokens * (4 * d * d + 2 * d * config.encoder_ffn_dim) + 2 * d * (source * source).sum()
    decoder_layer = (
        # Self-attention (Q, K, V, output), encoder-decoder queries and output, feed-forward.
        target_tokens * (6 * d * d + 2 * d * config.decoder_ffn_dim)
        + source_tokens * 2 * d * d  # the encoder-decoder keys and values, computed once per layer
        + 2 * d * ((target * target).sum() + (target * source).sum())
    )
    output_projection = target_tokens * d * config.vocab_size
    return 6 * (config.encoder_layers * encoder_layer + config.decoder_layers * decoder_layer + output_projection)


def reorder_self_attention_cache(cache: EncoderDecoderCache, beam_idx: torch.Tensor) -> EncoderDecoderCache:
    """The `_reorder_cache` of beam search: only the self-attention cache follows the surviving beams. A beam only
    ever continues a beam of its own sentence, and all beams of a sentence hold the same encoder keys and values, so
    reordering those would copy them for nothing."""
    cache.self_attention_cache.reorder_cache(beam_idx)
    return cache


def parse_forward_signature_once(model_class: type) -> None:
    """For models registered for remote code (as importing this package does), `generate()` parses the forward's
    signature at every decoding step, to see whether it takes `cache_position`. Parsed once, each check takes 8 us,
    not 32."""
    model_class.forward.__signature__ = inspect.signature(model_class.forward)

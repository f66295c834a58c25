"""Speed machinery beside the paper's path in `modeling_transformer.py`: a faster dropout on CPU and padding removal.
Neither changes a result (each is tested equal to the plain computation), each was measured (docs, "Speed"), and each
steps aside under `torch.compile`, whose graphs cannot hold data-dependent shapes or the CPU dropout's random words.

Saved model folders carry this file with their remote code (the modeling file imports it relatively).
"""

import torch
import torch.nn.functional as F


def apply_dropout(hidden_states: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout (5.4), faster on CPU than `F.dropout`; elsewhere and under `torch.compile`, `F.dropout`.

    On CPU torch draws one Mersenne Twister number per element for the mask; here every random 64-bit word gives the
    mask of four elements (p is rounded to a multiple of 2^-16). The boolean mask kept for the backward pass is also a
    quarter the size of torch's float one.
    """
    if not training or p == 0.0 or hidden_states.device.type != "cpu" or torch.compiler.is_compiling():
        return F.dropout(hidden_states, p=p, training=training)
    words = torch.empty((hidden_states.numel() + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
    uniform_int16 = words.view(torch.int16)[: hidden_states.numel()].view(hidden_states.shape)
    keep = uniform_int16 >= round(p * 2**16) - 2**15
    return torch.where(keep, hidden_states, 0.0).mul_(1.0 / (1.0 - p))


def up_to_last(mask: torch.Tensor) -> torch.Tensor:
    """The positions of each row up to its last nonzero one in `mask` ([batch, length])."""
    return mask.flip(-1).cumsum(-1).flip(-1) > 0


class PackedMask:
    """The attention mask of hidden states packed as [tokens, d_model]: only the positions of a [batch, length] batch
    whose outputs are needed, so that padding costs no computation (the padding removal of EffectiveTransformer).

    Every sub-layer but attention acts on each position separately (the projections, eq. 2, Add & Norm), so the layers
    carry only the needed tokens and receive this object as their attention mask. Attention `unpack`s its projected
    input to [batch, length, ...], with zeros at the other positions (which `mask` keeps out of every needed output),
    applies `mask`, and `pack`s its output again.

    `needed` is a 2D mask (nonzero = needed); with None, a 4D mask, nothing to skip, or under `torch.compile` (the
    number of needed tokens is a data-dependent shape), nothing is packed and `pack`/`unpack` return their input.
    `mask` is the attention mask prepared for the attention backend (None: attend everywhere, or causal).
    """

    def __init__(self, needed: torch.Tensor | None, mask: torch.Tensor | None):
        self.mask, self.index, self.shape = mask, None, None
        if needed is not None and needed.dim() == 2 and not torch.compiler.is_compiling():
            index = needed.flatten().nonzero().squeeze(-1)
            if index.numel() < needed.numel():
                self.index, self.shape = index, needed.shape

    @classmethod
    def causal(cls, needed: torch.Tensor | None, mask: torch.Tensor | None) -> "PackedMask":
        """Under a causal mask a position is computed if it or any later position in its row is needed: no earlier
        position depends on the ones after it."""
        return cls(None if needed is None else up_to_last(needed), mask)

    def with_mask(self, mask: torch.Tensor | None) -> "PackedMask":
        """The same packing of the queries with another mask (the encoder-decoder attention's)."""
        other = PackedMask(None, mask)  # not copy.copy, which torch.compile before torch 2.12 does not trace
        other.index, other.shape = self.index, self.shape
        return other

    def pack(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[batch, length, ...] -> [tokens, ...]"""
        return hidden_states if self.index is None else hidden_states.flatten(0, 1).index_select(0, self.index)

    def unpack(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[tokens, ...] -> [batch, length, ...], zeros at the positions not computed."""
        if self.index is None:
            return hidden_states
        unpacked = hidden_states.new_zeros(self.shape.numel(), *hidden_states.shape[1:])
        return unpacked.index_copy_(0, self.index, hidden_states).unflatten(0, self.shape)

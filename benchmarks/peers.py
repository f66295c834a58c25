"""The models compared in the benchmarks, built at identical sizes: ours, Hugging Face's MarianMTModel (the same
post-LN sinusoidal architecture) and a model around `torch.nn.Transformer`. Each exposes `loss(model, batch)`."""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import MarianConfig, MarianMTModel

from hf_transformer import TransformerConfig, TransformerForConditionalGeneration

SIZES = {
    "small": dict(d_model=256, layers=3, heads=4, ffn_dim=1024),
    "base": dict(d_model=512, layers=6, heads=8, ffn_dim=2048),
    "big": dict(d_model=1024, layers=6, heads=16, ffn_dim=4096),
}
PAD, BOS, EOS = 0, 1, 2


@dataclass
class Peer:
    name: str
    build: Callable[[dict, int], nn.Module]
    loss: Callable[[nn.Module, dict], torch.Tensor]


def shared_sizes(size: dict, vocab_size: int) -> dict:
    """The config fields that ours and Marian name alike."""
    return dict(
        vocab_size=vocab_size,
        d_model=size["d_model"],
        encoder_layers=size["layers"],
        decoder_layers=size["layers"],
        encoder_attention_heads=size["heads"],
        decoder_attention_heads=size["heads"],
        encoder_ffn_dim=size["ffn_dim"],
        decoder_ffn_dim=size["ffn_dim"],
        dropout=0.1,
        max_position_embeddings=512,
    )


def build_ours(size: dict, vocab_size: int) -> nn.Module:
    return TransformerForConditionalGeneration(TransformerConfig(**shared_sizes(size, vocab_size)))


def build_marian(size: dict, vocab_size: int) -> nn.Module:
    config = MarianConfig(
        **shared_sizes(size, vocab_size),
        activation_function="relu",
        attention_dropout=0.0,
        activation_dropout=0.0,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=BOS,
        forced_eos_token_id=None,
    )
    return MarianMTModel(config).to(dtype=torch.float32)


def seq2seq_loss(model: nn.Module, batch: dict, **options) -> torch.Tensor:
    return model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"], **options
    ).loss


def ours_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    """Our model's own loss, as training calls it, without label smoothing (as Marian's loss): the decoder skips the
    target padding, and the output projection and the loss run chunk by chunk on the target positions only (compiled,
    on every position); no [tokens, vocabulary] logits are kept."""
    return seq2seq_loss(model, batch, label_smoothing=0.0)


class TorchTransformer(nn.Module):
    """Embeddings * sqrt(d) + sinusoids, `nn.Transformer` (post-LN, ReLU), output projection tied to the embeddings."""

    def __init__(self, size: dict, vocab_size: int):
        super().__init__()
        d_model = size["d_model"]
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=PAD)
        self.transformer = nn.Transformer(
            d_model, size["heads"], size["layers"], size["layers"], size["ffn_dim"], dropout=0.1, batch_first=True
        )
        positions = torch.arange(512)[:, None] / 10000 ** (torch.arange(0, d_model, 2) / d_model)
        self.register_buffer("positions", torch.stack((positions.sin(), positions.cos()), -1).flatten(1))
        self.scale = math.sqrt(d_model)

    def embed_with_positions(self, ids: torch.Tensor) -> torch.Tensor:
        return F.dropout(self.embed(ids) * self.scale + self.positions[: ids.shape[1]], 0.1, self.training)

    def forward(self, input_ids, attention_mask, decoder_input_ids):
        causal = nn.Transformer.generate_square_subsequent_mask(decoder_input_ids.shape[1], dtype=torch.bool)
        source_padding = attention_mask == 0
        hidden = self.transformer(
            self.embed_with_positions(input_ids),
            self.embed_with_positions(decoder_input_ids),
            tgt_mask=causal,
            src_key_padding_mask=source_padding,
            memory_key_padding_mask=source_padding,
            tgt_is_causal=True,
        )
        return hidden @ self.embed.weight.T


def torch_transformer_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    labels = batch["labels"]
    decoder_input_ids = torch.cat([torch.full_like(labels[:, :1], BOS), labels[:, :-1].clamp(min=0)], dim=1)
    logits = model(batch["input_ids"], batch["attention_mask"], decoder_input_ids)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


PEERS = {
    "ours": Peer("ours", build_ours, ours_loss),
    "marian": Peer("marian", build_marian, seq2seq_loss),
    "nn.Transformer": Peer("nn.Transformer", TorchTransformer, torch_transformer_loss),
}


def random_batch(vocab_size: int, max_tokens: int, mean_length: int, seed: int) -> dict:
    """A token-budget batch of random pairs with varied lengths and right padding (the same for every model)."""
    generator = torch.Generator().manual_seed(seed)
    rows = max(1, max_tokens // (mean_length + 4))
    source_lengths = torch.randint(mean_length - 4, mean_length + 5, (rows,), generator=generator)
    target_lengths = torch.randint(mean_length - 4, mean_length + 5, (rows,), generator=generator)
    positions = torch.arange(mean_length + 4)
    source = torch.randint(4, vocab_size, (rows, mean_length + 4), generator=generator)
    source_mask = positions < source_lengths[:, None]
    labels = torch.randint(4, vocab_size, (rows, mean_length + 4), generator=generator)
    labels = labels.masked_fill(positions >= target_lengths[:, None], -100)
    return {"input_ids": source.masked_fill(~source_mask, PAD), "attention_mask": source_mask.long(), "labels": labels}

"""The attention weights of a translation, which the architecture is named after: every layer and head of the
encoder's self-attention, the decoder's masked self-attention and the encoder-decoder attention (3.2.3), computed
teacher-forced over the output that beam search produced; hard alignments read from the encoder-decoder attention
(fairseq's `--print-alignment`); and heatmaps of them (matplotlib, the `plot` extra).

Row i of the decoder's maps is the step that produced target token i: it reads the start token and the tokens before
token i, so its encoder-decoder attention is where the model looked to write token i.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from transformers import GenerationMixin, PreTrainedTokenizerBase

from ..errors import MissingExtra, TranslationInputError
from ..token_budget import pack_token_budget
from .search import DECODING_MAX_TOKENS, MAX_LENGTH_OFFSET, check_sentences, translate

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Kind = Literal["cross", "encoder", "decoder"]


@dataclass
class AttentionMaps:
    """The attention weights of one translation, as float32 tensors on the CPU, [layers, heads, queries, keys]:

    - `cross_attentions`: [layers, heads, target, source], the encoder-decoder attention;
    - `encoder_attentions`: [layers, heads, source, source];
    - `decoder_attentions`: [layers, heads, target, target], the masked self-attention (zero above the diagonal).

    `source_tokens` end with </s>; `target_tokens` are the produced tokens (ending with </s> unless the output was cut
    at the maximum length), and `decoder_input_tokens` the tokens each decoder step read: the start token and the
    target tokens but the last, the keys of the decoder's self-attention.
    """

    source: str
    translation: str
    eos_token: str
    source_tokens: list[str]
    target_tokens: list[str]
    decoder_input_tokens: list[str]
    cross_attentions: torch.Tensor
    encoder_attentions: torch.Tensor
    decoder_attentions: torch.Tensor

    def weights(self, kind: Kind = "cross") -> torch.Tensor:
        """The [layers, heads, queries, keys] weights of one kind: "cross", "encoder" or "decoder"."""
        return {
            "cross": self.cross_attentions,
            "encoder": self.encoder_attentions,
            "decoder": self.decoder_attentions,
        }[kind]

    def axes(self, kind: Kind = "cross") -> tuple[list[str], list[str]]:
        """The tokens of the query rows and the key columns of `weights(kind)`."""
        return {
            "cross": (self.target_tokens, self.source_tokens),
            "encoder": (self.source_tokens, self.source_tokens),
            "decoder": (self.target_tokens, self.decoder_input_tokens),
        }[kind]


@torch.inference_mode()
def attention_maps(
    model: GenerationMixin,
    tokenizer: PreTrainedTokenizerBase,
    sentences: list[str],
    output_ids: list[list[int]] | None = None,
    *,
    num_beams: int | None = None,
    length_penalty: float | None = None,
    max_tokens: int = DECODING_MAX_TOKENS,
    max_length_offset: int = MAX_LENGTH_OFFSET,
) -> list[AttentionMaps]:
    """The attention weights of the translation of each sentence, every layer and head. The translations are those of
    `translate()` with the same settings, or `output_ids` (token ids from the decoder start token on, as
    `translate(num_return_sequences=...)` returns them); the weights are those of one teacher-forced forward pass
    over them, which equal the ones each step of decoding computed. Sentences are run together in padded batches of
    at most `max_tokens` tokens; padding gets no weight and is cut from the maps. Sources longer than the model's
    positions are cut to them, as `translate()` cuts them (with its warning)."""
    check_sentences(sentences)
    if any(not sentence.strip() for sentence in sentences):
        raise TranslationInputError("an empty sentence has no translation and so no attention: pass text")
    if output_ids is None:
        hypotheses = translate(
            model,
            tokenizer,
            sentences,
            num_beams=num_beams,
            length_penalty=length_penalty,
            max_tokens=max_tokens,
            max_length_offset=max_length_offset,
            num_return_sequences=1,
        )
        output_ids = [best[0].token_ids for best in hypotheses]
    if len(output_ids) != len(sentences):
        raise TranslationInputError(f"{len(output_ids)} outputs for {len(sentences)} sentences: pass one per sentence")
    if any(len(ids) < 2 for ids in output_ids):
        raise TranslationInputError("each output needs the start token and at least one produced token")
    source_ids = tokenizer(sentences, truncation=True, max_length=model.config.max_position_embeddings)["input_ids"]
    maps: list[AttentionMaps | None] = [None] * len(sentences)
    costs = [max(len(source), len(output)) for source, output in zip(source_ids, output_ids, strict=True)]
    for batch in pack_token_budget(costs, max_tokens):
        weights = _forward([source_ids[i] for i in batch], [output_ids[i] for i in batch], model)
        for index, (cross, encoder, decoder) in zip(batch, weights, strict=True):
            source, decoder_input, produced = source_ids[index], output_ids[index][:-1], output_ids[index][1:]
            maps[index] = AttentionMaps(
                source=sentences[index],
                translation=tokenizer.decode(produced, skip_special_tokens=True).strip(),
                eos_token=tokenizer.eos_token,
                source_tokens=tokenizer.convert_ids_to_tokens(source),
                target_tokens=tokenizer.convert_ids_to_tokens(produced),
                decoder_input_tokens=tokenizer.convert_ids_to_tokens(decoder_input),
                cross_attentions=cross,
                encoder_attentions=encoder,
                decoder_attentions=decoder,
            )
    return maps


def _forward(
    sources: list[list[int]], outputs: list[list[int]], model: GenerationMixin
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """One padded teacher-forced forward pass; each row's (cross, encoder, decoder) weights cut to its lengths."""
    pad = model.config.pad_token_id
    source_lengths = [len(source) for source in sources]
    target_lengths = [len(output) - 1 for output in outputs]
    input_ids = torch.tensor([row + [pad] * (max(source_lengths) - len(row)) for row in sources])
    decoder_input_ids = torch.tensor([row[:-1] + [pad] * (max(target_lengths) + 1 - len(row)) for row in outputs])
    attention_mask = torch.arange(input_ids.shape[1]) < torch.tensor(source_lengths)[:, None]
    output = model(
        input_ids=input_ids.to(model.device),
        attention_mask=attention_mask.long().to(model.device),
        decoder_input_ids=decoder_input_ids.to(model.device),
        output_attentions=True,
        use_cache=False,
    )

    def stacked(weights: tuple[torch.Tensor, ...], row: int, queries: int, keys: int) -> torch.Tensor:
        return torch.stack([layer[row, :, :queries, :keys] for layer in weights]).float().cpu()

    return [
        (
            stacked(output.cross_attentions, row, target_length, source_length),
            stacked(output.encoder_attentions, row, source_length, source_length),
            stacked(output.decoder_attentions, row, target_length, target_length),
        )
        for row, (source_length, target_length) in enumerate(zip(source_lengths, target_lengths, strict=True))
    ]


def alignment(maps: AttentionMaps, layer: int = -1) -> list[tuple[int, int]]:
    """Hard alignment as (source index, target index) pairs, fairseq's `--print-alignment`: for each target token but
    </s>, the source token but </s> that the encoder-decoder attention of `layer` (the last by default, as fairseq),
    averaged over its heads, weights most. Indices count the tokens of `source_tokens` and `target_tokens`."""
    weights = maps.cross_attentions[layer].mean(dim=0)
    source_valid = torch.tensor([token != maps.eos_token for token in maps.source_tokens])
    if not source_valid.any():
        return []
    weights = weights.masked_fill(~source_valid, -1.0)
    return [
        (int(weights[target].argmax()), target)
        for target, token in enumerate(maps.target_tokens)
        if token != maps.eos_token
    ]


def format_alignment(pairs: list[tuple[int, int]]) -> str:
    """Pairs as fairseq and Marian write them: "0-0 1-2 2-1" (source-target)."""
    return " ".join(f"{source}-{target}" for source, target in pairs)


def figure_class() -> type[Figure]:
    """matplotlib's Figure, or a `MissingExtra` naming the extra that installs it."""
    try:
        from matplotlib.figure import Figure
    except ImportError as err:
        raise MissingExtra(
            "drawing attention maps needs matplotlib: pip install 'hf-transformer[plot]' (or pip install matplotlib)"
        ) from err
    return Figure


def _draw(axes, weights: torch.Tensor, rows: list[str], columns: list[str], title: str, labels: bool) -> None:
    axes.imshow(weights.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    axes.set_title(title, fontsize=9)
    if labels:
        axes.set_xticks(range(len(columns)), columns, rotation=90, fontsize=8)
        axes.set_yticks(range(len(rows)), rows, fontsize=8)
    else:
        axes.set_xticks([])
        axes.set_yticks([])


def plot_attention(maps: AttentionMaps, kind: Kind = "cross", layer: int = -1) -> Figure:
    """A heatmap of one layer's attention averaged over its heads, tokens on the axes: keys (for "cross", the
    source) across, queries (the target) down. Needs matplotlib (`pip install 'hf-transformer[plot]'`)."""
    figure_type = figure_class()
    rows, columns = maps.axes(kind)
    weights = maps.weights(kind)
    layers = weights.shape[0]
    title = f"{kind} attention, layer {range(layers)[layer]} of 0-{layers - 1}, mean of heads"  # as --layer counts
    figure = figure_type(figsize=(2 + 0.3 * len(columns), 1.5 + 0.3 * len(rows)), layout="constrained")
    axes = figure.add_subplot()
    _draw(axes, weights[layer].mean(dim=0), rows, columns, title, True)
    figure.colorbar(axes.images[0], ax=axes, shrink=0.8)
    return figure


def plot_attention_heads(maps: AttentionMaps, kind: Kind = "cross") -> Figure:
    """A grid of heatmaps, one per layer (rows) and head (columns), tokens on the axes of the first column's and the
    last row's. Needs matplotlib (`pip install 'hf-transformer[plot]'`)."""
    figure_type = figure_class()
    rows, columns = maps.axes(kind)
    weights = maps.weights(kind)
    layers, heads = weights.shape[:2]
    cell = 0.6 + 0.12 * max(len(rows), len(columns))
    figure = figure_type(figsize=(1 + heads * cell, 1 + layers * cell), layout="constrained")
    grid = figure.subplots(layers, heads, squeeze=False)
    for layer in range(layers):
        for head in range(heads):
            axes = grid[layer][head]
            _draw(axes, weights[layer, head], rows, columns, f"layer {layer}, head {head}", False)  # from 0, as --layer
            if head == 0:
                axes.set_yticks(range(len(rows)), rows, fontsize=6)
            if layer == layers - 1:
                axes.set_xticks(range(len(columns)), columns, rotation=90, fontsize=6)
    figure.suptitle(f"{kind} attention: {maps.source} -> {maps.translation}", fontsize=10)
    return figure

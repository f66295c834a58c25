"""A lexical shortlist: the target tokens each sentence may translate to, so that beam search scores a few hundred of
them at each step instead of the whole vocabulary (Marian's `--shortlist`, Junczys-Dowmunt et al. 2018 "Marian: Cost-
effective High-Quality Neural Machine Translation in C++").

The table is learnt from parallel text, as a word-alignment model's: IBM Model 1 (Brown et al. 1993), a few rounds of
expectation-maximization over the subword tokens of the pairs, gives t(target | source) for every pair of tokens that
occur together; each source token keeps its `per_source` most likely translations. A sentence's shortlist is then the
union of the translations of its tokens, its tokens themselves (names and numbers are copied), the `frequent` most
frequent target tokens of the data (function words, punctuation) and the end of sentence.

Beam search with a shortlist (`translate(..., shortlist=)`, `IncrementalDecoder`) projects each sentence's decoder
output onto its own list's rows of the output matrix and normalizes over them only, as Marian does: the scores are
those of the model restricted to the list, and a translation can only hold tokens of it. A list that holds the whole
vocabulary gives the full model's scores (tested).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain, islice
from pathlib import Path
from typing import NamedTuple

import torch
from huggingface_hub import hf_hub_download
from huggingface_hub.errors import EntryNotFoundError, HFValidationError, RepositoryNotFoundError
from safetensors.torch import load_file, save_file
from torch import nn

from ..errors import ConfigError

# The file a shortlist is saved as, in the model's folder.
SHORTLIST_FILE = "shortlist.safetensors"
# Token occurrences (source tokens x target tokens of a pair, summed) counted at once while learning the table: the
# data is read in chunks of about this many so that memory stays bounded on corpora of millions of pairs.
CHUNK_OCCURRENCES = 20_000_000
# Occurrences whose key indices and target positions are held between the rounds of EM (16 bytes each: 1.6 GB); the
# data beyond is read again at each round. (int64: as int32, half the memory, the rounds ran slower.)
HELD_OCCURRENCES = 100_000_000


class Shortlist:
    """Each source token's likeliest translations (`translations` [source vocabulary, per_source], -1 where a token
    has fewer) and the target tokens every sentence may use (`always`: the most frequent ones and the end of
    sentence)."""

    def __init__(self, translations: torch.Tensor, always: torch.Tensor) -> None:
        if translations.dim() != 2 or always.dim() != 1:
            raise ConfigError(
                f"a shortlist holds a [vocabulary, per_source] table and a list of tokens, not shapes "
                f"{list(translations.shape)} and {list(always.shape)}"
            )
        self.translations, self.always = translations.long(), always.long()

    @property
    def vocab_size(self) -> int:
        return self.translations.shape[0]

    def save_pretrained(self, folder: str | Path) -> Path:
        """Write the shortlist into a model's `folder` (as `SHORTLIST_FILE`) and return its path."""
        path = Path(folder) / SHORTLIST_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({"translations": self.translations.int(), "always": self.always.int()}, str(path))
        return path

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, missing_ok: bool = False) -> Shortlist | None:
        """The shortlist saved with a model (`hf-transformer shortlist` writes it): in its folder, or in the files of
        its Hub repository (downloaded to the Hub cache, as the weights are; from the cache when offline). A model
        without one is refused, naming the fix, or with `missing_ok` gives None."""
        path = shortlist_file(name_or_path)
        if path is None:
            if missing_ok:
                return None
            raise ConfigError(
                f"{name_or_path} has no {SHORTLIST_FILE}: build one from the model's training data with "
                f"`hf-transformer shortlist FOLDER --source FILE --target FILE` (a Hub repository: in the folder "
                "pushed to it)"
            )
        tensors = load_file(str(path))
        return cls(tensors["translations"], tensors["always"])

    def vocabulary_map(self, tokens: Sequence[str]) -> str:
        """The shortlist as CTranslate2's vocabulary map (`vmap.txt`, `translate_batch(use_vmap=True)`): a line per
        source token, the token, a tab and its listed targets (itself among them); first, the tokens always listed
        after an empty source. `tokens`: the vocabulary, token i at index i."""
        lines = ["\t" + " ".join(tokens[index] for index in self.always.tolist())]
        for source, translations in enumerate(self.translations.tolist()):
            listed = [source, *(target for target in translations if target >= 0)]
            lines.append(tokens[source] + "\t" + " ".join(tokens[index] for index in dict.fromkeys(listed)))
        return "\n".join(lines) + "\n"

    def batch_lists(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The shortlists of a batch of sources: `tokens`, the union of its sentences' lists (sorted), and `listed`
        [sentences, len(tokens)], whether each sentence's list holds each of them."""
        if int(input_ids.max()) >= self.vocab_size:
            raise ConfigError(
                f"the source holds token id {int(input_ids.max())}, beyond the shortlist's {self.vocab_size} tokens: "
                "this shortlist was built for another tokenizer"
            )
        # Built on the CPU, where the table is, and moved to the batch's device once.
        rows = zip(input_ids.cpu(), attention_mask.bool().cpu(), strict=True)
        lists = [self.listed(ids[mask]) for ids, mask in rows]
        tokens = torch.cat(lists).unique()  # sorted
        listed = torch.zeros(len(lists), len(tokens), dtype=torch.bool)
        for row, sentence_tokens in enumerate(lists):
            listed[row, torch.searchsorted(tokens, sentence_tokens)] = True
        return tokens.to(input_ids.device), listed.to(input_ids.device)

    def listed(self, source_ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """The target tokens of a source sentence's list (on the CPU), sorted: the translations of its tokens
        `source_ids`, the tokens themselves and the tokens always listed."""
        source_ids = torch.as_tensor(source_ids, dtype=torch.long).cpu()
        translations = self.translations[source_ids].flatten()
        return torch.cat([self.always, source_ids, translations[translations >= 0]]).unique()


def shortlist_file(name_or_path: str | Path) -> Path | None:
    """The shortlist file of a model folder or Hub repository `name_or_path`, or None where it has none (or, offline,
    none was downloaded before)."""
    folder = Path(name_or_path)
    if folder.is_dir():
        return folder / SHORTLIST_FILE if (folder / SHORTLIST_FILE).is_file() else None
    try:
        return Path(hf_hub_download(str(name_or_path), SHORTLIST_FILE))
    # EntryNotFoundError is also LocalEntryNotFoundError: offline and not in the cache. HFValidationError: a path that
    # is no folder, nor a repository id.
    except (EntryNotFoundError, RepositoryNotFoundError, HFValidationError):
        return None


class ListedGroup(NamedTuple):
    """Consecutive sentences of a batch and their shortlists, for beam search: `tokens`, the union of their lists
    (sorted), `projection`, the output projection onto them (`output_rows`), and `excluded` [sentences, 1, tokens], 0
    where a sentence's list holds the token and -inf where not, added to its logits."""

    tokens: torch.Tensor
    projection: nn.Module
    excluded: torch.Tensor


def listed_groups(
    shortlist: Shortlist,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    projection: nn.Module,
    sentences_per_group: int,
) -> list[ListedGroup]:
    """The sentences of a batch in groups of `sentences_per_group`, each projected onto the union of its own lists: a
    few sentences' union is a small part of the vocabulary, where a whole batch's would hold much of it."""
    lists = []
    for start in range(0, len(input_ids), sentences_per_group):
        group = slice(start, start + sentences_per_group)
        tokens, listed = shortlist.batch_lists(input_ids[group], attention_mask[group])
        excluded = torch.zeros(listed.shape, device=listed.device).masked_fill_(~listed, -torch.inf)
        lists.append((tokens, excluded[:, None, :]))
    projections = output_rows(projection, [tokens for tokens, _ in lists])
    return [ListedGroup(tokens, rows, excluded) for (tokens, excluded), rows in zip(lists, projections, strict=True)]


def output_rows(projection: nn.Module, token_lists: list[torch.Tensor]) -> list[nn.Module]:
    """For each of `token_lists`, the rows of an output `projection` onto the vocabulary (`lm_head`, without bias)
    that are those tokens, as a projection of their own: an `nn.Linear`, or for an int8 model (`quantize_int8`) an
    int8 one with the same weights and scales. The int8 weights are unpacked once for all the lists."""
    quantized = torch.ao.nn.quantized.dynamic.Linear
    if not isinstance(projection, quantized):
        return [_linear(projection.weight[tokens]) for tokens in token_lists]
    weight = projection.weight()  # int8, one scale per row
    values = weight.dequantize()
    scales, zero_points = weight.q_per_channel_scales(), weight.q_per_channel_zero_points()
    sliced = []
    for tokens in token_lists:
        rows = torch.quantize_per_channel(values[tokens], scales[tokens], zero_points[tokens], 0, torch.qint8)
        linear = quantized(projection.in_features, len(tokens), bias_=False, dtype=torch.qint8)
        linear.set_weight_bias(rows, None)
        sliced.append(linear)
    return sliced


def _linear(weight: torch.Tensor) -> nn.Linear:
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
    linear.weight = nn.Parameter(weight, requires_grad=False)
    return linear


def build_shortlist(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    vocab_size: int,
    *,
    per_source: int = 50,
    frequent: int = 100,
    always: Sequence[int] = (),
    iterations: int = 5,
) -> Shortlist:
    """The shortlist of `pairs` (source token ids, target token ids; no special tokens): each source token's
    `per_source` likeliest translations under IBM Model 1 trained for `iterations` rounds of EM on the pairs, the
    `frequent` most frequent target tokens and the tokens of `always` (the end of sentence)."""
    if per_source < 1 or frequent < 0 or iterations < 1:
        raise ConfigError(
            f"per_source={per_source}, frequent={frequent}, iterations={iterations}: a shortlist needs "
            "per_source >= 1, frequent >= 0 and iterations >= 1"
        )
    # `keys`: the pairs of tokens that occur together, each once (the support of t(target | source)), sorted; each
    # occurrence is counted under its key's index in them (`IndexedOccurrences`).
    keys, first_chunk = torch.empty(0, dtype=torch.long), None
    for number, (chunk_keys, target_positions) in enumerate(occurrence_chunks(pairs, vocab_size)):
        distinct, index = chunk_keys.unique(return_inverse=True)
        keys = torch.cat([keys, distinct]).unique()
        first_chunk = (index, target_positions) if number == 0 else None  # keys == distinct while there is one chunk
    if not len(keys):
        raise ConfigError("a shortlist is learnt from parallel text, and no pair with tokens on both sides was given")
    occurrences = IndexedOccurrences(pairs, vocab_size, keys, first_chunk)
    source_of = keys // vocab_size
    probabilities = torch.ones(len(keys), dtype=torch.float64)  # uniform over each source token's co-occurrences
    for _ in range(iterations):
        counts = torch.zeros(len(keys), dtype=torch.float64)
        for index, target_positions in occurrences:
            p = probabilities[index]
            # E-step: each target token is explained by the source tokens of its pair in proportion to t(t | s).
            totals = torch.zeros(int(target_positions.max()) + 1, dtype=torch.float64)
            totals.index_add_(0, target_positions, p)
            counts.index_add_(0, index, p / totals[target_positions])
        # M-step: t(t | s) = count(s, t) / count(s).
        per_source_total = torch.zeros(vocab_size, dtype=torch.float64).index_add_(0, source_of, counts)
        probabilities = counts / per_source_total[source_of]

    # Each source token's best `per_source`: sort by probability, then (stably) by source token.
    # Stable both times: equal probabilities keep the order of their keys, so the table is the same on any machine.
    order = probabilities.argsort(descending=True, stable=True)
    order = order[source_of[order].argsort(stable=True)]
    sources, targets = source_of[order], keys[order] % vocab_size
    first = torch.searchsorted(sources, sources, side="left")
    rank = torch.arange(len(sources)) - first
    kept = rank < per_source
    translations = torch.full((vocab_size, per_source), -1, dtype=torch.long)
    translations[sources[kept], rank[kept]] = targets[kept]

    # Checked against the vocabulary above, but for the targets of pairs without a source token.
    all_targets = torch.tensor(list(chain.from_iterable(target_ids for _, target_ids in pairs)), dtype=torch.long)
    if len(all_targets) and (int(all_targets.max()) >= vocab_size or int(all_targets.min()) < 0):
        raise ConfigError(f"a target holds a token id outside the vocabulary of {vocab_size} tokens")
    target_counts = torch.bincount(all_targets, minlength=vocab_size)
    most_frequent = target_counts.topk(min(frequent, vocab_size)).indices
    most_frequent = most_frequent[target_counts[most_frequent] > 0]
    return Shortlist(translations, torch.cat([torch.as_tensor(always, dtype=torch.long), most_frequent]).unique())


def key_indices(keys: torch.Tensor, chunk_keys: torch.Tensor) -> torch.Tensor:
    """The index of each of `chunk_keys` in the sorted `keys`: the chunk's distinct keys are searched for (sorted,
    each once) rather than every occurrence's."""
    distinct, inverse = chunk_keys.unique(return_inverse=True)
    return torch.searchsorted(keys, distinct)[inverse]


class IndexedOccurrences:
    """The co-occurrences of `pairs` chunk by chunk, as (the index of each one's key in `keys`, the target position it
    explains), for the rounds of EM. A chunk is indexed once and held (`first`: the first chunk's, where the data is
    one chunk), up to `HELD_OCCURRENCES` occurrences; the chunks beyond are read and indexed again at each pass, so
    that memory stays bounded on any corpus."""

    def __init__(
        self,
        pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
        vocab_size: int,
        keys: torch.Tensor,
        first: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        self.pairs, self.vocab_size, self.keys = pairs, vocab_size, keys
        self.held = [] if first is None else [first]
        self.held_size = sum(len(index) for index, _ in self.held)
        self.complete = first is not None

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        yield from self.held
        if self.complete:
            return
        holding = True  # while every chunk so far is held: the held ones stay the first chunks
        for chunk in islice(pair_chunks(self.pairs), len(self.held), None):
            chunk_keys, target_positions = co_occurrences(chunk, self.vocab_size)
            indexed = (key_indices(self.keys, chunk_keys), target_positions)
            holding = holding and self.held_size + len(chunk_keys) <= HELD_OCCURRENCES
            if holding:
                self.held.append(indexed)
                self.held_size += len(chunk_keys)
            yield indexed
        self.complete = holding


def occurrence_chunks(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]], vocab_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The co-occurrences of `pairs` in chunks of about `CHUNK_OCCURRENCES`: for each (source token, target token) of a
    pair, its key source * vocab_size + target, and which target position of the chunk it explains."""
    return (co_occurrences(chunk, vocab_size) for chunk in pair_chunks(pairs))


def pair_chunks(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
) -> Iterator[list[tuple[int, Sequence[int], Sequence[int]]]]:
    """The pairs with tokens on both sides, as (line, source ids, target ids), in chunks of about `CHUNK_OCCURRENCES`
    co-occurrences (source tokens x target tokens, summed)."""
    chunk, size = [], 0
    for line, (source_ids, target_ids) in enumerate(pairs, start=1):
        if not len(source_ids) or not len(target_ids):
            continue
        chunk.append((line, source_ids, target_ids))
        size += len(source_ids) * len(target_ids)
        if size >= CHUNK_OCCURRENCES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def co_occurrences(
    chunk: list[tuple[int, Sequence[int], Sequence[int]]], vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`occurrence_chunks`' keys and target positions of a chunk of (line, source ids, target ids), each pair's target
    by target, computed for the whole chunk at once rather than pair by pair in Python."""
    source_lengths = torch.tensor([len(source_ids) for _, source_ids, _ in chunk])
    target_lengths = torch.tensor([len(target_ids) for _, _, target_ids in chunk])
    sources = torch.tensor(list(chain.from_iterable(source_ids for _, source_ids, _ in chunk)), dtype=torch.long)
    targets = torch.tensor(list(chain.from_iterable(target_ids for _, _, target_ids in chunk)), dtype=torch.long)
    for tokens, lengths in ((sources, source_lengths), (targets, target_lengths)):
        outside = ((tokens < 0) | (tokens >= vocab_size)).nonzero()
        if len(outside):
            pair = int(torch.searchsorted(lengths.cumsum(0), outside[0], right=True))
            raise ConfigError(f"pair {chunk[pair][0]} holds a token id outside the vocabulary of {vocab_size} tokens")
    # Occurrence i of the chunk: pair `pair[i]`, its `offset[i]`-th (target, source) combination, target-major.
    sizes = source_lengths * target_lengths
    pair = torch.repeat_interleave(torch.arange(len(chunk)), sizes)
    offset = torch.arange(len(pair)) - (sizes.cumsum(0) - sizes)[pair]
    pair_sources = source_lengths[pair]
    target_positions = (target_lengths.cumsum(0) - target_lengths)[pair] + offset // pair_sources
    source_positions = (source_lengths.cumsum(0) - source_lengths)[pair] + offset % pair_sources
    return sources[source_positions] * vocab_size + targets[target_positions], target_positions


__all__ = [
    "SHORTLIST_FILE",
    "ListedGroup",
    "Shortlist",
    "build_shortlist",
    "listed_groups",
    "output_rows",
    "shortlist_file",
]

"""Batches of pairs of similar length under a token budget (the paper's batching, fairseq's `--max-tokens`).

Every rank builds the same plan for an epoch from `seed` and `epoch` and takes its own share, so DDP needs no
communication; a DataLoader that records its position lets Lightning resume in the middle of an epoch.
"""

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from hf_transformer.errors import DataError
from hf_transformer.model.integrity import check_token_ids
from hf_transformer.model.loss import IGNORE_INDEX
from hf_transformer.token_budget import token_budget_boundaries

# The pairs an epoch's plan sorts by length and packs at a time (`TokenBudgetBatchSampler._build_plan`).
SORT_WINDOW = 1_000_000


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Yields lists of dataset indices; a batch of n pairs costs n * (longest source or target) tokens.

    So the padded source and the padded target tensor of a batch each hold at most `max_tokens` tokens, and at most
    `max_sentences` pairs when given. An epoch's plan: shuffle (seeded by `seed` and the epoch), sort by length and
    pack greedily (`token_budget_boundaries`) each window of `SORT_WINDOW` pairs, shuffle the batches. Rank r of
    `world_size` takes batches r, r + world_size, ...; the plan is split until every rank gets the same number, so the
    ranks cover each pair exactly once and none waits for a batch that never comes. `shuffle=False`, for evaluation:
    the pairs in length order, packed, and the batches in an order fixed by `seed` (the same every epoch).
    """

    def __init__(
        self,
        source_lengths: Sequence[int] | np.ndarray,
        target_lengths: Sequence[int] | np.ndarray,
        max_tokens: int,
        max_sentences: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        # Integer arrays as given (the data module's are int16 where they fit): 4-8 bytes a pair for both sides, and
        # the plan's order 4 more (a plan of Python lists took ~100).
        self.source_lengths, self.target_lengths = _integers(source_lengths), _integers(target_lengths)
        if self.source_lengths.shape != self.target_lengths.shape:
            raise ValueError("source_lengths and target_lengths must have one entry per pair")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        longest = max(int(self.source_lengths.max(initial=0)), int(self.target_lengths.max(initial=0)))
        if longest > max_tokens:
            raise DataError(
                f"a pair of {longest} tokens does not fit in a batch of max_tokens={max_tokens}: raise max_tokens "
                "or lower max_source_positions/max_target_positions"
            )
        self.max_tokens, self.max_sentences = max_tokens, max_sentences
        self.shuffle, self.seed, self.rank, self.world_size = shuffle, seed, rank, world_size
        self.epoch = 0
        self._start = 0
        self._cached_plan: tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None

    @property
    def sampler(self) -> "TokenBudgetBatchSampler":
        """Lightning calls `set_epoch` on `dataloader.batch_sampler.sampler`, so this object is its own sampler."""
        return self

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def plan(self, epoch: int | None = None) -> list[list[int]]:
        """The batches of all ranks for `epoch` (default: the current one) as lists, rank r's being
        `plan[r::world_size]`: for looking at a plan; iterating the sampler reads its arrays (`plan_arrays`)."""
        order, starts, ends = self.plan_arrays(epoch)
        return [order[start:end].tolist() for start, end in zip(starts, ends, strict=True)]

    def plan_arrays(self, epoch: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """An epoch's plan as arrays: the pairs in packed order, and where each batch starts and ends in it, in the
        order the batches are trained (batch k is `order[starts[k]:ends[k]]`)."""
        epoch = self.epoch if epoch is None else epoch
        if self._cached_plan is None or self._cached_plan[0] != epoch:
            self._cached_plan = (epoch, self._build_plan(epoch))
        return self._cached_plan[1]

    def resume_at(self, batch: int) -> None:
        """Start iterations at this rank's batch number `batch` of the epoch (0: from the beginning)."""
        self._start = batch

    def __iter__(self) -> Iterator[list[int]]:
        order, starts, ends = self.plan_arrays()
        # The batches to yield are chosen now, not at the first `next`: `resume_at` applies to this iteration only.
        batches = range(self.rank + self._start * self.world_size, len(starts), self.world_size)
        return (order[starts[batch] : ends[batch]].tolist() for batch in batches)

    def __len__(self) -> int:
        return len(self.plan_arrays()[1]) // self.world_size

    def _build_plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # Sorted and packed a window of SORT_WINDOW shuffled pairs at a time (OpenNMT's pools): a window of a million
        # pairs holds thousands of pairs of every length, so its batches are as tight as a global sort's, and memory
        # beyond the plan's int32 order does not grow with the corpus.
        rng = np.random.default_rng([self.seed, epoch])
        count = len(self.source_lengths)
        order = np.arange(count, dtype=np.int32 if count < 2**31 else np.int64)
        if self.shuffle:
            rng.shuffle(order)  # the same permutation as rng.permutation(count), without its int64 copy
        boundaries = [np.zeros(1, dtype=np.int64)]
        for start in range(0, count, SORT_WINDOW):
            window = order[start : start + SORT_WINDOW]  # a view: sorted in place
            window[:] = window[length_order(self.source_lengths[window], self.target_lengths[window])]
            costs = np.maximum(self.source_lengths[window], self.target_lengths[window])
            boundaries.append(start + token_budget_boundaries(costs, self.max_tokens, self.max_sentences)[1:])
        bounds = np.concatenate(boundaries)
        starts, ends = bounds[:-1], bounds[1:]
        if not self.shuffle:
            # Packed in length order, the batches would come shortest first, and a fractional
            # trainer.limit_val_batches, which keeps the first batches, would evaluate the shortest sentences only. A
            # permutation seeded by `seed` alone gives the same batches in the same order every validation, of all
            # lengths from the first: a limited validation is a sample of the split. Split before it is permuted, so
            # that the batches themselves are the length-ordered packing's.
            starts, ends = _split_until_divisible(starts, ends, self.world_size)
            spread = np.random.default_rng(self.seed).permutation(len(starts))
            return order, starts[spread], ends[spread]
        shuffled = rng.permutation(len(starts))
        return order, *_split_until_divisible(starts[shuffled], ends[shuffled], self.world_size)


@dataclass(frozen=True)
class TrainingPairFilter:
    """Which training pairs are trained on, read from files ahead (`TranslationDataModule`) or from a stream
    (`TokenBudgetStream`): those with text on both sides and at most the model's positions of tokens on each. An empty
    side teaches nothing (an empty source maps nothing to a sentence); a longer pair would have to be cut, losing the
    end of its sentence or its `</s>`. Evaluation keeps every pair and cuts the long ones (`TranslationCollator`)."""

    max_source_positions: int
    max_target_positions: int

    @staticmethod
    def is_empty(source_text: str, target_text: str) -> bool:
        """Whether a pair has no text on a side (whitespace only counts as none)."""
        return not source_text.strip() or not target_text.strip()

    def too_long(self, source_lengths: np.ndarray, target_lengths: np.ndarray) -> np.ndarray:
        """Whether each pair (its token counts, `</s>` included) has more tokens on a side than the positions."""
        return (source_lengths > self.max_source_positions) | (target_lengths > self.max_target_positions)

    def nothing_kept(self, where: str, pairs: int, empty: int, too_long: int) -> DataError:
        """The error for training data of which no pair is kept: `pairs` read, `empty` of them with an empty side and
        `too_long` others longer than the positions."""
        return DataError(
            f"{where}: all {pairs} training pairs were dropped ({empty} with an empty side, {too_long} longer than "
            f"max_source_positions={self.max_source_positions}/max_target_positions={self.max_target_positions} "
            "tokens); raise the limits or check the languages"
        )


def length_order(source_lengths: np.ndarray, target_lengths: np.ndarray) -> np.ndarray:
    """The positions of pairs in the order they are packed into batches, for data read ahead and streamed alike: by
    source length, then target length (a stable sort: pairs of equal lengths keep their order, a shuffle's).

    The target order alternates, ascending within even source lengths and descending within odd ones, so a batch that
    crosses from one source length to the next still holds targets of similar length. One key of both lengths, sorted
    once, holds no more than a few bytes a pair: source * 2 * span + target, in int32 where its largest value fits.
    """
    span = int(np.max(target_lengths, initial=0)) + 1
    largest_key = (int(np.max(source_lengths, initial=0)) + 1) * 2 * span
    key = np.array(source_lengths, dtype=np.int32 if largest_key < 2**31 else np.int64)
    odd = key % 2 == 1
    key *= 2 * span
    np.add(key, target_lengths, out=key, casting="unsafe")
    # Where the source length is odd: span - 1 - target, in place (no copy of the targets).
    for _ in range(2):
        np.subtract(key, target_lengths, out=key, where=odd, casting="unsafe")
    np.add(key, span - 1, out=key, where=odd, casting="unsafe")
    del odd
    return np.argsort(key, kind="stable")


def _integers(values: Sequence[int] | np.ndarray) -> np.ndarray:
    array = np.asarray(values)
    return array if array.dtype.kind in "iu" else array.astype(np.int32)


def _split_until_divisible(starts: np.ndarray, ends: np.ndarray, world_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Halve the largest batches (`starts[k]:ends[k]`) until their count divides by `world_size`, the halves taking
    the batch's place.

    Ranks with fewer batches would leave the others waiting in an all-reduce forever; repeating batches to even out
    the counts (what DistributedSampler does) would count some pairs twice, which evaluation must not.
    """
    while len(starts) % world_size:
        largest = int(np.argmax(ends - starts))
        size = int(ends[largest] - starts[largest])
        if size < 2:
            raise DataError(
                f"cannot give {world_size} ranks the same number of batches: {len(starts)} batches of one pair "
                "each; use fewer devices or more data"
            )
        middle = starts[largest] + size // 2
        starts, ends = np.insert(starts, largest + 1, middle), np.insert(ends, largest, middle)
    return starts, ends


def padding_efficiency(
    batches: Iterable[Sequence[int]],
    source_lengths: Sequence[int] | np.ndarray,
    target_lengths: Sequence[int] | np.ndarray,
) -> float:
    """Real tokens / tokens after padding both sides of each batch to its longest sequence (1.0: no padding)."""
    source, target = np.asarray(source_lengths), np.asarray(target_lengths)
    real = padded = 0
    for batch in batches:
        indices = np.asarray(batch)
        real += int(source[indices].sum() + target[indices].sum())
        padded += len(indices) * int(source[indices].max() + target[indices].max())
    return real / padded


class ResumableDataLoader(DataLoader):
    """A DataLoader over a `TokenBudgetBatchSampler` whose position in the epoch is saved in checkpoints.

    Lightning saves `state_dict()` of a training DataLoader that has one and calls `load_state_dict()` before
    iterating again, so a run resumed from a mid-epoch checkpoint continues with the next unseen batch. Batches are
    counted as they reach the training loop, not as the sampler hands them to workers (which prefetch ahead).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Creating an iterator draws the workers' base seed from the loader's generator, by default the global RNG:
        # a new epoch's iterator, made after the checkpoint at the previous epoch's end, would shift the dropout
        # masks of the run that never stopped against the resumed one. An own generator, seeded per epoch in
        # `__iter__`, keeps the global RNG to the model and gives the workers the same seeds after a resume.
        super().__init__(*args, generator=torch.Generator(), **kwargs)
        self._epoch = 0
        self._batches_done = 0
        self._resume_pending = False

    def __iter__(self) -> Iterator[Any]:
        sampler = self.batch_sampler
        # After load_state_dict, continue in the saved epoch; a new epoch (set_epoch) or a plain iteration starts at 0.
        resume = self._resume_pending and self._epoch == sampler.epoch
        self._resume_pending = False
        self._epoch, self._batches_done = sampler.epoch, self._batches_done if resume else 0
        sampler.resume_at(self._batches_done)
        self.generator.manual_seed(int(np.random.SeedSequence([sampler.seed, sampler.epoch]).generate_state(1)[0]))
        # Creating the iterator draws from the sampler (twice with workers); later iterations start from 0 again.
        batches = super().__iter__()
        sampler.resume_at(0)
        for batch in batches:
            self._batches_done += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self._epoch, "batches_done": self._batches_done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._epoch, self._batches_done = state["epoch"], state["batches_done"]
        self.batch_sampler.set_epoch(self._epoch)
        self._resume_pending = True


@dataclass(frozen=True)
class TranslationCollator:
    """Pads a list of tokenized rows into the batch dict the model takes.

    `input_ids`/`attention_mask` [B, S] and `labels` [B, T] (-100 at padding), right-padded to the longest row;
    sequences longer than the position limits are cut, keeping their final `</s>`. Evaluation rows (those with an
    `index`) pass on `source_text`, `target_text` and `index` (strings as lists, indices as a tensor).
    With `vocab_size`, ids outside [0, vocab_size) are
    refused here, on the CPU, where the check costs no wait for a device (the training step does not check them).
    """

    pad_token_id: int
    max_source_positions: int
    max_target_positions: int
    vocab_size: int | None = None

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        sources, targets = [row["input_ids"] for row in rows], [row["labels"] for row in rows]
        sources = [_truncate(ids, self.max_source_positions) for ids in sources]
        targets = [_truncate(ids, self.max_target_positions) for ids in targets]
        input_ids = _pad(sources, self.pad_token_id)
        lengths = torch.tensor([len(ids) for ids in sources])
        batch = {
            "input_ids": input_ids,
            "attention_mask": (torch.arange(input_ids.shape[1]) < lengths[:, None]).long(),
            "labels": _pad(targets, IGNORE_INDEX),
        }
        if self.vocab_size is not None:
            check_token_ids(input_ids, self.vocab_size)
            check_token_ids(batch["labels"], self.vocab_size, ignore_index=IGNORE_INDEX, name="labels")
        if "index" in rows[0]:
            batch["source_text"] = [row["source_text"] for row in rows]
            batch["target_text"] = [row["target_text"] for row in rows]
            batch["index"] = torch.tensor([row["index"] for row in rows])
        return batch


def _truncate(ids: list[int], limit: int) -> list[int]:
    return ids if len(ids) <= limit else ids[: limit - 1] + ids[-1:]


def _pad(sequences: list[list[int]], value: int) -> torch.Tensor:
    padded = torch.full((len(sequences), max(len(ids) for ids in sequences)), value, dtype=torch.long)
    for row, ids in zip(padded, sequences, strict=True):
        row[: len(ids)] = torch.tensor(ids, dtype=torch.long)
    return padded

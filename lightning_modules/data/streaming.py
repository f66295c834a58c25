"""Training batches from a stream of pairs, for corpora too large to tokenize ahead or to hold on disk
(`data.streaming: true`): a `datasets.IterableDataset` read as it goes, shuffled by shard order and a buffer, split
between the ranks, tokenized and cut into token-budget batches a buffer at a time.

The stream has no end: when a rank's share is exhausted it starts the next pass (epoch), shuffled anew, so that every
rank always has a next batch and training is bounded by `trainer.max_steps` (a rank with fewer pairs never leaves the
others waiting in an all-reduce). A loader's position is the pass and the batches it has given in it; a resumed run
reads that pass again up to its position (without training on it), so it continues exactly where it stopped, at the
cost of reading and tokenizing the pass so far once more.
"""

from collections.abc import Callable, Iterator
from itertools import islice, zip_longest
from pathlib import Path
from typing import Any

import numpy as np
from datasets import IterableDataset, load_dataset
from datasets.distributed import split_dataset_by_node
from torch.utils.data import DataLoader

from hf_transformer.errors import DataError
from hf_transformer.token_budget import token_budget_boundaries

from ..checkpoint import every_rank, this_ranks
from .batching import TrainingPairFilter, length_order
from .sources import (
    TABLE_FORMATS,
    check_data_file,
    check_single_file_split,
    has_top_level_files,
    named_read_errors,
    split_files,
    text_lines,
)


def stream_split(dataset: str, config: str | None, split: str, source_lang: str, target_lang: str) -> IterableDataset:
    """The pairs of one split of `dataset`, read as a stream: rows of `source_text` and `target_text`. `dataset` is
    a Hub dataset id (or a folder in a layout `datasets` reads), a folder of `{split}.{lang}[.gz]` text files or of
    `{split}.<table format>` files, one such file, or a path with a `{split}` placeholder: the sources `load_split`
    reads ahead, found, checked (`check_data_file`) and read by the same rules, their failures named alike."""
    path = Path(dataset)
    if "{split}" in dataset:
        files: tuple[Path, ...] = (Path(dataset.replace("{split}", split)),)
    elif path.is_file():
        check_single_file_split(path, split)
        files = (path,)
    elif path.is_dir() and has_top_level_files(path):
        files = split_files(path, split, source_lang, target_lang)
    else:
        try:
            stream = load_dataset(dataset, config, split=split, streaming=True)
        except Exception as error:  # datasets raises many types here; each means the same to the user
            raise DataError(f"could not stream split {split!r} of dataset {dataset!r}: {error}") from error
        return _pairs_of(stream, source_lang, target_lang)
    kind = files[0].name.removesuffix(".gz").rsplit(".", 1)[-1]
    if len(files) == 1 and kind not in TABLE_FORMATS:
        raise DataError(f"{files[0]}: unknown data file type {kind!r}; use one of {', '.join(TABLE_FORMATS)} (or .gz)")
    for file in files:
        check_data_file(file)
    if len(files) == 1:
        stream = IterableDataset.from_generator(_table_rows, gen_kwargs={"paths": [str(files[0])]})
        return _pairs_of(stream, source_lang, target_lang)
    stream = IterableDataset.from_generator(_line_pairs, gen_kwargs={"files": [tuple(map(str, files))]})
    return stream.rename_columns({"source": "source_text", "target": "target_text"})


def _pairs_of(stream: IterableDataset, source_lang: str, target_lang: str) -> IterableDataset:
    return stream.map(_pair_of, fn_kwargs={"source_lang": source_lang, "target_lang": target_lang}).select_columns(
        ["source_text", "target_text"]
    )


def _table_rows(paths: list[str]) -> Iterator[dict[str, Any]]:
    """The rows of local table files (one shard each), read by `datasets`' reader of their type, their failures named
    as a read ahead names them (`named_read_errors`)."""
    for path in map(Path, paths):
        builder, options = TABLE_FORMATS[path.name.removesuffix(".gz").rsplit(".", 1)[-1]]
        with named_read_errors(path, builder):
            yield from load_dataset(builder, data_files=str(path), split="train", streaming=True, **options)


def _line_pairs(files: list[tuple[str, str]]) -> Iterator[dict[str, str]]:
    """The line-aligned pairs of (source file, target file) shards, gzipped or not, split into lines as the prepared
    path splits them (`text_lines`)."""
    for source_path, target_path in files:
        sources, targets = text_lines(Path(source_path)), text_lines(Path(target_path))
        for number, (source, target) in enumerate(zip_longest(sources, targets), start=1):
            if source is None or target is None:
                shorter, longer = (source_path, target_path) if source is None else (target_path, source_path)
                raise DataError(
                    f"{shorter} has {number - 1} lines but {longer} has more: the files of a split must be "
                    "line-aligned (line i of one translates line i of the other); fix or re-export the shorter file"
                )
            yield {"source": source, "target": target}


def _pair_of(row: dict[str, Any], source_lang: str, target_lang: str) -> dict[str, str]:
    """A row's two languages, from a `translation` dict or from a column per language."""
    languages = row["translation"] if isinstance(row.get("translation"), dict) else row
    missing = [lang for lang in (source_lang, target_lang) if languages.get(lang) is None]
    if missing:
        raise DataError(
            f"a streamed row has no text for {', '.join(map(repr, missing))}; its fields are {', '.join(languages)}. "
            "Choose data.source_lang and data.target_lang among them"
        )
    return {"source_text": str(languages[source_lang]), "target_text": str(languages[target_lang])}


class TokenBudgetStream:
    """Endless token-budget batches of a rank's share of a stream of pairs.

    Each pass (epoch) over the stream: the shards in a seeded order and a shuffle buffer of `shuffle_buffer` pairs
    (`datasets`' `shuffle` with the pass as its epoch), this rank's share (`split_dataset_by_node`: whole shards
    where they divide by the ranks, else every `world_size`-th pair), then `sort_buffer` pairs at a time: encoded,
    those with an empty side or longer than the positions dropped and the rest sorted by length as the prepared path
    drops and sorts them (`TrainingPairFilter`, `length_order`), packed under `max_tokens` (`token_budget_boundaries`)
    and given in a seeded random order. Yields lists of rows (`input_ids`, `labels`) for the collator. A pass that
    gives no batch (no pair, or none kept) stops with a `DataError` saying so about `name` (the split): the next
    would give none either, and the training loop would wait for a batch forever.
    """

    def __init__(
        self,
        pairs: IterableDataset,
        encode: Callable[[list[str]], list[list[int]]],
        max_tokens: int,
        max_source_positions: int,
        max_target_positions: int,
        *,
        max_sentences: int | None = None,
        shuffle_buffer: int = 10_000,
        sort_buffer: int = 100_000,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        name: str = "the stream",
    ) -> None:
        if shuffle_buffer < 1 or sort_buffer < 1:
            raise ValueError(f"shuffle_buffer ({shuffle_buffer}) and sort_buffer ({sort_buffer}) must be at least 1")
        self.pairs, self.encode, self.name = pairs, encode, name
        self.max_tokens, self.max_sentences = max_tokens, max_sentences
        self.pair_filter = TrainingPairFilter(max_source_positions, max_target_positions)
        self.shuffle_buffer, self.sort_buffer = shuffle_buffer, sort_buffer
        self.seed, self.rank, self.world_size = seed, rank, world_size

    def passes(self, epoch: int) -> Iterator[tuple[int, Iterator[list[dict[str, Any]]]]]:
        """(epoch, its batches) for this pass and every later one."""
        while True:
            yield epoch, self._batches(epoch)
            epoch += 1

    def _batches(self, epoch: int) -> Iterator[list[dict[str, Any]]]:
        stream = self.pairs.shuffle(seed=self.seed, buffer_size=self.shuffle_buffer)
        stream.set_epoch(epoch)
        stream = split_dataset_by_node(stream, rank=self.rank, world_size=self.world_size)
        rows, counts, given = iter(stream), {"pairs": 0, "empty": 0, "too_long": 0}, 0
        for chunk_index in range(2**62):
            chunk = list(islice(rows, self.sort_buffer))
            if not chunk:
                break
            for batch in self._pack(chunk, np.random.default_rng([self.seed, epoch, self.rank, chunk_index]), counts):
                given += 1
                yield batch
        if not given:
            raise self._nothing_to_train(counts)

    def _nothing_to_train(self, counts: dict[str, int]) -> DataError:
        where = self.name + (f", the share of rank {self.rank} of {self.world_size}" if self.world_size > 1 else "")
        if counts["pairs"]:
            return self.pair_filter.nothing_kept(
                f"{where}, streamed", counts["pairs"], counts["empty"], counts["too_long"]
            )
        more = "; use fewer devices, or a split of more pairs" if self.world_size > 1 else ""
        return DataError(f"{where}: a whole pass of the stream read no pair to train on{more}")

    def _pack(
        self, chunk: list[dict[str, str]], rng: np.random.Generator, counts: dict[str, int]
    ) -> Iterator[list[dict[str, Any]]]:
        """The batches of a chunk of rows, in a random order; `counts` adds the pairs read and dropped."""
        sources = self.encode([row["source_text"] for row in chunk])
        targets = self.encode([row["target_text"] for row in chunk])
        empty = np.array([self.pair_filter.is_empty(row["source_text"], row["target_text"]) for row in chunk])
        source_lengths = np.array([len(ids) for ids in sources])
        target_lengths = np.array([len(ids) for ids in targets])
        too_long = self.pair_filter.too_long(source_lengths, target_lengths) & ~empty
        counts["pairs"] += len(chunk)
        counts["empty"] += int(empty.sum())
        counts["too_long"] += int(too_long.sum())
        kept = np.flatnonzero(~(empty | too_long))
        if not len(kept):
            return
        order = kept[length_order(source_lengths[kept], target_lengths[kept])]
        costs = np.maximum(source_lengths, target_lengths)[order]
        boundaries = token_budget_boundaries(costs, self.max_tokens, self.max_sentences)
        for batch in rng.permutation(len(boundaries) - 1):
            yield [
                {"input_ids": sources[index], "labels": targets[index]}
                for index in order[boundaries[batch] : boundaries[batch + 1]]
            ]

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        for _, batches in self.passes(0):
            yield from batches


class StreamLoader(DataLoader):
    """A DataLoader over a `TokenBudgetStream` whose position (the pass and the batches given in it) is saved in
    checkpoints: Lightning saves `state_dict()` of a training DataLoader that has one and calls `load_state_dict()`
    before iterating again. A resumed loader reads its pass again up to that position, giving none of those batches,
    and continues with the next.

    Its length is `batches`, the batches the whole run trains on (trainer.max_steps times the batches accumulated per
    step): to Lightning the run is one epoch. A length also keeps Lightning from fetching a batch ahead (it does so
    for loaders without one), which the position saved with a checkpoint would then count as trained."""

    def __init__(self, stream: TokenBudgetStream, collate_fn: Callable, batches: int) -> None:
        super().__init__(stream, batch_size=None, collate_fn=collate_fn)
        self.stream, self.batches = stream, batches
        self._epoch = self._batches_done = 0

    def __iter__(self) -> Iterator[Any]:
        skip = self._batches_done  # of the saved pass, where a resumed loader goes on
        for epoch, batches in self.stream.passes(self._epoch):
            self._epoch, self._batches_done = epoch, skip
            for batch in islice(batches, skip, None):
                self._batches_done += 1
                yield self.collate_fn(batch)
            skip = 0

    def __len__(self) -> int:
        return self.batches

    def state_dict(self) -> dict[str, Any]:
        # Each rank's: their shares of the stream differ, so they reach the end of a pass at different batches.
        return every_rank({"epoch": self._epoch, "batches_done": self._batches_done})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        position = this_ranks(state)
        self._epoch, self._batches_done = position["epoch"], position["batches_done"]

"""`TranslationDataModule`: parallel text from any source -> tokenized, filtered, token-budget batches."""

import functools
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import datasets
import lightning.pytorch as pl
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
import torch.distributed as dist
from datasets import Dataset, Features, IterableDataset, List, Value
from filelock import FileLock
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerFast

from hf_transformer.decoding.search import DECODING_MAX_TOKENS
from hf_transformer.errors import DataError, why_unwritable

from .batching import ResumableDataLoader, TokenBudgetBatchSampler, TrainingPairFilter, TranslationCollator
from .sources import ROWS_PER_CACHE_BATCH, check_source, load_split, rebuilt_if_damaged, to_pairs, writing_cache_of
from .streaming import StreamLoader, TokenBudgetStream, stream_split
from .synthetic import SOURCE_LANG, TARGET_LANG, synthetic_splits
from .tokenization import (
    SPECIAL_TOKENS,
    backend_tokenizer,
    check_trained_on,
    encode_ids,
    has_saved_tokenizer,
    load_tokenizer,
    save_tokenizer,
    train_bpe_tokenizer,
)

# Below this many rows per process, starting tokenizer processes costs more than it saves.
_ROWS_PER_TOKENIZER_PROCESS = 50_000
# The pairs whose masks the length filter builds at once (a byte a pair each).
_ROWS_PER_FILTER_BLOCK = 1_000_000
# Above this share of `<unk>` among the training tokens, the tokenizer does not fit the data: training stops. Above
# the lower one, it warns. A BPE vocabulary trained on the same data has next to none.
_UNKNOWN_RATE_ERROR, _UNKNOWN_RATE_WARNING = 0.05, 0.005
_ROLES_OF_STAGE = {"fit": ("train", "validation"), "validate": ("validation",), "test": ("test",), "predict": ("test",)}
# The columns of a tokenized split, in the smallest types that hold them (on disk and when read back as arrays).
_ENCODED_FEATURES = Features(
    {
        "source_text": Value("string"),
        "target_text": Value("string"),
        "input_ids": List(Value("int32")),
        "labels": List(Value("int32")),
        "source_length": Value("int32"),
        "target_length": Value("int32"),
        "unknown_tokens": Value("int32"),
        "empty": Value("bool"),
    }
)
_ENCODED_IDS_FEATURES = Features({name: kind for name, kind in _ENCODED_FEATURES.items() if not name.endswith("_text")})
# The data settings that a number must satisfy, checked before any work (`check_data_settings`): what a setting that
# fails would otherwise do (a stream of no batches waits forever; a DataLoader or a sampler fails after the data is
# read and tokenized).
_SETTING_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "bpe_vocab_size": (lambda value: value > len(SPECIAL_TOKENS), "must be larger than the 4 special tokens"),
    "bpe_min_frequency": (lambda value: value >= 0, "must be at least 0"),
    "bpe_sample_size": (lambda value: value is None or value >= 1, "must be at least 1, or null for every pair"),
    "stream_buffer": (lambda value: value >= 1, "must be at least 1: the pairs a stream shuffles and sorts at a time"),
    "max_sentences": (lambda value: value is None or value >= 1, "must be at least 1, or null for no limit"),
    "max_source_positions": (lambda value: value >= 1, "must be at least 1"),
    "max_target_positions": (lambda value: value >= 1, "must be at least 1"),
    "num_workers": (lambda value: value >= 0, "must be at least 0 (0: load in the main process)"),
    "synthetic_train_size": (lambda value: value >= 1, "must be at least 1"),
    "synthetic_eval_size": (lambda value: value >= 1, "must be at least 1"),
}
# The Trainer setting that limits the batches of each role's loader.
_LIMIT_OF_ROLE = {"train": "limit_train_batches", "validation": "limit_val_batches", "test": "limit_test_batches"}


class TranslationDataModule(pl.LightningDataModule):
    """Batches of translation pairs for the encoder-decoder Transformer.

    `dataset` is "synthetic" (numbers in digits -> English words, languages `digits` and `words`), a folder of
    `{split}.{lang}[.gz]` text files (Multi30k) or of `{split}.{jsonl,json,tsv,csv,parquet}` files, one such file (a
    `{split}` placeholder in the path selects the split), or a Hub dataset id with `dataset_config`.

    The tokenizer is ready after `__init__` (LightningCLI links it into the training module, whose model takes its
    vocabulary and special ids from it): `tokenizer` loads an existing one; otherwise a joint BPE vocabulary is
    trained on the training split, or loaded from `tokenizer_dir` if that already holds one, and saved there (or in
    the trainer's log dir).

    Training pairs with an empty side or longer than `max_source_positions`/`max_target_positions` tokens are
    dropped, streamed or not (`TrainingPairFilter`); evaluation pairs are all kept, longer ones cut to the limits.
    `filter_stats` counts both per split.
    Batches: `input_ids`, `attention_mask` [B, S]; `labels` [B, T] (-100 at padding); evaluation batches also
    `source_text`, `target_text` and `index` (the pair's position in its split). Train with
    `Trainer(use_distributed_sampler=False)`: the batch sampler shards.

    Args:
        dataset: "synthetic", a folder of {split}.{lang}[.gz] or {split}.{jsonl,json,tsv,csv,parquet} files, one data
            file (a {split} placeholder selects the split), or a Hub dataset id.
        dataset_config: the Hub dataset's configuration (e.g. "de-en" for wmt14).
        source_lang: the language translated from (a file suffix, a column or a `translation` key).
        target_lang: the language translated into.
        train_split: the name of the training split.
        validation_split: the name of the validation split.
        test_split: the name of the test split.
        tokenizer: an existing tokenizer (folder or Hub id) instead of training a BPE vocabulary.
        bpe_vocab_size: the size of the joint BPE vocabulary trained on the training split (37000 in the paper).
        bpe_min_frequency: how often a pair must occur to be merged.
        bpe_sample_size: the BPE vocabulary learns from this many training pairs, drawn at random (seeded by `seed`)
            from a larger split, so that a corpus of millions of pairs trains its tokenizer in minutes; null: all
            pairs.
        streaming: read the training split as a stream (`datasets` streaming: a Hub dataset or local files), for
            corpora too large to tokenize ahead or to hold on disk: shuffled by shard order and a buffer, split between
            the ranks, tokenized and batched `stream_buffer` pairs at a time (`streaming.py`); training is then bounded
            by trainer.max_steps. Validation and test are prepared as without it.
        stream_buffer: the pairs a stream shuffles among, and sorts by length to pack batches from.
        tokenizer_dir: where the trained tokenizer is saved and reused on later runs of the same data.
        max_tokens: the token budget of a training batch: rows x longest sequence, per device (the paper: about 25000
            source and 25000 target tokens per step over 8 GPUs).
        max_sentences: at most this many pairs per training batch (None: no limit).
        eval_max_tokens: the token budget of validation and test batches.
        max_source_positions: training pairs with a longer source are dropped, evaluation pairs cut (linked to
            model.max_position_embeddings by the CLI).
        max_target_positions: the same for the target side.
        num_workers: data loader worker processes (and tokenizer processes for large splits).
        seed: the seed of the batch shuffling and of the synthetic task.
        synthetic_train_size: training pairs of the synthetic task.
        synthetic_eval_size: validation and test pairs of the synthetic task.
    """

    def __init__(
        self,
        dataset: str = "synthetic",
        dataset_config: str | None = None,
        source_lang: str = SOURCE_LANG,
        target_lang: str = TARGET_LANG,
        train_split: str = "train",
        validation_split: str = "validation",
        test_split: str = "test",
        tokenizer: str | None = None,
        bpe_vocab_size: int = 8000,
        bpe_min_frequency: int = 2,
        bpe_sample_size: int | None = 1_000_000,
        streaming: bool = False,
        stream_buffer: int = 100_000,
        tokenizer_dir: str | None = None,
        max_tokens: int = 4096,
        max_sentences: int | None = None,
        eval_max_tokens: int = DECODING_MAX_TOKENS,
        max_source_positions: int = 256,
        max_target_positions: int = 256,
        num_workers: int = 0,
        seed: int = 0,
        synthetic_train_size: int = 20_000,
        synthetic_eval_size: int = 500,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        check_data_settings(self.hparams)
        if source_lang == target_lang:
            raise DataError(f"source_lang and target_lang are both {source_lang!r}: choose two different languages")
        if dataset != "synthetic":
            check_source(dataset)
            if (reason := why_unwritable(datasets.config.HF_DATASETS_CACHE)) is not None:
                raise DataError(
                    f"the datasets cache {datasets.config.HF_DATASETS_CACHE} (HF_DATASETS_CACHE) cannot be written: "
                    f"{reason}. Set HF_DATASETS_CACHE to a folder you can write to: the data read and tokenized is "
                    "kept there"
                )
        elif streaming:
            raise DataError(
                "data.streaming reads a dataset of files or of the Hub; the synthetic task is made in memory: set "
                "data.streaming to false"
            )
        if tokenizer is None and tokenizer_dir is not None and (reason := why_unwritable(tokenizer_dir)) is not None:
            raise DataError(
                f"data.tokenizer_dir {tokenizer_dir}: cannot write there ({reason}). Give a folder you can write to "
                "(or a tokenizer to load, data.tokenizer)"
            )
        for name, budget in (("max_tokens", max_tokens), ("eval_max_tokens", eval_max_tokens)):
            if budget < max(max_source_positions, max_target_positions):
                raise DataError(
                    f"{name}={budget} is smaller than max_source_positions={max_source_positions} or "
                    f"max_target_positions={max_target_positions}: the longest allowed pair would not fit in a batch"
                )
        self._raw_splits: dict[str, Dataset] = {}
        self._prepared: dict[str, tuple[Dataset, np.ndarray, np.ndarray]] = {}
        self.filter_stats: dict[str, dict[str, int]] = {}
        self.tokenizer: PreTrainedTokenizerFast = self._load_or_train_tokenizer()
        # Where the tokenizer can be loaded from (None until a trained one is saved with the run).
        self.tokenizer_location: str | None = tokenizer or tokenizer_dir
        self._collator = TranslationCollator(
            self.tokenizer.pad_token_id, max_source_positions, max_target_positions, vocab_size=len(self.tokenizer)
        )
        self._pair_filter = TrainingPairFilter(max_source_positions, max_target_positions)

    # ----------------------------------------------------------------------------------------------- tokenizer
    def _load_or_train_tokenizer(self) -> PreTrainedTokenizerFast:
        hp = self.hparams
        if hp.tokenizer is not None:
            return load_tokenizer(hp.tokenizer)
        if hp.tokenizer_dir is None:
            return self._train_tokenizer()
        # Every process of a run builds the data module: the first to take the lock trains and saves the tokenizer,
        # the others (and later runs of the same data) load it.
        Path(hp.tokenizer_dir).mkdir(parents=True, exist_ok=True)
        with FileLock(Path(hp.tokenizer_dir) / ".training.lock"):
            if has_saved_tokenizer(hp.tokenizer_dir):
                check_trained_on(hp.tokenizer_dir, self._tokenizer_recipe())
                rank_zero_info(f"Loading the tokenizer saved in {hp.tokenizer_dir}, trained earlier on the same data")
                return load_tokenizer(hp.tokenizer_dir)
            tokenizer = self._train_tokenizer()
            save_tokenizer(tokenizer, hp.tokenizer_dir, self._tokenizer_recipe())
            return tokenizer

    def _train_tokenizer(self) -> PreTrainedTokenizerFast:
        """A joint BPE vocabulary trained on the training split, or on a seeded sample of `bpe_sample_size` pairs."""
        hp = self.hparams
        pairs, count = self._bpe_sample()
        split = f"split {hp.train_split!r} of {hp.dataset}"
        if hp.streaming:
            split = f"the first {count:,} pairs of a shuffled stream of {split} (data.bpe_sample_size)"
        elif count < len(self.raw_pairs(hp.train_split)):
            split = f"a sample of {count:,} pairs of {split} (data.bpe_sample_size)"
        at_most = "up to " if hp.streaming else ""  # a stream's length is known once it has been read
        rank_zero_info(
            f"Training a {hp.bpe_vocab_size}-token BPE tokenizer on {split} ({at_most}{2 * count:,} sentences, "
            "source and target)"
        )
        read = {"pairs": 0, "texts": 0}

        def sentences() -> Iterator[list[str]]:
            for batch in pairs.iter(batch_size=1000):
                read["pairs"] += len(batch["source_text"])
                for side in ("source_text", "target_text"):
                    read["texts"] += sum(1 for text in batch[side] if text.strip())
                    yield batch[side]

        tokenizer = train_bpe_tokenizer(sentences(), hp.bpe_vocab_size, hp.bpe_min_frequency, total=2 * count)
        if not read["texts"]:  # a vocabulary of the special tokens alone; a stream of such pairs would never end
            raise DataError(
                f"{split}: no sentence holds text ({read['pairs']:,} pairs read, all blank), so there is nothing to "
                "train the tokenizer or the model on. Check data.dataset, data.train_split and the languages"
            )
        return tokenizer

    def _bpe_sample(self) -> tuple[Dataset | IterableDataset, int]:
        """The training pairs the tokenizer learns from, and how many (at most, for a stream): all of them, or
        `bpe_sample_size` drawn without replacement (seeded by `seed`) from a larger split, in the split's order; of
        a stream, its first `bpe_sample_size` pairs after a shuffle, read as the tokenizer learns (never held)."""
        hp = self.hparams
        if hp.streaming:
            size = hp.bpe_sample_size or 1_000_000
            return self._train_stream().shuffle(seed=hp.seed, buffer_size=hp.stream_buffer).take(size), size
        pairs, size = self.raw_pairs(self.hparams.train_split), self.hparams.bpe_sample_size
        if size is None or len(pairs) <= size:
            return pairs, len(pairs)
        chosen = np.random.default_rng(self.hparams.seed).choice(len(pairs), size=size, replace=False)
        return pairs.select(np.sort(chosen)), size

    def _tokenizer_recipe(self) -> dict[str, Any]:
        """What a trained tokenizer depends on: the training data and the BPE settings (the sample size only where it
        sampled, so that a record written before samples were drawn still matches)."""
        hp = self.hparams
        names = ["dataset", "dataset_config", "train_split", "source_lang", "target_lang"]
        names += ["bpe_vocab_size", "bpe_min_frequency"]
        if hp.dataset == "synthetic":
            names += ["synthetic_train_size", "seed"]
        recipe = {name: hp[name] for name in names}
        sampled = hp.streaming or (
            hp.bpe_sample_size is not None and len(self.raw_pairs(hp.train_split)) > hp.bpe_sample_size
        )
        if sampled:
            recipe |= {"bpe_sample_size": hp.bpe_sample_size, "seed": hp.seed}
        return recipe

    # -------------------------------------------------------------------------------------------------- splits
    def _split_name(self, role: str) -> str:
        return self.hparams[f"{role}_split"]

    def raw_pairs(self, split: str) -> Dataset:
        """The untokenized pairs of a split (`source_text`/`target_text`, what translations are scored on), cached."""
        hp = self.hparams
        if split not in self._raw_splits:
            if hp.dataset == "synthetic":
                eval_splits = [hp.validation_split, hp.test_split]
                splits = synthetic_splits(
                    hp.train_split, eval_splits, hp.synthetic_train_size, hp.synthetic_eval_size, hp.seed
                )
                for name, data in splits.items():
                    self._raw_splits[name] = to_pairs(data, hp.source_lang, hp.target_lang, origin="the synthetic task")
            else:
                self._raw_splits[split] = load_split(
                    hp.dataset, hp.dataset_config, split, hp.source_lang, hp.target_lang
                )
        return self._raw_splits[split]

    def prepare_data(self) -> None:
        """Lightning calls this on one process per node before every process sets up: the splits the run needs are
        tokenized into the `datasets` cache next to the data (for data read from files or the Hub, which `datasets`
        keeps on disk), and the other processes' `setup` then memory-maps that cache instead of tokenizing the corpus
        again; so does a later run of the same data and tokenizer."""
        stage = self.trainer.state.fn if self.trainer is not None else None
        for role in self._prepared_roles(stage):
            pairs = self.raw_pairs(self._split_name(role))
            if pairs.cache_files:  # in memory (the synthetic task), there would be nothing to share
                with writing_cache_of(pairs):
                    self._tokenize(self._split_name(role), pairs, keep_text=role != "train")

    def _prepared_roles(self, stage: str | None) -> tuple[str, ...]:
        """The splits a stage tokenizes ahead: all it uses, but a streamed training split."""
        roles = _ROLES_OF_STAGE.get(stage, ("train", "validation", "test"))
        return tuple(role for role in roles if not (role == "train" and self.hparams.streaming))

    def _train_stream(self) -> IterableDataset:
        hp = self.hparams
        return stream_split(hp.dataset, hp.dataset_config, hp.train_split, hp.source_lang, hp.target_lang)

    def setup(self, stage: str | None = None) -> None:
        for role in self._prepared_roles(stage):
            self._prepare(role)
        if stage in (None, "fit") and self.hparams.tokenizer is None and self.hparams.tokenizer_dir is None:
            self._save_tokenizer_with_run()

    def _save_tokenizer_with_run(self) -> None:
        """Keep the trained tokenizer next to the run's logs and checkpoints so export and reload find it."""
        if self.trainer is None:
            return
        log_dir = self.trainer.log_dir  # a broadcast from rank 0: every rank must ask, or DDP hangs
        if log_dir is not None:
            self.tokenizer_location = str(Path(log_dir) / "tokenizer")
            if self.trainer.is_global_zero:
                save_tokenizer(self.tokenizer, self.tokenizer_location, self._tokenizer_recipe())

    def _prepare(self, role: str) -> tuple[Dataset, np.ndarray, np.ndarray]:
        """Tokenize and filter a split once: (dataset, source lengths, target lengths)."""
        if role not in self._prepared:
            split = self._split_name(role)
            pairs = self.raw_pairs(split)
            rank_zero_info(f"{role} split {split!r}: tokenizing {len(pairs):,} pairs")
            with writing_cache_of(pairs):
                encoded = self._tokenize(split, pairs, keep_text=role != "train")
                self._prepared[role] = self._filter(role, split, encoded)
        return self._prepared[role]

    def _tokenize(self, split: str, pairs: Dataset, keep_text: bool) -> Dataset:
        """Token ids, lengths and an emptiness flag per pair; cached by `datasets` under the tokenizer's hash (built
        again where that cache is damaged). The text stays (`keep_text`) where translations are scored against it,
        evaluation; training needs the ids only, and its cache is half the size without the text."""
        return rebuilt_if_damaged(
            functools.partial(self._tokenize_pairs, pairs, keep_text), f"split {split!r}, tokenized"
        )

    def _tokenize_pairs(self, pairs: Dataset, keep_text: bool, rebuild: bool) -> Dataset:
        num_proc = min(self.hparams.num_workers, len(pairs) // _ROWS_PER_TOKENIZER_PROCESS)
        return pairs.map(
            _encode_pairs,
            batched=True,
            # The tokenizer as its JSON text: datasets hashes a text reliably (a tokenizer object it does not), so the
            # cache of a split tokenized with other settings is never taken.
            fn_kwargs={
                "tokenizer": self.tokenizer.backend_tokenizer.to_str(),
                "unknown_id": self.tokenizer.unk_token_id,
            },
            num_proc=num_proc if num_proc > 1 else None,
            batch_size=ROWS_PER_CACHE_BATCH,  # a batched map writes a record batch per batch it maps
            writer_batch_size=ROWS_PER_CACHE_BATCH,
            remove_columns=None if keep_text else ["source_text", "target_text"],
            features=_ENCODED_FEATURES if keep_text else _ENCODED_IDS_FEATURES,
            load_from_cache_file=not rebuild,
            desc="Tokenizing",
        )

    def _filter(self, role: str, split: str, encoded: Dataset) -> tuple[Dataset, np.ndarray, np.ndarray]:
        """Drop (training) or cut (evaluation) pairs over the length limits; count what happens to each pair."""
        hp = self.hparams
        table = encoded.with_format("arrow", columns=["source_length", "target_length", "empty"])[:]
        source = _column(table, "source_length", hp.max_source_positions)
        target = _column(table, "target_length", hp.max_target_positions)
        empty = _column(table, "empty")
        # Masks a block at a time: over the whole split each would take a byte a pair. Pairs are seldom dropped, so
        # the indices of the dropped ones are what the filter keeps.
        training, dropped, empties, too_long_pairs, too_long_nonempty = role == "train", [], 0, 0, 0
        for start in range(0, len(empty), _ROWS_PER_FILTER_BLOCK):
            block = slice(start, start + _ROWS_PER_FILTER_BLOCK)
            too_long = self._pair_filter.too_long(source[block], target[block])
            empties += int(empty[block].sum())
            too_long_pairs += int(too_long.sum())
            too_long_nonempty += int((too_long & ~empty[block]).sum())
            if training:
                dropped.append(start + np.flatnonzero(too_long | empty[block]))
        del empty
        dropped = np.concatenate(dropped) if dropped else np.zeros(0, dtype=np.int64)
        stats = {
            "pairs": len(encoded),
            "kept": len(encoded) - len(dropped),
            "dropped_empty": empties if training else 0,
            "dropped_too_long": too_long_nonempty if training else 0,
            "truncated": 0 if training else too_long_pairs,
        }
        if not stats["kept"]:
            raise self._pair_filter.nothing_kept(
                f"split {split!r}", len(encoded), stats["dropped_empty"], stats["dropped_too_long"]
            )
        if training:  # training batches carry ids only: the raw text is for scoring translations in evaluation
            self._check_unknown_rate(split, encoded, source, target)
            if len(dropped):  # a selection is an index of every pair kept: none when all are
                encoded = encoded.select(np.delete(np.arange(len(encoded)), dropped))
            encoded = encoded.select_columns(["input_ids", "labels"])
        else:
            # `index` is the pair's line in the split, so hypotheses can be written back in the split's order.
            encoded = encoded.add_column("index", np.arange(len(encoded)))
            encoded = encoded.select_columns(["input_ids", "labels", "source_text", "target_text", "index"])
        self.filter_stats[role] = stats
        rank_zero_info(f"{role} split {split!r}: " + ", ".join(f"{key}={value}" for key, value in stats.items()))
        self._log_filter_stats(role, stats)
        if not training:  # evaluation cuts what is too long
            source, target = np.minimum(source, hp.max_source_positions), np.minimum(target, hp.max_target_positions)
        elif len(dropped):  # copies of the lengths only where pairs were dropped
            source, target = np.delete(source, dropped), np.delete(target, dropped)
        return encoded, source, target

    def _check_unknown_rate(self, split: str, encoded: Dataset, source: np.ndarray, target: np.ndarray) -> None:
        unknown = pc.sum(encoded.with_format("arrow", columns=["unknown_tokens"])[:].column(0)).as_py() or 0
        rate = unknown / max(int(source.sum() + target.sum()), 1)
        if rate <= _UNKNOWN_RATE_WARNING:
            return
        hp = self.hparams
        if hp.tokenizer is not None:
            problem = f"the tokenizer {hp.tokenizer!r} does not cover this data's characters or languages"
            fix = "Use a tokenizer made for this data (data.tokenizer: null trains one; data.tokenizer_dir names where)"
        else:  # one trained on this split covers its characters: this one was trained earlier, in tokenizer_dir
            problem = (
                f"the tokenizer in {hp.tokenizer_dir} was trained on other data, or on this split before it changed"
            )
            fix = (
                f"Delete {hp.tokenizer_dir} to train one on the data as it is now, or set data.tokenizer_dir to "
                "another folder"
            )
        message = (
            f"{rate:.1%} of the tokens of training split {split!r} are {self.tokenizer.unk_token} ({unknown} tokens): "
            f"{problem}. {fix}"
        )
        if rate > _UNKNOWN_RATE_ERROR:
            raise DataError(message)
        rank_zero_warn(message)

    def _log_filter_stats(self, role: str, stats: dict[str, int]) -> None:
        trainer = self.trainer
        if trainer is not None:
            for logger in trainer.loggers:
                metrics = {f"data/{role}_{key}": value for key, value in stats.items()}
                logger.log_metrics(metrics, step=trainer.global_step)

    # ------------------------------------------------------------------------------------------------- loaders
    def _rank_and_world_size(self) -> tuple[int, int]:
        if self.trainer is not None:
            # A Trainer left at use_distributed_sampler=True stops before training with Lightning's own error, which
            # names that setting as the fix.
            return self.trainer.global_rank, self.trainer.world_size
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def _batch_sampler(self, role: str, max_tokens: int, shuffle: bool) -> TokenBudgetBatchSampler:
        _, source, target = self._prepare(role)
        rank, world_size = self._rank_and_world_size()
        return TokenBudgetBatchSampler(
            source,
            target,
            max_tokens,
            max_sentences=self.hparams.max_sentences,
            shuffle=shuffle,
            seed=self.hparams.seed,
            rank=rank,
            world_size=world_size,
        )

    def train_dataloader(self) -> ResumableDataLoader | StreamLoader:
        hp = self.hparams
        if not hp.streaming:
            return self._loader("train", ResumableDataLoader, hp.max_tokens, shuffle=True)
        rank, world_size = self._rank_and_world_size()
        stream = TokenBudgetStream(
            self._train_stream(),
            self.training_encoder(),
            hp.max_tokens,
            hp.max_source_positions,
            hp.max_target_positions,
            max_sentences=hp.max_sentences,
            shuffle_buffer=hp.stream_buffer,
            sort_buffer=hp.stream_buffer,
            seed=hp.seed,
            rank=rank,
            world_size=world_size,
            name=f"split {hp.train_split!r} of {hp.dataset}",
        )
        return StreamLoader(stream, self._collator, batches=self._streamed_batches())

    def training_encoder(self) -> Callable[[list[str]], list[list[int]]]:
        """How a stream encodes the training texts as it reads them (a batch of texts -> their token ids): with the
        tokenizer's full merges. A stream encodes as it reads, so a subclass may segment each pass anew
        (`lightning_modules.experimental.BPEDropoutDataModule`), and the batches are planned on what it gives."""
        return functools.partial(encode_ids, backend_tokenizer(self.tokenizer.backend_tokenizer.to_str()))

    def _streamed_batches(self) -> int:
        """The batches a run trains from a stream: trainer.max_steps, each of `accumulate_grad_batches` batches."""
        trainer = self.trainer
        if trainer is None or trainer.max_steps < 1:
            raise DataError(
                "data.streaming trains from an endless stream: set trainer.max_steps, the number of updates to train"
            )
        return trainer.max_steps * trainer.accumulate_grad_batches

    def val_dataloader(self) -> DataLoader:
        return self._loader("validation", DataLoader, self.hparams.eval_max_tokens, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", DataLoader, self.hparams.eval_max_tokens, shuffle=False)

    def _loader(self, role: str, loader_class: type[DataLoader], max_tokens: int, shuffle: bool) -> DataLoader:
        workers = self.hparams.num_workers
        batch_sampler = self._batch_sampler(role, max_tokens, shuffle)
        self._check_batch_limit(role, batch_sampler)
        # An iterator of a DataLoader without a generator of its own draws its workers' seed from the global RNG, the
        # model's: a validation would shift the dropout masks of the steps after it, which a run resumed from that
        # step's checkpoint, which does not validate it again, would not draw. (ResumableDataLoader has its own.)
        own_generator = {} if issubclass(loader_class, ResumableDataLoader) else {"generator": torch.Generator()}
        return loader_class(
            self._prepare(role)[0],
            batch_sampler=batch_sampler,
            collate_fn=self._collator,
            num_workers=workers,
            persistent_workers=workers > 0,
            worker_init_fn=_leave_ctrl_c_to_the_main_process,
            **own_generator,
        )

    def _check_batch_limit(self, role: str, batch_sampler: TokenBudgetBatchSampler) -> None:
        """A fraction of a small split's batches (`limit_val_batches: 0.25` with a 100-pair validation split) can be
        less than one batch, which Lightning reports with a traceback: name the split and the settings instead."""
        name = _LIMIT_OF_ROLE[role]
        limit = getattr(self.trainer, name, None)
        if isinstance(limit, float) and 0 < limit < 1 and int(len(batch_sampler) * limit) < 1:
            batches = len(batch_sampler)
            raise DataError(
                f"{role} split {self._split_name(role)!r} makes {batches} batch{'es' * (batches != 1)} of up to "
                f"{batch_sampler.max_tokens} tokens per device, and trainer.{name}={limit} keeps {limit:.0%} of them: "
                f"less than one. Set trainer.{name} to 1.0 (the whole split) or to a number of batches (an int, e.g. 1)"
            )


def check_data_settings(settings: dict[str, Any]) -> None:
    """Refuse a data setting out of its range (`_SETTING_RULES`) before any work, naming it."""
    for name, (is_valid, rule) in _SETTING_RULES.items():
        if not is_valid(settings[name]):
            raise DataError(f"data.{name}={settings[name]!r} {rule}")


def _leave_ctrl_c_to_the_main_process(worker_id: int) -> None:
    """A terminal sends Ctrl-C to the data loader workers too. The main process stops at the end of its step
    (`ResumableCheckpoint`), and may need batches until then (validation's too): a worker that the Ctrl-C ended would
    not make them, and one that inherited the main process's handler would act on it a second time."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _encode_pairs(batch: dict[str, list[str]], tokenizer: str, unknown_id: int | None) -> dict[str, list[Any]]:
    """Ids (with the tokenizer's special tokens), lengths and unknown-token counts of a batch of pairs; `tokenizer` is
    the tokenizer's JSON text."""
    encoder = backend_tokenizer(tokenizer)
    source, target = encode_ids(encoder, batch["source_text"]), encode_ids(encoder, batch["target_text"])
    return {
        "input_ids": source,
        "labels": target,
        "source_length": [len(ids) for ids in source],
        "target_length": [len(ids) for ids in target],
        "unknown_tokens": [
            source_ids.count(unknown_id) + target_ids.count(unknown_id)
            for source_ids, target_ids in zip(source, target, strict=True)
        ],
        "empty": [
            TrainingPairFilter.is_empty(source_text, target_text)
            for source_text, target_text in zip(batch["source_text"], batch["target_text"], strict=True)
        ],
    }


def _column(table: pa.Table, name: str, limit: int | None = None) -> np.ndarray:
    """A column as one numpy array, filled a chunk at a time from the split's memory-mapped Arrow table (no copy of
    the whole column on the way; datasets' numpy formatting took seconds and several copies a column at 20 M rows).
    Lengths (`limit`: the model's) are int16 where they and the limit fit: two bytes a pair."""
    column = table.column(name)
    dtype = column.type.to_pandas_dtype()
    if limit is not None and max(pc.max(column).as_py() or 0, limit) < 2**15:
        dtype = np.int16
    values, start = np.empty(len(column), dtype=dtype), 0
    for chunk in column.chunks:
        values[start : start + len(chunk)] = chunk.to_numpy(zero_copy_only=False)
        start += len(chunk)
    return values

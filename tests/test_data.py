"""TranslationDataModule on the synthetic task, on local files of each layout and, via MULTI30K_DIR, on Multi30k."""

import csv
import errno
import gzip
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import unicodedata
import warnings
from collections import Counter
from pathlib import Path

import datasets
import huggingface_hub.constants
import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from conftest import multi30k_dir
from lightning.pytorch.callbacks import ModelCheckpoint
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

import lightning_modules.data.datamodule as datamodule_module
from hf_transformer.errors import DataError, DiskFull
from lightning_modules import TranslationDataModule
from lightning_modules.data.batching import padding_efficiency
from lightning_modules.data.sources import load_split
from lightning_modules.data.synthetic import number_to_words, synthetic_splits
from lightning_modules.experimental import BPEDropoutDataModule

SMALL = {"synthetic_train_size": 2000, "synthetic_eval_size": 200, "max_tokens": 512, "eval_max_tokens": 512}
MULTI30K = {"source_lang": "en", "target_lang": "de", "validation_split": "val", "test_split": "test_2016_flickr"}


def use_offline_cache(patch: pytest.MonkeyPatch, cache: Path) -> None:
    """A private datasets cache and no network; `datasets` read both settings at import, so patch its config too."""
    patch.setenv("HF_DATASETS_CACHE", str(cache))
    patch.setenv("HF_HUB_OFFLINE", "1")
    patch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    patch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(autouse=True)
def offline_cache(monkeypatch, tmp_path):
    use_offline_cache(monkeypatch, tmp_path / "hf_datasets")


@pytest.fixture(scope="module")
def synthetic():
    dm = TranslationDataModule(**SMALL)
    dm.setup()
    return dm


@pytest.fixture(scope="module")
def multi30k(tmp_path_factory):
    folder = multi30k_dir()
    with pytest.MonkeyPatch.context() as patch:
        use_offline_cache(patch, tmp_path_factory.mktemp("hf_datasets"))
        dm = TranslationDataModule(dataset=folder, **MULTI30K)
        dm.setup()
        yield dm


@pytest.fixture(params=["synthetic", "multi30k"])
def datamodule(request):
    return request.getfixturevalue(request.param)


def sampler_for_rank(dm: TranslationDataModule, rank: int, world_size: int, epoch: int = 0):
    sampler = dm.train_dataloader().batch_sampler
    sampler.rank, sampler.world_size = rank, world_size
    sampler.set_epoch(epoch)
    return sampler


def write_lines(path: Path, lines: list[str]) -> None:
    text = "".join(line + "\n" for line in lines)
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as file:
            file.write(text)
    else:
        path.write_text(text, encoding="utf-8")


def write_jsonl(path: Path, rows: list[dict]) -> None:
    write_lines(path, [json.dumps(row, ensure_ascii=False) for row in rows])


PAIRS = [("a small dog runs", "ein kleiner Hund rennt"), ("two men", "zwei Männer"), ("a cat", "eine Katze")]


def local_module(
    dataset: Path | str, module: type[TranslationDataModule] = TranslationDataModule, **kwargs
) -> TranslationDataModule:
    """A data module (`module`: a subclass) over a tiny local dataset, ready to use (tokenizer trained, all splits
    prepared)."""
    args = {"source_lang": "en", "target_lang": "de", "bpe_vocab_size": 100, "bpe_min_frequency": 1, **kwargs}
    dm = module(dataset=str(dataset), **args)
    dm.setup()
    return dm


def pairs_of(dm: TranslationDataModule, role: str) -> list[tuple[str, str]]:
    loader = dm.val_dataloader() if role == "validation" else dm.test_dataloader()
    return sorted(pair for batch in loader for pair in zip(batch["source_text"], batch["target_text"], strict=True))


# ------------------------------------------------------------------------------------------------- synthetic task
def test_number_words():
    assert number_to_words(4821) == "four thousand eight hundred twenty-one"
    assert number_to_words(0) == "zero"
    assert number_to_words(110_019) == "one hundred ten thousand nineteen"
    assert number_to_words(2_000_050) == "two million fifty"


def test_synthetic_task_is_deterministic_and_evaluates_on_unseen_long_numbers():
    first = synthetic_splits("train", ["validation"], 500, 100, seed=0)
    again = synthetic_splits("train", ["validation"], 500, 100, seed=0)
    other = synthetic_splits("train", ["validation"], 500, 100, seed=1)
    assert first["train"][:] == again["train"][:] and first["validation"][:] == again["validation"][:]
    assert first["train"][:] != other["train"][:]
    seen = set(first["train"]["digits"])
    assert not [n for n in first["validation"]["digits"] if len(n) >= 4 and n in seen]


def test_synthetic_task_runs_in_either_direction():
    dm = TranslationDataModule(source_lang="words", target_lang="digits", **SMALL)
    batch = next(iter(dm.val_dataloader()))
    pairs = zip(batch["source_text"], batch["target_text"], strict=True)
    assert all(number_to_words(int(digits)) == words for words, digits in pairs)
    with pytest.raises(DataError, match="language 'fr' not in the data; languages present: digits, words"):
        TranslationDataModule(target_lang="fr", **SMALL)


# ------------------------------------------------------------------------------------------------------ tokenizer
def test_tokenizer_and_special_ids_exist_right_after_init():
    dm = TranslationDataModule(**SMALL)
    assert dm.filter_stats == {}  # no split tokenized yet: the CLI links these before setup()
    tokenizer = dm.tokenizer
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (
        0,
        1,
        2,
        3,
    )
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 3]) == ["<pad>", "<s>", "</s>", "<unk>"]
    assert len(tokenizer) < dm.hparams.bpe_vocab_size  # the trained size, not the requested one
    ids = tokenizer("four thousand eight hundred twenty-one")["input_ids"]
    assert ids[-1] == 2 and 1 not in ids and 2 not in ids[:-1]
    for text in ("4821", "four thousand eight hundred twenty-one"):
        assert tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) == text


def test_tokenizer_dir_saves_then_reloads_instead_of_retraining(tmp_path):
    folder = tmp_path / "tokenizer"
    first = TranslationDataModule(tokenizer_dir=str(folder), **SMALL)
    written = (folder / "tokenizer.json").stat().st_mtime_ns
    second = TranslationDataModule(tokenizer_dir=str(folder), **SMALL)
    assert (folder / "tokenizer.json").stat().st_mtime_ns == written
    assert second.tokenizer.get_vocab() == first.tokenizer.get_vocab()
    existing = TranslationDataModule(tokenizer=str(folder), **SMALL)
    assert existing.tokenizer.get_vocab() == first.tokenizer.get_vocab()


def test_a_saved_tokenizer_is_refused_for_other_data_or_settings(tmp_path):
    """The demo pins tokenizer_dir: training on other data in the same folder must not reuse its vocabulary."""
    folder = tmp_path / "tokenizer"
    TranslationDataModule(tokenizer_dir=str(folder), **SMALL)
    assert json.loads((folder / "trained_on.json").read_text())["dataset"] == "synthetic"
    with pytest.raises(DataError, match=r"bpe_vocab_size: 8000 then, 50 now.*Delete .*tokenizer"):
        TranslationDataModule(tokenizer_dir=str(folder), **{**SMALL, "bpe_vocab_size": 50})
    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data" / "train.jsonl", [{"en": s, "de": t} for s, t in PAIRS])
    with pytest.raises(DataError, match=r"dataset: 'synthetic' then, .*data' now.*source_lang: 'digits' then, 'en'"):
        TranslationDataModule(
            dataset=str(tmp_path / "data"), source_lang="en", target_lang="de", tokenizer_dir=str(folder)
        )


def test_a_tokenizer_that_does_not_cover_the_data_stops_training(tmp_path):
    numbers = tmp_path / "numbers"
    TranslationDataModule(tokenizer_dir=str(numbers), **SMALL)  # digits and English number words only
    for split in ("train", "validation", "test"):
        write_jsonl(tmp_path / f"{split}.jsonl", [{"en": s, "de": t} for s, t in PAIRS * 5])
    with pytest.raises(DataError, match=r"% of the tokens of training split 'train' are <unk>.*does not cover"):
        local_module(tmp_path, tokenizer=str(numbers))


def test_data_changed_in_place_names_the_saved_tokenizer_to_delete(tmp_path):
    """The hint was `tokenizer: null`, which was already set: the tokenizer reused was the one saved in tokenizer_dir,
    trained on the split before it changed."""
    data, folder = tmp_path / "data", tmp_path / "tokenizer"
    data.mkdir()

    def write_splits(pairs: list[tuple[str, str]]) -> None:
        for split in ("train", "validation", "test"):
            write_jsonl(data / f"{split}.jsonl", [{"en": s, "de": t} for s, t in pairs * 5])

    write_splits(PAIRS)
    local_module(data, tokenizer_dir=str(folder))
    write_splits([("ένας μικρός σκύλος τρέχει", "ein kleiner Hund rennt"), ("δύο άνδρες", "zwei Männer")])
    with pytest.raises(DataError) as error:
        local_module(data, tokenizer_dir=str(folder))
    assert (
        f"the tokenizer in {folder} was trained on other data, or on this split before it changed. Delete "
        f"{folder} to train one on the data as it is now" in str(error.value)
    )
    assert "tokenizer: null" not in str(error.value)


def test_bpe_training_is_deterministic():
    assert TranslationDataModule(**SMALL).tokenizer.get_vocab() == TranslationDataModule(**SMALL).tokenizer.get_vocab()


def test_prepared_ids_are_the_shared_tokenizers_ids(synthetic):
    """The ids a run trains and evaluates on are the ones the tokenizer it saves with the model gives for the text
    (the data module encodes without character offsets, the tokenizer with them)."""
    dataset, _, _ = synthetic._prepare("validation")
    rows = dataset[:50]
    assert rows["input_ids"] == synthetic.tokenizer(rows["source_text"])["input_ids"]
    assert rows["labels"] == synthetic.tokenizer(rows["target_text"])["input_ids"]


def test_tokenization_cache_follows_the_tokenizer(tmp_path):
    for split in ("train", "validation", "test"):
        write_jsonl(tmp_path / f"{split}.jsonl", [{"en": s, "de": t} for s, t in PAIRS * 20])

    def cache_files_after_setup(bpe_vocab_size: int) -> dict[Path, tuple[int, int]]:
        """Each tokenized cache file with its inode and modification time, which change when it is written again."""
        dm = local_module(tmp_path, bpe_vocab_size=bpe_vocab_size)
        folder = Path(dm.raw_pairs("train").cache_files[0]["filename"]).parent
        return {path: (path.stat().st_ino, path.stat().st_mtime_ns) for path in folder.glob("cache-*.arrow")}

    tokenized = cache_files_after_setup(60)
    assert tokenized, "setup wrote no tokenized cache next to the raw split"
    assert cache_files_after_setup(60) == tokenized  # the same tokenizer reads the same files, unwritten
    retokenized = cache_files_after_setup(80)  # another tokenizer tokenizes anew, beside the old cache
    assert retokenized.items() > tokenized.items()


def test_trained_tokenizer_is_saved_with_the_run(synthetic, tmp_path):
    trainer = pl.Trainer(logger=False, default_root_dir=tmp_path, enable_progress_bar=False)
    synthetic.trainer = trainer
    try:
        synthetic.setup("fit")
    finally:
        synthetic.trainer = None
    assert (tmp_path / "tokenizer" / "tokenizer.json").is_file()


# -------------------------------------------------------------------------------------------------------- batches
def test_batches_have_the_model_format_and_respect_the_budget(datamodule):
    max_tokens = datamodule.hparams.max_tokens
    tokenizer = datamodule.tokenizer
    for batch in datamodule.train_dataloader():
        input_ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
        assert input_ids.dtype == mask.dtype == labels.dtype == torch.long
        assert input_ids.numel() <= max_tokens and labels.numel() <= max_tokens
        assert torch.equal(mask.bool(), input_ids != tokenizer.pad_token_id)
        assert mask[:, 0].all() and (labels[:, 0] != -100).all()
        last = (labels != -100).sum(1) - 1
        assert (labels[torch.arange(len(labels)), last] == tokenizer.eos_token_id).all()
        assert set(batch) == {"input_ids", "attention_mask", "labels"}


def test_two_ranks_get_disjoint_batches_covering_the_data_in_equal_numbers(datamodule):
    for epoch in (0, 1):
        ranks = [list(sampler_for_rank(datamodule, rank, 2, epoch)) for rank in (0, 1)]
        assert len(ranks[0]) == len(ranks[1])
        indices = [i for batches in ranks for batch in batches for i in batch]
        assert sorted(indices) == list(range(len(datamodule.train_dataloader().dataset)))


def test_same_seed_and_epoch_give_the_same_batches(datamodule):
    assert list(sampler_for_rank(datamodule, 0, 1, 3)) == list(sampler_for_rank(datamodule, 0, 1, 3))
    assert list(sampler_for_rank(datamodule, 0, 1, 3)) != list(sampler_for_rank(datamodule, 0, 1, 4))


def test_loader_state_resumes_mid_epoch(datamodule):
    loader = datamodule.train_dataloader()
    loader.batch_sampler.set_epoch(1)
    full = [batch["input_ids"] for batch in loader]
    iterator = iter(loader)
    head = [next(iterator)["input_ids"] for _ in range(3)]
    resumed = datamodule.train_dataloader()
    resumed.load_state_dict(loader.state_dict())
    rest = [batch["input_ids"] for batch in resumed]
    assert len(head) + len(rest) == len(full)
    assert all(torch.equal(a, b) for a, b in zip(head + rest, full, strict=True))


def test_evaluation_batches_keep_every_pair_once_across_ranks(datamodule):
    raw = datamodule.raw_pairs(datamodule.hparams.validation_split)
    expected = Counter(zip(raw["source_text"], raw["target_text"], strict=True))
    seen, counts = Counter(), []
    for rank in (0, 1):
        loader = datamodule.val_dataloader()
        loader.batch_sampler.rank, loader.batch_sampler.world_size = rank, 2
        batches = list(loader)
        counts.append(len(batches))
        for batch in batches:
            assert batch["input_ids"].numel() <= datamodule.hparams.eval_max_tokens
            seen.update(zip(batch["source_text"], batch["target_text"], strict=True))
            decoded = datamodule.tokenizer.batch_decode(batch["input_ids"], skip_special_tokens=True)
            assert decoded == [unicodedata.normalize("NFKC", text) for text in batch["source_text"]]
    assert seen == expected and counts[0] == counts[1]


def test_multi30k_padding_efficiency_beats_random_batching(multi30k):
    sampler = multi30k.train_dataloader().batch_sampler
    plan = sampler.plan(0)
    ours = padding_efficiency(plan, sampler.source_lengths, sampler.target_lengths)
    shuffled = np.array_split(np.random.default_rng(0).permutation(len(sampler.source_lengths)), len(plan))
    random = padding_efficiency(shuffled, sampler.source_lengths, sampler.target_lengths)
    print(
        f"\nMulti30k en-de, max_tokens={multi30k.hparams.max_tokens}: {len(plan)} batches of "
        f"{len(sampler.source_lengths) / len(plan):.0f} pairs on average; padding efficiency "
        f"{ours:.4f} (length-sorted) vs {random:.4f} (random batches of the same mean size)"
    )
    assert ours > 0.95 and random < 0.6


def test_multi30k_german_round_trips_through_the_tokenizer(multi30k):
    german = list(multi30k.raw_pairs("val")["target_text"])
    tokenizer = multi30k.tokenizer
    decoded = tokenizer.batch_decode(tokenizer(german)["input_ids"], skip_special_tokens=True)
    assert decoded == [unicodedata.normalize("NFKC", line) for line in german]
    assert sum(a == b for a, b in zip(decoded, german, strict=True)) >= 0.99 * len(german)


def test_multi30k_vocabulary_keeps_punctuation_apart_from_words(multi30k):
    """'Blumen.' and 'Blumen' must share the word's tokens; no vocabulary entry is spent on a word glued to a mark."""
    tokenizer = multi30k.tokenizer
    vocabulary = set(tokenizer.get_vocab()) - set(tokenizer.all_special_tokens)
    glued = [
        token
        for token in vocabulary
        if any(c.isalnum() for c in token) and any(unicodedata.category(c).startswith("P") for c in token)
    ]
    assert glued == []
    assert tokenizer.tokenize("Blumen.") == [*tokenizer.tokenize("Blumen"), "."]


# ------------------------------------------------------------------------------------- BPE-dropout (experimental)
def test_bpe_dropout_without_a_stream_is_refused_naming_the_fix():
    with pytest.raises(DataError, match="data.bpe_dropout=0.1 .* set data.streaming to true"):
        BPEDropoutDataModule(**SMALL, bpe_dropout=0.1)


@pytest.mark.parametrize("value", [-0.1, 0.0, 1.0])
def test_bpe_dropout_that_is_no_probability_is_refused(value):
    with pytest.raises(DataError, match=r"data.bpe_dropout=.* is not a probability in \(0, 1\).*TranslationDataModule"):
        BPEDropoutDataModule(**SMALL, bpe_dropout=value, streaming=True)


def repeated_sentences(folder: Path) -> list[str]:
    """train/validation/test jsonl files of the same 60 sentences (German: the English upper-cased)."""
    folder.mkdir()
    sentences = [" ".join(["a dog runs on the grass"] * (1 + index % 3)) + f" {index}" for index in range(60)]
    for split in ("train", "validation", "test"):
        write_jsonl(folder / f"{split}.jsonl", [{"en": text, "de": text.upper()} for text in sentences])
    return sentences


def test_bpe_dropout_with_a_tokenizer_that_is_not_bpe_is_refused(tmp_path):
    repeated_sentences(tmp_path / "data")
    words = Tokenizer(models.WordLevel({"<pad>": 0, "</s>": 1, "<unk>": 2, "a": 3}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, pad_token="<pad>", eos_token="</s>")
    tokenizer.save_pretrained(tmp_path / "words")
    with pytest.raises(DataError, match="is a WordLevel model: use lightning_modules.TranslationDataModule"):
        local_module(
            tmp_path / "data", BPEDropoutDataModule, tokenizer=str(tmp_path / "words"), streaming=True, bpe_dropout=0.1
        )


def test_a_stream_with_bpe_dropout_segments_its_pairs_anew_and_plans_batches_on_those_segmentations(tmp_path):
    """Each pass segments every pair into more pieces than the full merges, differently from the last, in batches
    within the budget counted on those pieces; the text is unchanged; evaluation keeps all merges."""
    sentences = repeated_sentences(tmp_path / "data")
    settings = {"max_tokens": 120, "max_source_positions": 40, "max_target_positions": 40}
    dm = local_module(
        tmp_path / "data",
        BPEDropoutDataModule,
        streaming=True,
        bpe_dropout=0.3,
        tokenizer_dir=str(tmp_path / "tok"),
        **settings,
    )
    dm.trainer = pl.Trainer(max_steps=1000, logger=False, enable_checkpointing=False)
    tokenizer, passes = dm.tokenizer, []
    loader = iter(dm.train_dataloader())  # endless: Lightning stops it at max_steps
    for _ in range(2):
        segmented = {}
        while len(segmented) < len(sentences):
            batch = next(loader)
            assert batch["input_ids"].numel() <= 120 and batch["labels"].numel() <= 120
            for source, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True):
                ids = source[mask.bool()].tolist()
                segmented[tokenizer.decode(ids, skip_special_tokens=True)] = ids
        passes.append(segmented)
    assert set(passes[0]) == set(passes[1]) == set(sentences)
    full = {text: tokenizer(text)["input_ids"] for text in sentences}
    assert sum(map(len, passes[0].values())) > sum(map(len, full.values()))
    assert sum(passes[0][text] != passes[1][text] for text in sentences) > len(sentences) // 2
    for batch in dm.val_dataloader():
        for source, mask, text in zip(batch["input_ids"], batch["attention_mask"], batch["source_text"], strict=True):
            assert source[mask.bool()].tolist() == full[text]


# ----------------------------------------------------------------------------------------------------- Lightning
class Recorder(pl.LightningModule):
    """Trains nothing; records each training batch and the sampler's plan for this rank."""

    def __init__(self, out: Path | None = None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.batches: list[list[list[int]]] = []
        self.out = out

    def training_step(self, batch, batch_idx):
        self.batches.append(batch["input_ids"].tolist())
        return self.weight * batch["input_ids"].float().mean()

    def on_train_epoch_start(self):
        if self.out is not None:  # under DDP: which pairs this rank trains on, read by the test
            sampler = self.trainer.train_dataloader.batch_sampler
            record = {"rank": self.global_rank, "world": sampler.world_size, "indices": list(sampler)}
            (self.out / f"rank{self.global_rank}-epoch{self.current_epoch}.json").write_text(json.dumps(record))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_fit_end(self):
        if torch.distributed.is_initialized():
            # Leave together: a rank that exits while another still holds the process group aborts in gloo's threads.
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()


def fit(dm: TranslationDataModule, root: Path, ckpt_path: str | None = None, **trainer_args) -> Recorder:
    model = Recorder(trainer_args.pop("out", None))
    trainer = pl.Trainer(
        accelerator="cpu",
        logger=False,
        default_root_dir=root,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        **{"devices": 1, "enable_checkpointing": False, "use_distributed_sampler": False, **trainer_args},
    )
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return model


@pytest.mark.parametrize("num_workers", [0, 2])
def test_lightning_resumes_mid_epoch_with_the_next_unseen_batch(num_workers, tmp_path):
    dm = TranslationDataModule(num_workers=num_workers, **SMALL)
    whole = fit(dm, tmp_path / "whole", max_epochs=2).batches
    stop = len(dm.train_dataloader()) + 3  # the fourth batch of the second epoch
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=stop, save_top_k=-1)
    first = fit(dm, tmp_path / "cut", max_steps=stop, callbacks=[checkpoint], enable_checkpointing=True).batches
    assert first == whole[:stop]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*dataloader is not resumable.*")
        rest = fit(dm, tmp_path / "resume", max_epochs=2, ckpt_path=checkpoint.best_model_path).batches
    assert rest == whole[stop:]


@pytest.mark.slow  # two spawned processes that each import torch, Lightning and transformers
def test_ddp_ranks_train_on_disjoint_equal_shares(tmp_path):
    dm = TranslationDataModule(**SMALL)
    fit(dm, tmp_path, max_epochs=2, devices=2, strategy="ddp_spawn", out=tmp_path)
    for epoch in (0, 1):
        records = [json.loads((tmp_path / f"rank{rank}-epoch{epoch}.json").read_text()) for rank in (0, 1)]
        assert [record["world"] for record in records] == [2, 2]
        assert len(records[0]["indices"]) == len(records[1]["indices"])
        indices = [i for record in records for batch in record["indices"] for i in batch]
        assert sorted(indices) == list(range(SMALL["synthetic_train_size"]))


def test_rank_and_world_size_come_from_the_trainer(synthetic):
    ddp = {"accelerator": "cpu", "devices": 2, "strategy": "ddp_spawn", "logger": False}
    try:
        synthetic.trainer = pl.Trainer(use_distributed_sampler=False, **ddp)
        sampler = synthetic.train_dataloader().batch_sampler
        assert (sampler.rank, sampler.world_size) == (0, 2)
    finally:
        synthetic.trainer = None


@pytest.mark.slow  # two spawned processes that each import torch, Lightning and transformers
def test_a_trainer_that_would_wrap_the_batch_sampler_fails_naming_the_fix(tmp_path):
    """The batch sampler shards itself: Lightning, asked to inject a DistributedSampler, stops and names the setting."""
    with pytest.raises(Exception, match=r"Trainer\(use_distributed_sampler=False\)"):
        fit(
            TranslationDataModule(**{**SMALL, "synthetic_train_size": 64, "synthetic_eval_size": 8}),
            tmp_path,
            max_steps=1,
            devices=2,
            strategy="ddp_spawn",
            use_distributed_sampler=True,
        )


# ------------------------------------------------------------------------------------------------------- sources
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_folder_of_text_files_with_split_names_mapped(tmp_path, suffix):
    for split in ("train", "dev", "test2016"):
        write_lines(tmp_path / f"{split}.en{suffix}", [s for s, _ in PAIRS])
        write_lines(tmp_path / f"{split}.de{suffix}", [t for _, t in PAIRS])
        write_lines(tmp_path / f"{split}.fr{suffix}", ["un", "deux", "trois"])
    dm = local_module(tmp_path, validation_split="dev", test_split="test2016")
    assert pairs_of(dm, "validation") == sorted(PAIRS)
    reverse = local_module(tmp_path, source_lang="fr", target_lang="en", validation_split="dev", test_split="test2016")
    assert pairs_of(reverse, "test") == sorted(zip(["un", "deux", "trois"], [s for s, _ in PAIRS], strict=True))


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_a_byte_order_mark_is_no_part_of_the_text(tmp_path, suffix):
    """Files saved by Windows editors start with a UTF-8 byte-order mark, which became a token of the vocabulary."""
    for split in ("train", "validation", "test"):
        write_lines(tmp_path / f"{split}.en{suffix}", ["\ufeff" + PAIRS[0][0], *(s for s, _ in PAIRS[1:])])
        write_lines(tmp_path / f"{split}.de{suffix}", ["\ufeff" + PAIRS[0][1], *(t for _, t in PAIRS[1:])])
    dm = local_module(tmp_path)
    assert pairs_of(dm, "validation") == sorted(PAIRS)
    assert not [token for token in dm.tokenizer.get_vocab() if "\ufeff" in token]


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_a_carriage_return_inside_a_line_keeps_the_files_paired(tmp_path, suffix):
    """Universal newlines ended a line at a lone "\r" too: a stray one in line 2 of train.en and another in line 4 of
    train.de gave equal line counts, and the pairs between were shifted without an error. Lines end at "\n" only,
    "\r\n" (Windows) included."""
    sources = ["one", "two\rhalves", "three", "four", "five"]
    targets = ["eins", "zwei", "drei", "vier\rhälften", "fünf"]
    write_lines(tmp_path / f"train.en{suffix}", [source + "\r" for source in sources])  # \r\n line ends
    write_lines(tmp_path / f"train.de{suffix}", targets)
    pairs = load_split(str(tmp_path), None, "train", "en", "de")
    assert pairs["source_text"] == sources and pairs["target_text"] == targets
    # The lines are cached by `datasets`: a file changed in place is read again. Its new modification time is set a
    # second later, as an edit would be: the clock that stamps files ticks in milliseconds, and the same size and time
    # within one tick would be taken for the same file.
    edited = tmp_path / f"train.de{suffix}"
    earlier = edited.stat().st_mtime_ns
    write_lines(edited, [target.upper() for target in targets])
    os.utime(edited, ns=(earlier + 10**9, earlier + 10**9))
    assert load_split(str(tmp_path), None, "train", "en", "de")["target_text"] == [t.upper() for t in targets]


def test_a_tokenizer_that_appends_no_end_token_is_refused(tmp_path, tiny_tokenizer):
    """Without `</s>` at the end of every target the model never learns to stop: a tokenizer.json whose post-processor
    was removed must not train."""
    folder = tmp_path / "tokenizer"
    tiny_tokenizer.save_pretrained(folder)
    assert TranslationDataModule(tokenizer=str(folder), **SMALL).tokenizer.eos_token == "</s>"
    saved = json.loads((folder / "tokenizer.json").read_text())
    (folder / "tokenizer.json").write_text(json.dumps({**saved, "post_processor": None}))
    with pytest.raises(DataError, match=r"tokenizer '.*tokenizer' does not end an encoding with its eos token '</s>'"):
        TranslationDataModule(tokenizer=str(folder), **SMALL)


@pytest.mark.parametrize("kind", ["jsonl", "jsonl.gz", "tsv", "csv", "parquet"])
def test_folder_of_table_files(tmp_path, kind):
    rows = [{"en": s, "de": t} for s, t in PAIRS] + [{"en": '"quoted" start', "de": "NA"}]
    for split in ("train", "validation", "test"):
        path = tmp_path / f"{split}.{kind}"
        if kind.startswith("jsonl"):
            write_jsonl(path, rows)
        elif kind == "parquet":
            datasets.Dataset.from_list(rows).to_parquet(str(path))
        elif kind == "tsv":  # no quoting: a field is everything between tabs
            write_lines(path, ["en\tde"] + [f"{row['en']}\t{row['de']}" for row in rows])
        else:
            with path.open("w", newline="", encoding="utf-8") as file:
                writer = csv.DictWriter(file, ["en", "de"])
                writer.writeheader()
                writer.writerows(rows)
    assert pairs_of(local_module(tmp_path), "test") == sorted((row["en"], row["de"]) for row in rows)


def test_single_file_with_split_placeholder(tmp_path):
    for split in ("train", "validation", "test"):
        write_jsonl(tmp_path / f"{split}-pairs.jsonl", [{"en": s, "de": f"{t} {split}"} for s, t in PAIRS])
    dm = local_module(tmp_path / "{split}-pairs.jsonl")
    assert all(target.endswith(" validation") for _, target in pairs_of(dm, "validation"))


def test_hub_layout_with_translation_column(tmp_path):
    """The Hub path (`load_dataset(name, config)`), on a local folder in the layout of WMT14 on the Hub."""
    for split in ("train", "validation", "test"):
        rows = [{"translation": {"de": t, "en": s}} for s, t in PAIRS]
        (tmp_path / "de-en").mkdir(exist_ok=True)
        datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "de-en" / f"{split}-00000-of-00001.parquet"))
    (tmp_path / "README.md").write_text(
        "---\nconfigs:\n- config_name: de-en\n  data_files:\n"
        + "".join(f"  - split: {s}\n    path: de-en/{s}-*\n" for s in ("train", "validation", "test"))
        + "---\n"
    )
    dm = local_module(tmp_path, dataset_config="de-en")
    assert pairs_of(dm, "validation") == sorted(PAIRS)
    with pytest.raises(DataError, match="split 'val' not in dataset .*; its splits are train, validation, test"):
        local_module(tmp_path, dataset_config="de-en", validation_split="val")
    with pytest.raises(DataError, match="language 'fr' not in the data; languages present: de, en"):
        local_module(tmp_path, dataset_config="de-en", target_lang="fr")


# --------------------------------------------------------------------------------------------- filtering and errors
def test_tokenizer_training_says_that_it_runs_on_how_many_sentences_and_when_it_is_done(tmp_path, caplog):
    """BPE training on a large corpus takes minutes: it printed nothing."""
    write_jsonl(tmp_path / "train.jsonl", [{"en": s, "de": t} for s, t in PAIRS * 5])
    write_jsonl(tmp_path / "validation.jsonl", [{"en": s, "de": t} for s, t in PAIRS])
    write_jsonl(tmp_path / "test.jsonl", [{"en": s, "de": t} for s, t in PAIRS])
    rank_zero_logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    rank_zero_logger.addHandler(caplog.handler)  # Lightning's loggers do not propagate to the root
    try:
        local_module(tmp_path)
    finally:
        rank_zero_logger.removeHandler(caplog.handler)
    sentences = 2 * 5 * len(PAIRS)
    start = f"Training a 100-token BPE tokenizer on split 'train' of {tmp_path} ({sentences} sentences, "
    assert start in caplog.text
    assert re.search(rf"BPE tokenizer trained: \d+ tokens from {sentences} sentences in \d+\.\d s", caplog.text)


def test_the_tokenizer_learns_from_a_seeded_sample_of_a_large_split_and_says_how_far_it_has_read(
    tmp_path, caplog, monkeypatch
):
    """data.bpe_sample_size: a split larger than it trains the vocabulary on that many pairs drawn without
    replacement (the same ones for the same seed), recorded in trained_on.json; a smaller split trains on all its
    pairs and records no sample, as before samples were drawn. Progress lines come every PROGRESS_SENTENCES read."""
    from lightning_modules.data import tokenization

    monkeypatch.setattr(tokenization, "PROGRESS_SENTENCES", 20)
    words = [f"w{i}" for i in range(60)]
    rows = [{"en": f"{words[i // 60]} {words[i % 60]}", "de": f"{words[(3 * i) % 60]}"} for i in range(300)]
    write_jsonl(tmp_path / "train.jsonl", rows)
    write_jsonl(tmp_path / "validation.jsonl", rows[:3])
    write_jsonl(tmp_path / "test.jsonl", rows[:3])
    rank_zero_logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    rank_zero_logger.addHandler(caplog.handler)
    try:
        samples = [local_module(tmp_path, bpe_sample_size=50, seed=seed)._bpe_sample()[0] for seed in (0, 0, 1)]
        streamed, count = local_module(tmp_path, bpe_sample_size=50, streaming=True)._bpe_sample()
    finally:
        rank_zero_logger.removeHandler(caplog.handler)
    assert len(samples[0]) == 50 and len(set(samples[0]["source_text"])) == 50  # without replacement
    assert samples[0]["source_text"] == samples[1]["source_text"] != samples[2]["source_text"]
    assert "on a sample of 50 pairs of split 'train'" in caplog.text
    # A stream's sample is read as the tokenizer learns, never held: its first 50 pairs after a shuffle.
    assert isinstance(streamed, datasets.IterableDataset) and count == 50 and len(list(streamed)) == 50
    assert "on the first 50 pairs of a shuffled stream of split 'train'" in caplog.text
    # The sentences come in batches of one side of up to 1,000 pairs: a line after each batch that crosses a mark.
    assert "BPE tokenizer: 50 of 100 sentences read" in caplog.text and "100 of 100 sentences read" in caplog.text
    local_module(tmp_path, bpe_sample_size=50, tokenizer_dir=str(tmp_path / "tok"))
    assert json.loads((tmp_path / "tok" / "trained_on.json").read_text())["bpe_sample_size"] == 50
    local_module(tmp_path, bpe_sample_size=1000, tokenizer_dir=str(tmp_path / "all"))
    assert "bpe_sample_size" not in json.loads((tmp_path / "all" / "trained_on.json").read_text())


def test_the_processes_of_a_run_train_the_tokenizer_once(tmp_path):
    """Every process of a run builds the data module; the first to take the tokenizer folder's lock trains and saves,
    the others wait and load what it saved."""
    write_jsonl(tmp_path / "train.jsonl", [{"en": s, "de": t} for s, t in PAIRS * 5])
    write_jsonl(tmp_path / "validation.jsonl", [{"en": s, "de": t} for s, t in PAIRS])
    write_jsonl(tmp_path / "test.jsonl", [{"en": s, "de": t} for s, t in PAIRS])
    script = (
        "import sys; from lightning_modules import TranslationDataModule; "
        f"TranslationDataModule(dataset={str(tmp_path)!r}, source_lang='en', target_lang='de', bpe_vocab_size=100, "
        f"bpe_min_frequency=1, tokenizer_dir={str(tmp_path / 'tok')!r})"
    )
    processes = [
        subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True, env=os.environ.copy())
        for _ in range(2)
    ]
    logs = [process.communicate(timeout=300)[1] for process in processes]
    assert all(process.returncode == 0 for process in processes), logs
    assert sum("BPE tokenizer trained" in log for log in logs) == 1
    assert sum("Loading the tokenizer saved in" in log for log in logs) == 1


def test_a_split_prepared_once_is_read_from_the_cache_by_the_other_processes(tmp_path):
    """`prepare_data` (one process per node) tokenizes into the datasets cache; a data module of another process, or
    of a later run, sets up from that cache without tokenizing again: it writes no cache file of its own."""
    write_jsonl(tmp_path / "train.jsonl", [{"en": s, "de": t} for s, t in PAIRS * 5])
    write_jsonl(tmp_path / "validation.jsonl", [{"en": s, "de": t} for s, t in PAIRS])
    write_jsonl(tmp_path / "test.jsonl", [{"en": s, "de": t} for s, t in PAIRS])
    args = dict(dataset=str(tmp_path), source_lang="en", target_lang="de", bpe_vocab_size=100, bpe_min_frequency=1)
    args |= dict(tokenizer_dir=str(tmp_path / "tok"))
    TranslationDataModule(**args).prepare_data()
    cache = tmp_path / "hf_datasets"  # the `offline_cache` fixture's

    def tokenized() -> dict[Path, int]:
        return {path: path.stat().st_mtime_ns for path in cache.rglob("cache-*.arrow")}

    prepared = tokenized()
    assert len(prepared) == 3  # train, validation, test
    other = TranslationDataModule(**args)
    other.setup()
    assert tokenized() == prepared and len(other.train_dataloader()) > 0


def test_the_caches_of_a_split_hold_few_record_batches(tmp_path):
    """A run holds about 4 KiB of memory for each record batch of the caches it maps (86 MiB at 20 M pairs in
    `datasets`' batches of 1,000 rows): the split read from files and the tokenized split hold 10,000 rows a batch."""
    for split, count in (("train", 2500), ("val", 3), ("test", 3)):
        write_lines(tmp_path / f"{split}.en", [f"{number} small dogs" for number in range(count)])
        write_lines(tmp_path / f"{split}.de", [f"{number} kleine Hunde" for number in range(count)])
    dm = local_module(tmp_path, validation_split="val")
    assert dm.raw_pairs("train").data.column("source_text").num_chunks == 1
    assert dm.train_dataloader().dataset.data.column("input_ids").num_chunks == 1


@pytest.mark.parametrize("block", [None, 4], ids=["one block", "blocks of 4 pairs"])
def test_filtered_pairs_are_counted_and_logged(tmp_path, caplog, monkeypatch, block):
    if block is not None:  # the filter's masks are built a block at a time: the counts and pairs kept do not change
        monkeypatch.setattr(datamodule_module, "_ROWS_PER_FILTER_BLOCK", block)
    long = " ".join(["word"] * 40)
    write_jsonl(tmp_path / "train.jsonl", [{"en": s, "de": t} for s, t in PAIRS * 5 + [("", "leer"), (long, "lang")]])
    write_jsonl(tmp_path / "validation.jsonl", [{"en": s, "de": t} for s, t in PAIRS + [(long, "lang"), ("", "")]])
    write_jsonl(tmp_path / "test.jsonl", [{"en": s, "de": t} for s, t in PAIRS])
    rank_zero_logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    rank_zero_logger.addHandler(caplog.handler)  # Lightning's loggers do not propagate to the root
    try:
        dm = local_module(tmp_path, max_source_positions=20, max_target_positions=20, max_tokens=64)
    finally:
        rank_zero_logger.removeHandler(caplog.handler)
    assert dm.filter_stats["train"] == {
        "pairs": 17,
        "kept": 15,
        "dropped_empty": 1,
        "dropped_too_long": 1,
        "truncated": 0,
    }
    assert dm.filter_stats["validation"] == {
        **{"pairs": 5, "kept": 5, "dropped_empty": 0, "dropped_too_long": 0, "truncated": 1}
    }
    assert "train split 'train': pairs=17, kept=15, dropped_empty=1, dropped_too_long=1" in caplog.text
    training = list(dm.train_dataloader())
    assert sum(len(batch["input_ids"]) for batch in training) == 15
    # Neither the empty source (its end-of-sentence token alone) nor the long one is trained on.
    assert all(batch["input_ids"].shape[1] <= 20 and batch["attention_mask"].sum(1).min() > 1 for batch in training)
    batch = next(iter(dm.val_dataloader()))
    assert batch["input_ids"].shape[1] <= 20 and len(batch["source_text"]) == 5


def test_streamed_and_prepared_training_data_keep_the_same_pairs_in_one_length_order(tmp_path):
    """One split, read ahead and streamed: the same pairs kept (text on both sides, within the positions) and sorted
    by one length order, so packed into batches of the same lengths. Each path had a filter and an order of its own,
    and the stream sorted the targets of odd source lengths ascending where the prepared path sorts them descending."""
    generator = np.random.default_rng(0)
    words = ["a", "dog", "runs", "two", "men", "play", "music", "in", "the", "park", "grass", "women"]

    def sentence(length: int) -> str:
        return " ".join(generator.choice(words, size=length))

    rows = [{"en": sentence(generator.integers(1, 16)), "de": sentence(generator.integers(1, 16))} for _ in range(300)]
    rows += [{"en": "", "de": "leer"}, {"en": "  ", "de": "leer"}, {"en": "empty", "de": "\t"}]
    rows += [{"en": sentence(30), "de": "lang"}, {"en": "long", "de": sentence(30)}]
    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data" / "train.jsonl", [rows[index] for index in generator.permutation(len(rows))])
    for split in ("validation", "test"):
        write_jsonl(tmp_path / "data" / f"{split}.jsonl", rows[:4])
    limits = {"max_source_positions": 20, "max_target_positions": 20, "max_tokens": 120}
    prepared = local_module(tmp_path / "data", tokenizer_dir=str(tmp_path / "tokenizer"), **limits)
    assert prepared.filter_stats["train"] | {"truncated": None} == {
        **{"pairs": 305, "kept": 300, "dropped_empty": 3, "dropped_too_long": 2, "truncated": None}
    }
    loader = prepared.train_dataloader()
    order, starts, ends = loader.batch_sampler.plan_arrays(0)
    ids = loader.dataset[order.tolist()]
    in_order = [(tuple(source), tuple(target)) for source, target in zip(ids["input_ids"], ids["labels"], strict=True)]
    prepared_batches = [in_order[start:end] for start, end in sorted(zip(starts.tolist(), ends.tolist(), strict=True))]
    # The order: by source length, the targets ascending within even source lengths and descending within odd ones.
    keys = [(len(source), len(target) if len(source) % 2 == 0 else -len(target)) for source, target in in_order]
    assert keys == sorted(keys)

    streamed = local_module(tmp_path / "data", tokenizer=str(tmp_path / "tokenizer"), streaming=True, **limits)
    streamed.trainer = pl.Trainer(max_steps=1000, logger=False, enable_checkpointing=False)
    streamed_batches = [
        [(tuple(row["input_ids"]), tuple(row["labels"])) for row in batch]
        for batch in next(streamed.train_dataloader().stream.passes(0))[1]
    ]

    def lengths(batches: list[list[tuple]]) -> list[tuple]:
        return sorted(tuple((len(source), len(target)) for source, target in batch) for batch in batches)

    assert sorted(pair for batch in streamed_batches for pair in batch) == sorted(in_order)
    assert lengths(streamed_batches) == lengths(prepared_batches)


def test_all_training_pairs_dropped_is_an_error(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"en": "one two three four five six", "de": "x"}])
    with pytest.raises(DataError, match="all 1 training pairs were dropped .* raise the limits"):
        local_module(tmp_path, max_source_positions=3, max_target_positions=3, max_tokens=8)


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
    write_lines(tmp_path / "train.en", ["a", "b", "c"])
    write_lines(tmp_path / "train.de.gz", ["a", "b"])
    with pytest.raises(DataError, match=r"train\.en has 3 lines but .*train\.de\.gz has 2"):
        local_module(tmp_path)


def test_a_folder_of_multi30k_raw_files_answers_to_the_hub_copy_split_names(tmp_path):
    """Multi30k's raw release names its splits train, val and test_2016_flickr; its Hub copy (and configs/multi30k.yaml)
    names them train, validation and test: --data.dataset FOLDER alone switches the config to the folder."""
    splits = {"train": PAIRS, "val": PAIRS[:2], "test_2016_flickr": PAIRS[1:]}
    for split, pairs in splits.items():
        write_lines(tmp_path / f"{split}.en.gz", [source for source, _ in pairs])
        write_lines(tmp_path / f"{split}.de.gz", [target for _, target in pairs])
    dm = local_module(tmp_path, validation_split="validation", test_split="test")
    assert pairs_of(dm, "validation") == sorted(PAIRS[:2])
    assert pairs_of(dm, "test") == sorted(PAIRS[1:])


def test_missing_split_says_what_was_looked_for(tmp_path):
    for lang in ("en", "de"):
        write_lines(tmp_path / f"train.{lang}", ["a", "b"])
    with pytest.raises(
        DataError, match=r"split 'val' not found: looked for .*/val\.<lang>\[\.gz\].*splits present: train"
    ):
        local_module(tmp_path, validation_split="val")


def test_missing_file_says_what_was_looked_for(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"en": "a", "de": "b"}])
    with pytest.raises(DataError, match=r"data file not found: looked for .*validation\.jsonl"):
        local_module(tmp_path / "{split}.jsonl")
    with pytest.raises(DataError, match=r"holds only the split 'train'; .* placeholder \(e\.g\. .*/\{split\}\.jsonl\)"):
        local_module(tmp_path / "train.jsonl")


def test_language_not_in_text_folder_lists_those_present(tmp_path):
    for lang in ("en", "de", "fr"):
        write_lines(tmp_path / f"train.{lang}", ["a"])
    with pytest.raises(
        DataError, match="language 'cs' not in the data.*languages present for split 'train': de, en, fr"
    ):
        local_module(tmp_path, target_lang="cs")


def test_language_not_in_table_lists_those_present(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"en": "a", "fr": "b"}])
    with pytest.raises(DataError, match="language 'de' not in the data; languages present: en, fr"):
        local_module(tmp_path)


@pytest.mark.parametrize("name", ["train.en", "train.jsonl"])
def test_empty_split_is_an_error(tmp_path, name):
    (tmp_path / name).write_text("")
    (tmp_path / "train.de").write_text("")
    with pytest.raises(DataError, match="is empty: a split needs at least one pair"):
        local_module(tmp_path)


@pytest.mark.parametrize("name", ["train.de", "train.de.gz", "train.jsonl"])
def test_undecodable_bytes_name_file_and_line(tmp_path, name):
    good = b'{"en": "a", "de": "b"}\n' if name.endswith("jsonl") else b"eins\n"
    bad = b'{"en": "a", "de": "Gr\xfc\xdfe"}\n' if name.endswith("jsonl") else b"Gr\xfc\xdfe\n"
    path = tmp_path / name
    path.write_bytes(gzip.compress(good + bad) if name.endswith(".gz") else good + bad)
    write_lines(tmp_path / "train.en", ["one", "two"])
    with pytest.raises(DataError, match=rf"{name}, line 2: bytes .* are not UTF-8; re-encode"):
        local_module(tmp_path)


NUMBERS = "".join(f"{n} {n * n}\n" for n in range(5000)).encode()  # compresses to 20 kB, not to a few bytes


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        (
            "train.de.gz",
            gzip.compress(NUMBERS, mtime=0)[:5000],
            r"train\.de\.gz is cut short or damaged after line \d+ \(Compressed file ended before the end-of-stream "
            r"marker was reached\): copy or download it again \(gzip -t .*train\.de\.gz checks a file\)$",
        ),
        (
            "train.jsonl.gz",
            gzip.compress(b'{"en": "a", "de": "b"}\n', mtime=0)[:15],
            "is cut short or damaged within its first",
        ),
        ("train.de.gz", b"eins\n", r"train\.de\.gz ends in \.gz but holds no gzip data .*rename it without \.gz"),
        ("train.de", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR", r"train\.de is binary data, not text \(a NUL byte on line 3\)"),
        ("train.jsonl", b"\0\x01\x02\n", r"train\.jsonl is binary data, not text \(a NUL byte on line 1\)"),
        ("train.de", "eins\nzwei\n".encode("utf-16"), r"train\.de is UTF-16 text .*iconv -f utf-16 -t utf-8"),
        ("train.parquet", b"PAR1 and no more", r"could not read .*train\.parquet as parquet \(.*\): write it again"),
    ],
)
def test_a_damaged_or_binary_data_file_is_named_with_the_fix(tmp_path, name, content, expected):
    """A .gz cut short or no gzip at all, binary data, UTF-16 text or a broken parquet file ended in a traceback
    (EOFError, BadGzipFile, ArrowInvalid) or in advice to re-encode Latin-1."""
    (tmp_path / name).write_bytes(content)
    write_lines(tmp_path / "train.en", ["one", "two"])
    with pytest.raises(DataError, match=expected):
        local_module(tmp_path)


def text_splits(folder: Path) -> Path:
    """train/validation/test text files of `PAIRS`, one file per language."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, pairs in (("train", PAIRS * 4), ("validation", PAIRS), ("test", PAIRS)):
        write_lines(folder / f"{split}.en", [source for source, _ in pairs])
        write_lines(folder / f"{split}.de", [target for _, target in pairs])
    return folder


def training_ids(dm: TranslationDataModule) -> list:
    return sorted(str(batch["input_ids"].tolist()) for batch in dm.train_dataloader())


def test_a_damaged_datasets_cache_is_built_again_saying_which(tmp_path):
    """Arrow files of the datasets cache cut short (a copy or a disk that filled): the next run ended in a 55-line
    pyarrow OSError ("Expected to be able to read ... bytes") that named neither the file nor the fix. Each damaged
    cache, of a tokenized split (`cache-*.arrow`) or of a file read (`text-train.arrow`), is built again, with a
    warning naming it, and the data is as before."""
    data = text_splits(tmp_path / "data")
    settings = {"tokenizer_dir": str(tmp_path / "tokenizer")}
    before = local_module(data, **settings)
    expected = training_ids(before), pairs_of(before, "test")
    del before  # its files are memory-mapped: cut short below, they would read as zeros
    for damaged, named in (
        ("cache-*.arrow", {f"split {split!r}, tokenized" for split in ("train", "validation", "test")}),
        ("text-train.arrow", {str(data / f"{split}.{lang}") for split in ("train", "test") for lang in ("en", "de")}),
    ):
        for path in (tmp_path / "hf_datasets").rglob(damaged):
            os.truncate(path, path.stat().st_size // 2)
        with pytest.warns(
            UserWarning, match=r"its copy in the datasets cache was damaged \(.*\); built it again"
        ) as warned:
            after = local_module(data, **settings)
        assert named <= {str(warning.message).split(":")[0] for warning in warned}
        assert (training_ids(after), pairs_of(after, "test")) == expected


def test_a_datasets_cache_or_tokenizer_folder_that_cannot_be_written_is_named_before_any_work(tmp_path, monkeypatch):
    """HF_DATASETS_CACHE naming a file (or on a read-only disk) ended in a traceback from inside `datasets`; a tokenizer
    folder there, in one from the tokenizer folder's mkdir."""
    data = text_splits(tmp_path / "data")
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "file" / "cache")
    with pytest.raises(DataError) as refused:
        local_module(data)
    assert str(refused.value) == (
        f"the datasets cache {tmp_path}/file/cache (HF_DATASETS_CACHE) cannot be written: {tmp_path}/file is not a "
        "folder. Set HF_DATASETS_CACHE to a folder you can write to: the data read and tokenized is kept there"
    )
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    with pytest.raises(DataError, match=rf"^data.tokenizer_dir {tmp_path}/file/tok: cannot write there \("):
        local_module(data, tokenizer_dir=str(tmp_path / "file" / "tok"))
    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only folder: the folder under a file above is the case that runs")
    (tmp_path / "locked").mkdir(mode=0o555)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "locked" / "cache")
    with pytest.raises(DataError, match=f"cannot be written: no permission to write into {tmp_path}/locked"):
        local_module(data)


def test_the_temporary_files_of_a_killed_tokenization_are_removed(tmp_path):
    """`datasets` writes a cache into a temporary file beside it (`tmp` and 8 characters) and renames it when done: a
    kill -9 during the tokenization left that file, as large as the cache it was writing, and nothing removed it."""
    data = text_splits(tmp_path / "data")
    dm = local_module(data)
    folder = Path(dm.raw_pairs("train").cache_files[0]["filename"]).parent
    with tempfile.NamedTemporaryFile("wb", dir=folder, delete=False) as left:  # as `datasets` names it
        left.write(b"\0" * 1000)
    (folder / "notes.txt").write_text("not ours")
    local_module(data)
    assert not Path(left.name).exists() and (folder / "notes.txt").exists()


def test_a_full_disk_under_the_datasets_cache_is_one_line_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    """The tokenization onto a full disk ended in a traceback and left `datasets`' temporary file behind; reading a
    file into the cache said "could not read" the data file."""
    data = text_splits(tmp_path / "data")
    local_module(data, tokenizer_dir=str(tmp_path / "tokenizer"))
    for tokenized in (tmp_path / "hf_datasets").rglob("cache-*.arrow"):  # the splits read stay: tokenize again
        tokenized.unlink()
    written = datasets.arrow_writer.ArrowWriter.write_batch

    def full(self, *args, **kwargs):
        written(self, *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(datasets.arrow_writer.ArrowWriter, "write_batch", full)
    with pytest.raises(DiskFull) as full_disk:
        local_module(data, tokenizer_dir=str(tmp_path / "tokenizer"))
    assert str(full_disk.value).startswith(
        f"no space left on the disk of the datasets cache {tmp_path / 'hf_datasets'} (HF_DATASETS_CACHE) while "
        "writing split 'train', tokenized there ("
    )
    assert not [path for path in (tmp_path / "hf_datasets").rglob("tmp*") if path.is_file()]


def test_missing_field_names_row_and_language(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"en": "a", "de": "b"}, {"en": "c"}])
    with pytest.raises(DataError, match=r"train\.jsonl: row 2 has no text for 'de'"):
        local_module(tmp_path)

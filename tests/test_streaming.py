"""Training from a stream (`data.streaming: true`): every pair once per pass and rank share, batches within the
budget, an endless stream that keeps the ranks in step, a loader that resumes exactly, and the same on two DDP
processes through the command line."""

import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from itertools import islice
from pathlib import Path

import datasets
import huggingface_hub.constants
import lightning.pytorch as pl
import pytest
import torch
from conftest import DEMO

from hf_transformer.errors import DataError
from lightning_modules import TranslationDataModule
from lightning_modules.checkpoint import load_checkpoint
from lightning_modules.data.sources import load_split
from lightning_modules.data.streaming import StreamLoader, TokenBudgetStream, stream_split

WORDS = ["a", "dog", "man", "runs", "on", "the", "grass", "two", "women", "play", "music", "in", "park"]
MAX_TOKENS = 400


@pytest.fixture(autouse=True)
def offline_cache(monkeypatch, tmp_path):
    """A private datasets cache and no network (datasets reads both settings at import: patch its config too)."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_datasets"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_datasets")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def corpus(folder: Path, pairs: int = 300) -> Path:
    """train/validation/test jsonl files of {"en", "de"}, each training pair distinct (its number in both sides)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", pairs), ("validation", 8), ("test", 8)):
        rows = []
        for index in range(count):
            words = " ".join(WORDS[(index * 7 + k) % len(WORDS)] for k in range(1 + index % 9))
            rows.append({"en": f"{words} {index}", "de": f"{index} {words}"})
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def encode(texts: list[str]) -> list[list[int]]:
    """One id per character, and an end-of-sentence id: distinct texts, distinct ids."""
    return [[ord(character) for character in text] + [2] for text in texts]


def stream_of(folder: Path, rank: int = 0, world_size: int = 1, **settings) -> TokenBudgetStream:
    pairs = stream_split(str(folder), None, "train", "en", "de")
    settings = {"shuffle_buffer": 50, "sort_buffer": 64, "seed": 3, **settings}
    return TokenBudgetStream(pairs, encode, MAX_TOKENS, 128, 128, rank=rank, world_size=world_size, **settings)


def sources_of(batches) -> list[str]:
    return [str(row["input_ids"]) for batch in batches for row in batch]


def test_each_pass_gives_every_pair_once_in_batches_within_the_budget(tmp_path):
    stream = stream_of(corpus(tmp_path))
    passes = stream.passes(0)
    first = list(next(passes)[1])
    second = list(next(passes)[1])
    assert len(set(sources_of(first))) == 300 == len(sources_of(second))
    for batch in first:
        longest = max(max(len(row["input_ids"]), len(row["labels"])) for row in batch)
        assert len(batch) * longest <= MAX_TOKENS
    assert [len(batch) for batch in first] != [len(batch) for batch in second]  # the next pass shuffles anew


def test_two_ranks_share_a_pass_between_them_without_a_pair_twice(tmp_path):
    """One file is one shard, which does not divide by two ranks: each takes every other pair, and both streams go on
    forever, so neither waits for the other at the end of its share."""
    folder = corpus(tmp_path)
    shares = [list(next(stream_of(folder, rank=rank, world_size=2).passes(0))[1]) for rank in (0, 1)]
    rows = [(tuple(row["input_ids"]), tuple(row["labels"])) for share in shares for batch in share for row in batch]
    whole = [
        (tuple(row["input_ids"]), tuple(row["labels"]))
        for batch in next(stream_of(folder).passes(0))[1]
        for row in batch
    ]
    assert sorted(rows) == sorted(whole) and len(set(rows)) == 300
    for rank, share in enumerate(shares):
        # Three passes' worth of batches: a stream that ended after its pass would give a third of them.
        endless = list(islice(iter(stream_of(folder, rank=rank, world_size=2)), 3 * len(share)))
        assert len(endless) == 3 * len(share), f"rank {rank}'s stream ended"
        # ... and every pass goes over the same share again: each of its pairs comes at least twice.
        counts = Counter(tuple(row["input_ids"]) for batch in endless for row in batch)
        assert set(counts) == {tuple(row["input_ids"]) for batch in share for row in batch}
        assert min(counts.values()) >= 2, f"rank {rank} did not start a second pass over its share"


def test_a_resumed_loader_continues_with_the_next_batch_of_its_pass(tmp_path):
    folder = corpus(tmp_path)
    uninterrupted = list(islice(iter(StreamLoader(stream_of(folder), list, batches=40)), 40))
    first = StreamLoader(stream_of(folder), list, batches=40)
    seen = list(islice(iter(first), 23))
    state = first.state_dict()
    resumed = StreamLoader(stream_of(folder), list, batches=40)
    resumed.load_state_dict(state)
    assert seen + list(islice(iter(resumed), 17)) == uninterrupted
    assert resumed.state_dict()["ranks"][0]["epoch"] >= 1  # 40 batches reach into the second pass


def test_a_stream_of_text_files_or_of_the_translation_layout_gives_the_same_pairs(tmp_path):
    folder = corpus(tmp_path / "jsonl", pairs=20)
    rows = [json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines()]
    text = tmp_path / "text"
    text.mkdir()
    for lang in ("en", "de"):
        (text / f"train.{lang}").write_text("".join(row[lang] + "\n" for row in rows))
    wmt = tmp_path / "wmt"
    wmt.mkdir()
    (wmt / "train.jsonl").write_text("".join(json.dumps({"translation": row}) + "\n" for row in rows))
    expected = [{"source_text": row["en"], "target_text": row["de"]} for row in rows]
    for source in (folder, text, wmt):
        assert list(stream_split(str(source), None, "train", "en", "de")) == expected


def test_a_stream_of_text_files_splits_lines_at_newlines_only_and_names_files_of_other_lengths(tmp_path):
    """A lone "\r" inside a line (in line 2 of one file and line 4 of the other) ended the line under universal
    newlines and shifted the pairs between; files of different lengths raised a bare ValueError from zip."""
    sources, targets = ["one", "two\rhalves", "three", "four"], ["eins", "zwei", "drei", "vier\rhälften"]
    (tmp_path / "train.en").write_bytes("".join(line + "\r\n" for line in sources).encode())
    (tmp_path / "train.de").write_bytes("".join(line + "\n" for line in targets).encode())
    expected = [{"source_text": source, "target_text": target} for source, target in zip(sources, targets, strict=True)]
    assert list(stream_split(str(tmp_path), None, "train", "en", "de")) == expected
    (tmp_path / "train.de").write_bytes("".join(line + "\n" for line in targets[:3]).encode())
    with pytest.raises(DataError, match=r"train\.de has 3 lines but .*train\.en has more"):
        list(stream_split(str(tmp_path), None, "train", "en", "de"))


NUMBERS = gzip.compress(b"".join(b"%d\n" % number for number in range(5000)), mtime=0)
BAD_FILES = {
    "not UTF-8": {"train.en": b"one\ntwo\n", "train.de": b"eins\nGr\xfc\xdfe\n"},
    "binary": {"train.en": b"one\ntwo\n", "train.de": b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"},
    "UTF-16": {"train.en": b"one\ntwo\n", "train.de": "eins\nzwei\n".encode("utf-16")},
    "empty": {"train.en": b"", "train.de": b""},
    "no gzip": {"train.en": b"one\ntwo\n", "train.de.gz": b"eins\nzwei\n"},
    "gzip cut short": {"train.en": b"one\n" * 5000, "train.de.gz": NUMBERS[:5000]},
    "jsonl not UTF-8": {"train.jsonl": b'{"en": "a", "de": "b"}\n{"en": "a", "de": "Gr\xfc\xdfe"}\n'},
    "jsonl binary": {"train.jsonl": b"\0\x01\x02\n"},
    "jsonl empty": {"train.jsonl": b""},
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_streamed_file_that_cannot_be_read_is_named_as_when_read_ahead(tmp_path, case):
    """One reader rule for both paths: a streamed training file that is not UTF-8 text, binary, UTF-16, empty or a
    damaged .gz is refused with the one-line message of a read ahead, naming the file (and the line). A stream ended
    in UnicodeDecodeError, BadGzipFile, ArrowInvalid or StopIteration from inside the readers, or read no pair."""
    for name, content in BAD_FILES[case].items():
        (tmp_path / name).write_bytes(content)
    with pytest.raises(DataError) as read_ahead:
        load_split(str(tmp_path), None, "train", "en", "de")
    with pytest.raises(DataError) as streamed:
        list(stream_split(str(tmp_path), None, "train", "en", "de"))
    assert str(streamed.value) == str(read_ahead.value)
    assert str(tmp_path / "train.") in str(streamed.value) and "\n" not in str(streamed.value)


@contextlib.contextmanager
def within(seconds: int):
    """Fail the block after `seconds` instead of waiting forever (the stream of no batches never ended)."""

    def hung(number, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def streamed_module(folder: Path, **settings) -> TranslationDataModule:
    settings = {"source_lang": "en", "target_lang": "de", "bpe_vocab_size": 100, "bpe_min_frequency": 1, **settings}
    return TranslationDataModule(dataset=str(folder), streaming=True, **settings)


def test_a_stream_of_blank_pairs_is_refused_before_training(tmp_path):
    """Files of blank lines: the tokenizer was trained on no text without a word, then `fit` printed `Training from
    step 0` and waited for a batch forever. The same folder read ahead stops too."""
    corpus(tmp_path)
    for lang in ("en", "de"):
        (tmp_path / f"train.{lang}").write_text("\n  \n\t\n")
    (tmp_path / "train.jsonl").unlink()
    with within(120), pytest.raises(DataError) as refused:
        streamed_module(tmp_path, tokenizer_dir=str(tmp_path / "tokenizer"))
    assert str(refused.value).startswith(
        f"the first 1,000,000 pairs of a shuffled stream of split 'train' of {tmp_path}"
    )
    assert "no sentence holds text (3 pairs read, all blank)" in str(refused.value)
    assert not (tmp_path / "tokenizer" / "tokenizer.json").exists()


def test_a_pass_of_a_stream_that_keeps_no_pair_stops_naming_the_split_and_why(tmp_path):
    """Every pair longer than the positions: the stream read pass after pass and gave no batch, forever."""
    corpus(tmp_path)
    settings = {"max_source_positions": 3, "max_target_positions": 3, "max_tokens": 64, "eval_max_tokens": 64}
    data = streamed_module(tmp_path, **settings)
    data.trainer = pl.Trainer(max_steps=10, logger=False, enable_checkpointing=False)
    with within(120), pytest.raises(DataError) as refused:
        next(iter(data.train_dataloader()))
    assert str(refused.value) == (
        f"split 'train' of {tmp_path}, streamed: all 300 training pairs were dropped (0 with an empty side, 300 longer "
        "than max_source_positions=3/max_target_positions=3 tokens); raise the limits or check the languages"
    )


@pytest.mark.parametrize(
    ("setting", "value", "rule"),
    [
        ("stream_buffer", 0, "must be at least 1: the pairs a stream shuffles and sorts at a time"),
        ("num_workers", -1, "must be at least 0"),
        ("max_sentences", 0, "must be at least 1, or null for no limit"),
        ("bpe_vocab_size", 3, "must be larger than the 4 special tokens"),
        ("eval_max_tokens", 8, "is smaller than max_source_positions=256"),
    ],
)
def test_every_data_setting_is_checked_before_any_work(tmp_path, setting, value, rule):
    """`--data.stream_buffer 0` was accepted and trained on no batch, forever; the others failed once the data was
    read and tokenized (a DataLoader's ValueError, a sampler's error)."""
    corpus(tmp_path)
    with pytest.raises(DataError, match=f"^data.{setting}={value} {rule}|^{setting}={value} {rule}"):
        streamed_module(tmp_path, tokenizer_dir=str(tmp_path / "tokenizer"), **{setting: value})
    assert not (tmp_path / "tokenizer").exists()


def train(run_dir: Path, streaming: bool, *overrides: str) -> subprocess.CompletedProcess:
    """`hf-transformer fit` on two CPU DDP processes (a subprocess: Lightning starts the second rank by running the
    command again)."""
    command = [sys.executable, "-m", "lightning_modules.cli", "fit", "--config", str(DEMO), "--config", "tiny.yaml"]
    command += ["--data.dataset", str(run_dir / "data"), "--data.source_lang=en", "--data.target_lang=de"]
    command += [f"--data.streaming={streaming}", "--data.stream_buffer=64", "--data.bpe_vocab_size=120"]
    command += ["--data.max_tokens=128", "--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp"]
    command += ["--trainer.limit_val_batches=1", *overrides]
    return subprocess.run(command, capture_output=True, text=True, cwd=run_dir, env=os.environ.copy(), timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("streaming", [True, False], ids=["streamed", "prepared"])
def test_two_ddp_processes_resume_exactly(run_dir, streaming):
    """Three steps, then three more after a resume, end with the weights of six in one go: each rank continues its
    own share of the data and its own random numbers (its dropout masks), which rank 0's checkpoint holds for all."""
    corpus(run_dir / "data")
    for overrides in (
        ["--trainer.max_steps=6", "--trainer.default_root_dir=uninterrupted"],
        ["--trainer.max_steps=3"],
        ["--trainer.max_steps=6", "--ckpt_path=last"],
    ):
        result = train(run_dir, streaming, *overrides)
        assert result.returncode == 0, result.stderr[-3000:]
    resumed = load_checkpoint(run_dir / "runs/demo/checkpoints/last.ckpt")
    uninterrupted = load_checkpoint(run_dir / "uninterrupted/checkpoints/last.ckpt")
    assert resumed["global_step"] == uninterrupted["global_step"] == 6
    for name, tensor in uninterrupted["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][name], tensor, atol=0, rtol=0, msg=name)

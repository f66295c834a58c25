"""Training from a stream (`data.streaming: true`): every pair once per pass and rank share, batches within the
budget, an endless stream that keeps the ranks in step, a loader that resumes exactly, and the same on two DDP
processes through the command line."""

import json
import os
import subprocess
import sys
from collections import Counter
from itertools import islice
from pathlib import Path

import datasets
import huggingface_hub.constants
import pytest
import torch
from conftest import DEMO

from hf_transformer.errors import DataError
from lightning_modules.checkpoint import load_checkpoint
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

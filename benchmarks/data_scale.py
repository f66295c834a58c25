"""How preparing a corpus scales: synthetic parallel corpora on disk of growing size, prepared by
`TranslationDataModule` as a run prepares them, phase by phase, in a fresh process per measurement.

    python benchmarks/data_scale.py --sizes 200000 1000000 4500000 20000000 [--ddp]

For each size it writes a corpus (`train.en`, `train.de`, 1,000 validation and test pairs; sentence lengths drawn
around 25 tokens, a vocabulary that grows with the corpus), then measures, each in a new process:

- first run: reading the corpus, training the tokenizer (on `data.bpe_sample_size` pairs), tokenizing every split
  (`prepare_data`), building the epoch's batch plan, the first batch; peak memory, resident (with the pages of the
  memory-mapped data read) and anonymous (what the run holds itself); the size of the cache;
- tokenization: the data module's pairs/s next to the `tokenizers` library's own `encode_batch` (and
  `encode_batch_fast`, which the data module calls) on the same sentences (the first `--tokenization-pairs`), in
  alternating rounds, each ratio their median;
- second run of the same data (the tokenizer and the tokenized splits cached): the time to the first batch;
- with `--ddp`, `hf-transformer fit` on two CPU processes for one step: each rank's time to its first step and peak
  memory;
- streaming (`data.streaming`): the tokenizer learnt from the stream's first `bpe_sample_size` pairs, the time to the
  first batch, then the steady batches/s and target tokens/s of the loader over `--stream-batches` batches (enough to
  read, tokenize and pack several buffers, not only to hand out the first one's batches), its peak memory; and a
  second run's time to its first batch (the tokenizer cached).

`--measure` names what to measure (prepare, tokenization, rerun, streaming). With `--work`, each size's corpus and
tokenizer stay in `WORK/<pairs>/` and are reused by a later call; the JSON keeps what an earlier call measured and is
not measured again.

Results go to `benchmarks/results/data_scale.json` and a plot beside it.
"""

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from itertools import islice
from pathlib import Path

import lightning.pytorch as pl
import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
EVAL_PAIRS = 1_000


def vocabulary(size: int, seed: int) -> np.ndarray:
    """`size` distinct made-up words of consonant-vowel syllables, so that BPE finds subwords as in real text."""
    generator = np.random.default_rng(seed)
    syllables = np.array([c + v for c in "bcdfghklmnprstvz" for v in "aeiou"])
    words: set[str] = set()
    while len(words) < size:
        counts = generator.integers(1, 5, size=size)
        parts = syllables[generator.integers(len(syllables), size=int(counts.sum()))]
        words.update("".join(word) for word in np.split(parts, np.cumsum(counts)[:-1]))
    return generator.permutation(sorted(words)[:size])  # the frequent words are not the alphabetically first


def half_sentences(words: np.ndarray, lengths: np.ndarray, generator: np.random.Generator) -> list[str]:
    """Sentences of these lengths, of Zipf-distributed words (the word of rank r drawn with weight 1/r)."""
    cumulative = np.cumsum(1 / np.arange(1, len(words) + 1))
    drawn = words[np.searchsorted(cumulative, generator.random(int(lengths.sum())) * cumulative[-1])]
    return [" ".join(sentence) for sentence in np.split(drawn, np.cumsum(lengths)[:-1])]


def write_corpus(folder: Path, pairs: int, seed: int = 0) -> None:
    """Line-aligned `{split}.en` and `{split}.de`. Each line joins two halves drawn from a pool of up to 500,000
    half-sentences per language (aligned across the languages, of about the same length), so that a corpus of
    millions of pairs is written in a minute and still has a distinct line almost everywhere. The words are
    Zipf-distributed over a vocabulary of 30 * sqrt(pairs) words per language (it grows with the corpus); sentence
    lengths come out around 25 words, the tail cut at 120."""
    folder.mkdir(parents=True, exist_ok=True)
    generator = np.random.default_rng(seed)
    halves = min(pairs, 500_000)
    lengths = np.clip(generator.lognormal(2.4, 0.5, halves).astype(int), 1, 60)
    pools = {}
    for index, lang in enumerate(("en", "de")):
        noise = generator.integers(-1, 2, halves) if lang == "de" else 0
        words = vocabulary(int(30 * pairs**0.5), seed=index)
        pools[lang] = half_sentences(words, np.clip(lengths + noise, 1, 60), generator)
    for split, count in (("train", pairs), ("val", EVAL_PAIRS), ("test", EVAL_PAIRS)):
        with open(folder / f"{split}.en", "w", encoding="utf-8") as en, open(folder / f"{split}.de", "w") as de:
            for start in range(0, count, 1_000_000):
                size = min(1_000_000, count - start)
                first, second = generator.integers(halves, size=size), generator.integers(halves, size=size)
                for lang, file in (("en", en), ("de", de)):
                    pool = pools[lang]
                    file.write("".join(f"{pool[a]} {pool[b]} .\n" for a, b in zip(first, second, strict=True)))


def peak_memory_mib() -> float:
    """This process's peak resident memory (Linux reports KiB, macOS bytes). It counts the pages of memory-mapped
    files that the process read, which the system takes back when it needs them: see `AnonymousPeak`."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**20 if sys.platform == "darwin" else 2**10)


class AnonymousPeak:
    """The peak of this process's anonymous resident memory (`RssAnon` of /proc/self/status, sampled every 50 ms on
    Linux): what the run holds itself, without the pages of the memory-mapped data it has read."""

    def __init__(self) -> None:
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        status = Path("/proc/self/status")
        while not self._stop.wait(0.05) and status.exists():
            for line in status.read_text().splitlines():
                if line.startswith("RssAnon:"):
                    self.peak_kib = max(self.peak_kib, int(line.split()[1]))

    def stop(self) -> float | None:
        """The peak in MiB (None where /proc/self/status is not)."""
        self._stop.set()
        self._thread.join()
        return self.peak_kib / 2**10 if self.peak_kib else None


def prepare(folder: str, work: str) -> dict:
    """One run's preparation of the corpus in `folder`, phase by phase (run in a fresh process)."""
    anonymous = AnonymousPeak()
    started = time.perf_counter()
    from lightning_modules import TranslationDataModule
    from lightning_modules.data.datamodule import _encode_pairs  # noqa: F401  (imported before the clock starts)

    phases = {"import": time.perf_counter() - started}
    args = dict(dataset=folder, source_lang="en", target_lang="de", validation_split="val", test_split="test")
    args |= dict(tokenizer_dir=str(Path(work) / "tokenizer"), bpe_vocab_size=32000, max_tokens=8192)
    clock = time.perf_counter()
    from lightning_modules.data.sources import load_split

    load_split(folder, None, "train", "en", "de")  # read into the datasets cache (the first time) or mapped from it
    phases["read"] = time.perf_counter() - clock
    clock = time.perf_counter()
    data = TranslationDataModule(**args)
    phases["tokenizer"] = time.perf_counter() - clock
    clock = time.perf_counter()
    data.prepare_data()
    phases["tokenize"] = time.perf_counter() - clock
    clock = time.perf_counter()
    data.setup("fit")
    loader = data.train_dataloader()
    batches = len(loader)
    phases["plan"] = time.perf_counter() - clock
    clock = time.perf_counter()
    next(iter(loader))
    phases["first_batch"] = time.perf_counter() - clock
    return {
        "phases_s": phases,
        "to_first_batch_s": time.perf_counter() - started,
        "batches": batches,
        "peak_memory_mib": peak_memory_mib(),
        "peak_anonymous_memory_mib": anonymous.stop(),
    }


def stream(folder: str, work: str, batches: int) -> dict:
    """A streamed run's loader (`data.streaming`), in a fresh process: the tokenizer (learnt from the stream the
    first time, read from `work` later), the first batch, then `batches` more: batches/s and target tokens/s."""
    anonymous = AnonymousPeak()
    started = time.perf_counter()
    from types import SimpleNamespace

    from lightning_modules import TranslationDataModule

    args = dict(dataset=folder, source_lang="en", target_lang="de", validation_split="val", test_split="test")
    args |= dict(tokenizer_dir=str(Path(work) / "stream_tokenizer"), bpe_vocab_size=32000, max_tokens=8192)
    clock = time.perf_counter()
    data = TranslationDataModule(**args, streaming=True)
    phases = {"tokenizer": time.perf_counter() - clock}
    clock = time.perf_counter()
    # The loader's length is the run's updates, read from its trainer; there is none here.
    data.trainer = SimpleNamespace(
        max_steps=batches + 1, accumulate_grad_batches=1, global_rank=0, world_size=1, loggers=[]
    )
    data.setup("fit")
    loader = iter(data.train_dataloader())
    next(loader)
    phases["first_batch"] = time.perf_counter() - clock
    to_first_batch = time.perf_counter() - started
    clock, target_tokens = time.perf_counter(), 0
    for batch in islice(loader, batches):
        target_tokens += int((batch["labels"] != -100).sum())
    steady = time.perf_counter() - clock
    return {
        "phases_s": phases,
        "to_first_batch_s": to_first_batch,
        "batches": batches,
        "batches_per_s": batches / steady,
        "target_tokens_per_s": target_tokens / steady,
        "peak_anonymous_memory_mib": anonymous.stop(),
    }


def tokenization(folder: str, work: str, pairs: int, rounds: int) -> dict:
    """The data module's tokenization of the first `pairs` training pairs (`datasets.map` into a new cache file, as a
    first run does) against the `tokenizers` library's own `encode_batch` on the same sentences in the same batches
    (the pipeline's, one call a side), with the tokenizer the run trained: the limit of any pipeline built on it; and
    against `encode_batch_fast`, which the pipeline calls (no character offsets), the limit of this one. The three
    alternate for `rounds` rounds, so that each sees the machine as it is at the time; each ratio is the median of the
    rounds' ratios."""
    import statistics

    import datasets

    from lightning_modules import TranslationDataModule
    from lightning_modules.data.sources import ROWS_PER_CACHE_BATCH

    datasets.disable_caching()  # every round maps anew, into a temporary cache file
    datasets.disable_progress_bars()
    args = dict(dataset=folder, source_lang="en", target_lang="de", validation_split="val", test_split="test")
    data = TranslationDataModule(**args, tokenizer_dir=str(Path(work) / "tokenizer"), bpe_vocab_size=32000)
    sample = data.raw_pairs("train").select(range(pairs))
    tokenizer = data.tokenizer.backend_tokenizer
    sides = [sample["source_text"], sample["target_text"]]

    def library(encode: Callable[[list[str]], list]) -> None:
        for start in range(0, pairs, ROWS_PER_CACHE_BATCH):
            for side in sides:
                encode(side[start : start + ROWS_PER_CACHE_BATCH])

    measured = {
        "ours": lambda: data._tokenize("train", sample, keep_text=False),
        "encode_batch": lambda: library(tokenizer.encode_batch),
        "encode_batch_fast": lambda: library(tokenizer.encode_batch_fast),
    }
    rates: dict[str, list[float]] = {name: [] for name in measured}
    for _ in range(rounds):
        for name, timed in measured.items():
            started = time.perf_counter()
            timed()
            rates[name].append(pairs / (time.perf_counter() - started))
    result = {"pairs": pairs} | {f"{name}_pairs_per_s": rate for name, rate in rates.items()}
    for reference in ("encode_batch", "encode_batch_fast"):
        ratios = [ours / other for ours, other in zip(rates["ours"], rates[reference], strict=True)]
        result[f"ratio_to_{reference}"] = statistics.median(ratios)
    return result


def in_fresh_process(function: str, *args: str | int) -> dict:
    """`function(*args)` of this file in a new Python process (its own peak memory, nothing cached in memory)."""
    code = f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import data_scale; "
    code += f"print(json.dumps(data_scale.{function}(*{args!r})))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"{function} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def ddp_first_step(folder: str, work: str) -> dict:
    """`hf-transformer fit` on two CPU processes for one step of a tiny model: wall time and each rank's peak
    memory at its first step (`FirstStep`, below)."""
    root = Path(work) / "ddp"
    shutil.rmtree(root, ignore_errors=True)  # a run of its own, not the resumption of an earlier call's
    command = [sys.executable, "-m", "lightning_modules.cli", "fit", "--data.dataset", folder]
    command += ["--data.source_lang=en", "--data.target_lang=de", "--data.validation_split=val"]
    command += ["--data.test_split=test", f"--data.tokenizer_dir={Path(work) / 'tokenizer'}"]
    command += ["--data.bpe_vocab_size=32000", "--data.max_tokens=8192", "--trainer.max_steps=1"]
    command += ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp"]
    command += [
        "--trainer.num_sanity_val_steps=0",
        "--trainer.limit_val_batches=0",
        f"--trainer.default_root_dir={root}",
    ]
    command += [
        "--model.config={d_model: 32, encoder_layers: 1, decoder_layers: 1, encoder_attention_heads: 2, "
        "decoder_attention_heads: 2, encoder_ffn_dim: 64, decoder_ffn_dim: 64, max_position_embeddings: 256}"
    ]
    command += ["--trainer.callbacks+=data_scale.FirstStep", f"--trainer.callbacks.out={root / 'first_step'}"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    started = time.time()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode:
        raise SystemExit(f"hf-transformer fit on two processes failed:\n{result.stderr[-3000:]}")
    ranks = [json.loads(path.read_text()) for path in sorted(root.glob("first_step.*.json"))]
    return {"wall_s": time.time() - started, "ranks": ranks, "started": started}


class FirstStep(pl.Callback):
    """Writes, at a rank's first training batch, its wall clock time and peak memory to `{out}.{rank}.json`."""

    def __init__(self, out: str) -> None:
        self.out = out

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx: int) -> None:
        if batch_idx == 0:
            record = {"rank": trainer.global_rank, "time": time.time(), "peak_memory_mib": peak_memory_mib()}
            Path(f"{self.out}.{trainer.global_rank}.json").write_text(json.dumps(record))


def code_version() -> str:
    """The commit of this checkout (with "+changes" where its files other than the results differ from it), or
    "unknown" outside git."""
    try:
        git = ["git", "-C", str(Path(__file__).parent)]
        commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        changed = subprocess.run(
            # The exclusion is relative to this folder, where git runs.
            [*git, "status", "--porcelain", "--untracked-files=no", "--", ":/", f":!{RESULTS.name}"],
            capture_output=True,
            text=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit.stdout.strip() + ("+changes" if changed.stdout.strip() else "")


def folder_size_mib(folder: Path) -> float:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[200_000, 1_000_000, 4_500_000, 20_000_000])
    parser.add_argument("--tokenization-pairs", type=int, default=200_000, help="pairs tokenized by each side")
    parser.add_argument("--tokenization-rounds", type=int, default=5, help="rounds, each side timed once a round")
    parser.add_argument("--ddp", action="store_true", help="also time hf-transformer fit on two CPU processes")
    parser.add_argument("--work", default=None, help="where the corpora and caches go (default: a temporary folder)")
    parser.add_argument("--out", default=str(RESULTS / "data_scale.json"))
    parser.add_argument(
        "--measure",
        choices=["prepare", "tokenization", "rerun", "streaming"],
        nargs="+",
        default=["prepare", "tokenization", "streaming"],
        help="rerun: the second run (and --ddp) alone, on the cache that an earlier call left in --work",
    )
    parser.add_argument(
        "--stream-batches", type=int, default=1500, help="batches timed for streaming's steady rate (several buffers)"
    )
    args = parser.parse_args()
    out = Path(args.out)
    # Sizes and measurements of an earlier call stay, unless measured again.
    report = json.loads(out.read_text()) if out.exists() else {"sizes": []}
    report["cpus"] = os.cpu_count()
    entries = {entry["pairs"]: entry for entry in report["sizes"]}
    with contextlib.ExitStack() as stack:
        root = Path(args.work) if args.work else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        for size in args.sizes:
            work = root / str(size)
            corpus = work / "corpus"
            entry = entries.setdefault(size, {"pairs": size})
            if not corpus.exists():
                started = time.perf_counter()
                # Written beside, then renamed: a write cut short never passes for a corpus.
                shutil.rmtree(work / "corpus.partial", ignore_errors=True)
                write_corpus(work / "corpus.partial", size)
                (work / "corpus.partial").rename(corpus)
                entry |= {"corpus_mib": folder_size_mib(corpus), "write_s": time.perf_counter() - started}
            os.environ["HF_DATASETS_CACHE"] = str(work / "datasets_cache")
            if "prepare" in args.measure:
                entry |= measure_prepared(corpus, work, args)
            if "tokenization" in args.measure:
                pairs = min(size, args.tokenization_pairs)
                entry["tokenization"] = in_fresh_process(
                    "tokenization", str(corpus), str(work), pairs, args.tokenization_rounds
                )
            if "rerun" in args.measure:
                entry["second_run"] = in_fresh_process("prepare", str(corpus), str(work))
                if args.ddp:
                    entry["ddp_2_processes"] = ddp_first_step(str(corpus), str(work))
            # The code each measurement ran, as rows of one table may come from calls at different commits.
            commits = entry.setdefault("commits", {})
            if "prepare" in args.measure:
                commits.pop("rerun", None)  # prepare measures the second run (and DDP) again
            commits.update(dict.fromkeys(args.measure, code_version()))
            if "streaming" in args.measure:
                shutil.rmtree(work / "stream_tokenizer", ignore_errors=True)
                entry["streaming"] = {
                    "first_run": in_fresh_process("stream", str(corpus), str(work), args.stream_batches),
                    "second_run": in_fresh_process("stream", str(corpus), str(work), args.stream_batches),
                }
            print(json.dumps(entry, indent=1), flush=True)
            report["sizes"] = sorted(entries.values(), key=lambda entry: entry["pairs"])
            out.write_text(json.dumps(report, indent=2) + "\n")  # after each size: a long run keeps what it measured
    plot(report, out.with_suffix(".png"))
    print(f"Written to {out}")


def measure_prepared(corpus: Path, work: Path, args: argparse.Namespace) -> dict:
    """The prepared path's measurements of one corpus: first and second run, and (with `--ddp`) two DDP processes."""
    for cached in (work / "datasets_cache", work / "tokenizer"):  # a first run starts from nothing
        shutil.rmtree(cached, ignore_errors=True)
    entry = {"first_run": in_fresh_process("prepare", str(corpus), str(work))}
    entry["cache_mib"] = folder_size_mib(work / "datasets_cache")
    # A later run finds the cache on disk, not in the middle of being written back to it (gigabytes of dirty pages
    # that the kernel's writeback throttles every reader behind).
    os.sync()
    entry["second_run"] = in_fresh_process("prepare", str(corpus), str(work))
    if args.ddp:
        entry["ddp_2_processes"] = ddp_first_step(str(corpus), str(work))
    return entry


def plot(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [entry["pairs"] for entry in report["sizes"]]
    figure, (times, memory) = plt.subplots(1, 2, figsize=(11, 4))
    for phase in ("read", "tokenizer", "tokenize", "plan", "first_batch"):
        times.plot(sizes, [entry["first_run"]["phases_s"][phase] for entry in report["sizes"]], "o-", label=phase)
    times.plot(sizes, [entry["second_run"]["to_first_batch_s"] for entry in report["sizes"]], "k--", label="second run")
    times.set(xscale="log", yscale="log", xlabel="training pairs", ylabel="seconds", title="Preparing a corpus")
    times.legend()
    for run, key, label in (
        ("first_run", "peak_anonymous_memory_mib", "first run, anonymous"),
        ("first_run", "peak_memory_mib", "first run, resident"),
        ("second_run", "peak_anonymous_memory_mib", "second run, anonymous"),
    ):
        memory.plot(sizes, [entry[run][key] for entry in report["sizes"]], "o-", label=label)
    memory.set(xscale="log", xlabel="training pairs", ylabel="MiB", title="Peak memory")
    memory.legend()
    figure.tight_layout()
    figure.savefig(out, dpi=110)


if __name__ == "__main__":
    main()

"""Translating on a CPU: `translate()` in float32 and in int8 (`translate(int8=True)`: int8 weights in the linear
layers) against CTranslate2 float32 and int8, on Multi30k test_2016_flickr (English -> German), beam 4, length penalty
0.6, on 1 and 2 threads: sentences/s, target tokens/s, BLEU, agreement with `translate()` float32, memory.

Each speed means of `translate()` is measured alone: int8 weights (`translate() int8` against `translate() float32`),
the incremental decoding step of `hf_transformer/decoding/incremental.py` (`translate() int8` against
`translate() int8, forward() per step`, `incremental=False`: the model's forward() at every step, as `generate()`),
and a lexical shortlist (`translate() int8 + shortlist` against `translate() int8`), learnt from Multi30k's training
pairs as `hf-transformer shortlist` learns it. CTranslate2 decodes with the same shortlist as its vocabulary map
(`ctranslate2 int8 + shortlist`, `use_vmap`), which it applies per batch: the union of the batch's lists.

    MULTI30K_DIR=../shared/data/multi30k python benchmarks/deploy.py multi30k --model exports/multi30k
    MULTI30K_DIR=../shared/data/multi30k python benchmarks/deploy.py base --limit 100

Two sizes, each written into its own entry of the results (`sizes`):

- `multi30k`: `--model`, a folder written by `hf-transformer export` (the Multi30k recipe's model). Every engine
  decodes every sentence with at most its length + 50 output tokens.
- `base`: the paper's base size (d_model 512, 6 + 6 layers, 8 heads, d_ff 2048) over a 32,000-token BPE vocabulary of
  Multi30k, untrained (seed 0), its output lengths fixed: the row of </s> in the tied embedding is zero, so that </s>
  never ranks among the best candidates of a random model and every engine decodes exactly the source's length in
  tokens (`max_length_offset` 0), as a real translation of about its source's length would. Its translations mean
  nothing: their agreement with `translate()` float32 is reported, not BLEU.

Each engine runs in a process of its own (its threads and memory shared with no other engine), loaded once and warmed
up on a few sentences; the engines take turns in each round, the order reversed every other round, and the table
reports the medians of the rounds: the machine's load drifts, so read the ratios. Target tokens are the outputs' tokens
(</s> included) as the model's tokenizer encodes the output text, the same count for every engine. Memory: what
loading the engine added to its process's resident memory, and the most it held above the process's start (VmHWM),
translating included; the libraries every engine imports (torch, transformers, ctranslate2) are left out of both.

ONNX Runtime is not among the engines: this package's ONNX export is of fixed shapes (a traced batch size and
source length, a static cache) and runs greedy `generate()` through transformers' `ExportedModel`, with no beam search
over length-sorted batches, so it cannot decode this benchmark's batches as the others do.
"""

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

import ctranslate2
import torch
from multi30k import multi30k_dir, read_split
from sacrebleu.metrics import BLEU
from speed import print_table
from transformers import PreTrainedTokenizerFast

from hf_transformer import TransformerConfig, TransformerForConditionalGeneration, translate
from hf_transformer.decoding.ctranslate2 import CTranslate2Translator
from hf_transformer.decoding.int8 import quantize_int8
from hf_transformer.decoding.shortlist import Shortlist, build_shortlist
from hf_transformer.export.ctranslate2 import to_ctranslate2

RESULTS = Path(__file__).resolve().parent / "results" / "deploy.json"
PAPER = dict(num_beams=4, length_penalty=0.6)
BASE_VOCABULARY = 32000
WARM_UP_SENTENCES = 32
# Our engines: the settings `translate()` gets besides the paper's, and whether the model holds int8 weights.
OURS = {
    "translate() float32": ({}, False),
    "translate() int8": ({}, True),
    "translate() int8, forward() per step": ({"incremental": False}, True),
    "translate() int8 + shortlist": ({"shortlist": True}, True),
}
# CTranslate2's engines: the weight type of the folder and whether it decodes with the shortlist (its vocabulary map).
CTRANSLATE2 = {
    "ctranslate2 float32": ("float32", False),
    "ctranslate2 int8": ("int8", False),
    "ctranslate2 int8 + shortlist": ("int8", True),
}
# Between two engines' turns: the threads of the one before stop spinning (OpenMP waits actively for a while).
PAUSE_SECONDS = 0.5


def status_kib(field: str) -> int:
    """A memory field of /proc/self/status (VmRSS, VmHWM), in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def base_model_and_tokenizer() -> tuple[TransformerForConditionalGeneration, PreTrainedTokenizerFast]:
    """The untrained base-size model over a 32,000-token BPE vocabulary of Multi30k's training text, </s> never chosen
    (its output row zero): see the module's docstring."""
    from lightning_modules.data.tokenization import train_bpe_tokenizer

    texts = [read_split("train", "en") + read_split("train", "de")]
    tokenizer = train_bpe_tokenizer(texts, vocab_size=BASE_VOCABULARY, min_frequency=0)
    # Multi30k has fewer distinct merges than 32,000: the rest are tokens of their own, as a bigger corpus would add.
    missing = BASE_VOCABULARY - len(tokenizer)
    tokenizer.add_tokens([f"<filler_{index}>" for index in range(missing)])
    torch.manual_seed(0)
    model = TransformerForConditionalGeneration(TransformerConfig(vocab_size=len(tokenizer))).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight[model.config.eos_token_id] = 0.0  # tied with the output projection
    return model, tokenizer


def build_training_shortlist(tokenizer: PreTrainedTokenizerFast, config: TransformerConfig) -> Shortlist:
    """The shortlist of Multi30k's training pairs (English -> German), as `hf-transformer shortlist` learns it."""
    sources = tokenizer(read_split("train", "en"), add_special_tokens=False).input_ids
    targets = tokenizer(read_split("train", "de"), add_special_tokens=False).input_ids
    return build_shortlist(list(zip(sources, targets, strict=True)), config.vocab_size, always=[config.eos_token_id])


def serve_engine(
    connection: Connection, name: str, folder: str, settings: dict, threads: int, warm_up: list[str]
) -> None:
    """One engine in a process of its own, so that no other engine's threads or memory share it: it loads the
    model from `folder` (ours, or a CTranslate2 folder), translates `warm_up`, sends the resident memory that loading
    added, then translates each list of sentences it receives, sending back the seconds and the translations, until
    None, when it sends the most memory it held above what the process held before loading (VmHWM)."""
    torch.set_num_threads(threads)
    before = status_kib("VmRSS")
    if name in CTRANSLATE2:
        vocabulary_map = CTRANSLATE2[name][1]
        translator = CTranslate2Translator(folder, vocabulary_map, device="cpu", intra_threads=threads)

        def run(batch: list[str]) -> list[str]:
            return translator(batch, **settings)
    else:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
        model = TransformerForConditionalGeneration.from_pretrained(folder).eval()
        options, int8 = OURS[name]
        if int8:
            model = quantize_int8(model, inplace=True)  # as `TranslationEngine(int8=True)` loads it
        if options.get("shortlist"):
            options = dict(options, shortlist=Shortlist.from_pretrained(folder))

        def run(batch: list[str]) -> list[str]:
            return translate(model, tokenizer, batch, **settings, **options)

    run(warm_up)  # first calls allocate and pick kernels
    connection.send((status_kib("VmRSS") - before) / 1024)
    while (sentences := connection.recv()) is not None:
        start = time.perf_counter()
        translations = run(sentences)
        connection.send((time.perf_counter() - start, translations))
    connection.send((status_kib("VmHWM") - before) / 1024)


def measure(
    folders: dict[str, str], settings: dict, threads: int, sources: list[str], repeats: int
) -> tuple[dict[str, list[float]], dict[str, list[str]], dict[str, dict[str, float]]]:
    """Each engine's seconds per round and translations of `sources`, the engines taking turns (in reverse order
    every other round), each in its own process with `threads` threads, and its memory."""
    context = multiprocessing.get_context("spawn")
    workers = {}
    for name, folder in folders.items():
        parent, child = context.Pipe()
        arguments = (child, name, folder, settings, threads, sources[:WARM_UP_SENTENCES])
        process = context.Process(target=serve_engine, args=arguments, daemon=True)
        process.start()
        workers[name] = (process, parent)
    memory = {name: {"loaded_mib": parent.recv()} for name, (_, parent) in workers.items()}
    seconds: dict[str, list[float]] = {name: [] for name in workers}
    outputs = {}
    for round_index in range(repeats):
        names = list(workers) if round_index % 2 == 0 else list(reversed(workers))
        for name in names:
            time.sleep(PAUSE_SECONDS)
            workers[name][1].send(sources)
            elapsed, translations = workers[name][1].recv()
            seconds[name].append(elapsed)
            outputs[name] = [line.strip() for line in translations]
    for name, (process, parent) in workers.items():
        parent.send(None)
        memory[name]["peak_mib"] = parent.recv()
        process.join()
    return seconds, outputs, memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("size", choices=("multi30k", "base"))
    parser.add_argument("--model", help="multi30k: a folder written by `hf-transformer export`")
    parser.add_argument("--about", help="multi30k: what the model is (how it was trained), recorded in the results")
    parser.add_argument("--limit", type=int, default=None, help="only the first N test sentences")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="CPU threads of every engine")
    parser.add_argument("--note", help="what else ran on the machine meanwhile, recorded in the results")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    multi30k_dir()
    sources = read_split("test_2016_flickr", "en")[: args.limit]
    references = read_split("test_2016_flickr", "de")[: args.limit]

    with tempfile.TemporaryDirectory() as work:
        if args.size == "multi30k":
            if not args.model:
                parser.error("multi30k needs --model, a folder written by `hf-transformer export`")
            folder = args.model
            model = TransformerForConditionalGeneration.from_pretrained(folder).eval()
            tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
            settings = dict(PAPER)
            about = {"model": args.model, "about": args.about}
        else:
            model, tokenizer = base_model_and_tokenizer()
            folder = str(Path(work) / "base")
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            settings = dict(PAPER, max_length_offset=0)
            about = {"model": "untrained, d_model 512, 6 + 6 layers, </s> never chosen: output length = source length"}
        # The shortlist, learnt from the training pairs, in a copy of the folder (not written into --model's).
        shortlisted = Path(work) / "shortlisted"
        shutil.copytree(folder, shortlisted)
        shortlist = build_training_shortlist(tokenizer, model.config)
        shortlist.save_pretrained(shortlisted)
        folders = {
            name: str(shortlisted) if options.get("shortlist") else folder for name, (options, _) in OURS.items()
        }
        # One CTranslate2 folder per weight type, with the shortlist as its vocabulary map (used where asked).
        converted = {
            quantization: str(
                to_ctranslate2(
                    model, tokenizer, Path(work) / quantization, quantization=quantization, shortlist=shortlist
                )
            )
            for quantization in {quantization for quantization, _ in CTRANSLATE2.values()}
        }
        folders.update({name: converted[quantization] for name, (quantization, _) in CTRANSLATE2.items()})
        parameters = sum(parameter.numel() for parameter in model.parameters())
        vocabulary = model.config.vocab_size
        del model

        results = {}
        bleu = BLEU()
        for threads in args.threads:
            seconds, outputs, memory = measure(folders, settings, threads, sources, args.repeats)
            reference = outputs["translate() float32"]
            entry = {}
            for name in folders:
                median = statistics.median(seconds[name])
                tokens = sum(len(ids) for ids in tokenizer(outputs[name])["input_ids"])
                same = sum(a == b for a, b in zip(outputs[name], reference, strict=True))
                entry[name] = {
                    "sentences_per_sec": len(sources) / median,
                    "target_tokens_per_sec": tokens / median,
                    "target_tokens": tokens,
                    "same_as_translate_float32": same,
                    **(
                        {"bleu": bleu.corpus_score(outputs[name], [references]).score}
                        if args.size == "multi30k"
                        else {}
                    ),
                    "memory_loaded_mib": memory[name]["loaded_mib"],
                    "memory_peak_mib": memory[name]["peak_mib"],
                }
            results[str(threads)] = entry

    out = Path(args.out)
    report = json.loads(out.read_text()) if out.is_file() else {}
    if "sizes" not in report:  # results of 0.4.0 and before held one model, without sizes
        report = {"sizes": {}}
    report.update(ctranslate2_version=ctranslate2.__version__, torch_version=torch.__version__)
    if args.size == "multi30k":
        report["bleu_signature"] = str(bleu.get_signature())
    report["sizes"][args.size] = {
        **about,
        "parameters": parameters,
        "vocabulary": vocabulary,
        "sentences": len(sources),
        "repeats": args.repeats,
        "cpu_count": os.cpu_count(),
        "note": args.note,
        "threads": results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")

    for threads, entry in results.items():
        base = entry["ctranslate2 int8"]
        rows = [["engine", "sentences/s", "tokens/s", "x ct2 int8", "same as fp32", "BLEU", "MiB loaded", "MiB peak"]]
        for name, values in entry.items():
            rows.append(
                [
                    name,
                    f"{values['sentences_per_sec']:.1f}",
                    f"{values['target_tokens_per_sec']:.0f}",
                    f"{values['sentences_per_sec'] / base['sentences_per_sec']:.2f}",
                    f"{values['same_as_translate_float32']}/{len(sources)}",
                    f"{values['bleu']:.2f}" if "bleu" in values else "-",
                    f"{values['memory_loaded_mib']:.0f}",
                    f"{values['memory_peak_mib']:.0f}",
                ]
            )
        title = f"{args.size}: Multi30k test_2016_flickr, beam 4, {threads} threads, medians of {args.repeats}"
        print_table(title, rows)
    print(f"Written to {args.out}")


if __name__ == "__main__":
    main()

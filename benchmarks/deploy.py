"""Serving a trained model on a CPU: CTranslate2 (int8 and float32) against our `translate()` and a plain loop of
`generate()`, sentences/s and BLEU on Multi30k test_2016_flickr (English -> German), beam 4, length penalty 0.6.

    MULTI30K_DIR=../shared/data/multi30k python benchmarks/deploy.py --model exports/multi30k

`--model` is a folder written by `hf-transformer export`. Every engine decodes every sentence with at most its length
+ 50 output tokens (the plain loop: the longest source of its batch + 50). The engines take turns in each round, and
the table reports the median of the rounds; the machine's load drifts, so read the ratios. Every engine decodes with
beam 4 and length penalty 0.6, whatever the model saved (`naive_loop` does).
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import ctranslate2
import torch
from multi30k import multi30k_dir, read_split
from sacrebleu.metrics import BLEU
from speed import naive_loop, print_table
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from hf_transformer import translate
from hf_transformer.decoding.ctranslate2 import CTranslate2Translator
from hf_transformer.export.ctranslate2 import to_ctranslate2

RESULTS = Path(__file__).resolve().parent / "results" / "deploy.json"
PAPER = dict(num_beams=4, length_penalty=0.6)  # the paper's decoding, as the generate() loop's


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a folder written by `hf-transformer export`")
    parser.add_argument("--limit", type=int, default=None, help="only the first N test sentences")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (after one warm-up round)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="CPU threads of every engine")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per batch of the generate() loop")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    multi30k_dir()
    sources = read_split("test_2016_flickr", "en")[: args.limit]
    references = read_split("test_2016_flickr", "de")[: args.limit]

    torch.set_num_threads(args.threads)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    with tempfile.TemporaryDirectory() as folder:
        ct2 = {
            name: CTranslate2Translator(
                to_ctranslate2(model, tokenizer, Path(folder) / name, quantization=name),
                device="cpu",
                intra_threads=args.threads,
            )
            for name in ("int8", "float32")
        }
    engines = {
        "ctranslate2 int8": lambda: ct2["int8"](sources, **PAPER),
        "ctranslate2 float32": lambda: ct2["float32"](sources, **PAPER),
        "translate()": lambda: translate(model, tokenizer, sources, **PAPER),
        "generate() loop": lambda: naive_loop(model, tokenizer, sources, args.batch_size),
    }
    rates = {name: [] for name in engines}
    outputs = {}
    for round_index in range(args.repeats + 1):  # round 0 warms up and is not counted
        names = list(engines) if round_index % 2 == 0 else list(reversed(engines))
        for name in names:
            start = time.perf_counter()
            outputs[name] = [line.strip() for line in engines[name]()]
            if round_index:
                rates[name].append(len(sources) / (time.perf_counter() - start))

    ours = outputs["translate()"]
    bleu = BLEU()
    report = {
        "model": args.model,
        "sentences": len(sources),
        "threads": args.threads,
        "repeats": args.repeats,
        "ctranslate2_version": ctranslate2.__version__,
        "engines": {
            name: {
                "sentences_per_sec": statistics.median(rates[name]),
                "bleu": bleu.corpus_score(outputs[name], [references]).score,
                "same_as_translate": sum(a == b for a, b in zip(outputs[name], ours, strict=True)),
            }
            for name in engines
        },
    }
    report["bleu_signature"] = str(bleu.get_signature())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")

    base = report["engines"]["generate() loop"]["sentences_per_sec"]
    rows = [["engine", "sentences/s", "x generate() loop", "BLEU", "same as translate()"]]
    for name, entry in report["engines"].items():
        rows.append(
            [
                name,
                f"{entry['sentences_per_sec']:.1f}",
                f"{entry['sentences_per_sec'] / base:.2f}",
                f"{entry['bleu']:.2f}",
                f"{entry['same_as_translate']}/{len(sources)}",
            ]
        )
    print_table(f"Multi30k test_2016_flickr, beam 4, {args.threads} threads, medians of {args.repeats}", rows)
    print(f"Written to {args.out}")


if __name__ == "__main__":
    main()

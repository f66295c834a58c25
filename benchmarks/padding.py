"""Padding efficiency of our token-budget batches on Multi30k train versus random batches of the same mean size.

    MULTI30K_DIR=../shared/data/multi30k python benchmarks/padding.py [--max-tokens 4096 2048]

Efficiency = real tokens / tokens after padding source and target to the longest of their batch (1.0 = no padding).
"""

import argparse
import json
from pathlib import Path

import numpy as np
from multi30k import multi30k_dir

from lightning_modules import TranslationDataModule
from lightning_modules.data.batching import padding_efficiency

RESULTS = Path(__file__).resolve().parent / "results"


def measure(folder: str, max_tokens: int, epochs: int) -> dict:
    datamodule = TranslationDataModule(
        dataset=folder,
        source_lang="en",
        target_lang="de",
        validation_split="val",
        test_split="test_2016_flickr",
        max_tokens=max_tokens,
        bpe_vocab_size=6000,
    )
    datamodule.setup("fit")
    sampler = datamodule.train_dataloader().batch_sampler
    ours, random = [], []
    for epoch in range(epochs):
        plan = sampler.plan(epoch)
        ours.append(padding_efficiency(plan, sampler.source_lengths, sampler.target_lengths))
        shuffled = np.random.default_rng(epoch).permutation(len(sampler.source_lengths))
        random.append(
            padding_efficiency(np.array_split(shuffled, len(plan)), sampler.source_lengths, sampler.target_lengths)
        )
    return {
        "max_tokens": max_tokens,
        "batches": len(plan),
        "pairs_per_batch": len(sampler.source_lengths) / len(plan),
        "token_budget": float(np.median(ours)),
        "random": float(np.median(random)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[4096, 2048])
    parser.add_argument("--epochs", type=int, default=3, help="batch plans measured (their median is reported)")
    parser.add_argument("--out", default=str(RESULTS / "padding.json"))
    args = parser.parse_args()
    folder = multi30k_dir()
    results = [measure(folder, max_tokens, args.epochs) for max_tokens in args.max_tokens]
    print("\nPadding efficiency on Multi30k train (en-de), real / padded tokens")
    print("max_tokens  batches  pairs/batch  token-budget  random")
    for r in results:
        print(
            f"{r['max_tokens']:>10}  {r['batches']:>7}  {r['pairs_per_batch']:>11.1f}  {r['token_budget']:>12.4f}"
            f"  {r['random']:>6.4f}"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nWritten to {args.out}")


if __name__ == "__main__":
    main()

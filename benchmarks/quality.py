"""Translation quality of a Multi30k run: test BLEU with and without checkpoint averaging, and the learning curve.

    hf-transformer fit --config configs/multi30k.yaml              # about 55 minutes on a 2-core CPU
    MULTI30K_DIR=../shared/data/multi30k python benchmarks/quality.py --run-dir runs/multi30k

Scores test_2016_flickr (English -> German) with beam 4 and length penalty 0.6: sacreBLEU on detokenized, cased output
(13a tokenization, the number to compare across papers) and the lowercased variant (closest to the tokenized
lowercased BLEU most Multi30k papers report), plus chrF. Writes JSON and a learning-curve plot to
benchmarks/results/.
"""

import argparse
import csv
import json
import time
from pathlib import Path

from multi30k import read_split
from sacrebleu.metrics import BLEU, CHRF

from hf_transformer import translate
from lightning_modules.checkpoint import (
    average_checkpoints,
    last_checkpoints,
    load_checkpoint,
    model_from_checkpoint,
    tokenizer_from_checkpoint,
)

RESULTS = Path(__file__).resolve().parent / "results"


def score(checkpoint: dict, sources: list[str], references: list[str], max_tokens: int) -> dict:
    model, tokenizer = model_from_checkpoint(checkpoint), tokenizer_from_checkpoint(checkpoint)
    started = time.perf_counter()
    hypotheses = translate(model, tokenizer, sources, max_tokens=max_tokens, num_beams=4, length_penalty=0.6)
    seconds = time.perf_counter() - started
    cased, lowercased, chrf = BLEU(), BLEU(lowercase=True), CHRF()
    return {
        "sacrebleu": cased.corpus_score(hypotheses, [references]).score,
        "sacrebleu_lowercase": lowercased.corpus_score(hypotheses, [references]).score,
        "chrf": chrf.corpus_score(hypotheses, [references]).score,
        "signature": str(cased.get_signature()),
        "signature_lowercase": str(lowercased.get_signature()),
        "translate_seconds": seconds,
        "examples": [
            {"source": s, "reference": r, "hypothesis": h}
            for s, r, h in list(zip(sources, references, hypotheses, strict=True))[:5]
        ],
    }


def training_minutes(checkpoint: dict) -> float | None:
    """Lightning's Timer (active with `max_time`) saves the elapsed training time in the checkpoint."""
    for name, state in checkpoint.get("callbacks", {}).items():
        if name.startswith("Timer"):
            return state["time_elapsed"]["train"] / 60
    return None


def learning_curve(metrics_csv: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(metrics_csv) as file:
        rows = list(csv.DictReader(file))
    train = [(int(r["step"]), float(r["train/loss"])) for r in rows if r.get("train/loss")]
    val_loss = [(int(r["step"]), float(r["val/loss"])) for r in rows if r.get("val/loss")]
    val_bleu = [(int(r["step"]), float(r["val/bleu"])) for r in rows if r.get("val/bleu")]
    figure, (losses, bleu) = plt.subplots(1, 2, figsize=(11, 4))
    losses.plot(*zip(*train, strict=True), label="train (label-smoothed)", alpha=0.7)
    if val_loss:
        losses.plot(*zip(*val_loss, strict=True), "o-", label="validation")
    losses.set(xlabel="step", ylabel="cross-entropy per target token", title="Loss")
    losses.legend()
    if val_bleu:
        bleu.plot(*zip(*val_bleu, strict=True), "o-", color="C2")
    bleu.set(xlabel="step", ylabel="sacreBLEU", title="Validation BLEU (beam 4, shortest quarter of val)")
    figure.suptitle("Multi30k en-de, small post-LN Transformer on a 2-core CPU")
    figure.tight_layout()
    figure.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", default="runs/multi30k")
    parser.add_argument("--average", type=int, default=5, help="average this many last checkpoints")
    parser.add_argument("--limit", type=int, default=None, help="score only the first N test sentences")
    parser.add_argument("--max-tokens", type=int, default=8192)
    parser.add_argument("--out", default=str(RESULTS / "multi30k.json"))
    args = parser.parse_args()
    run = Path(args.run_dir)
    sources = read_split("test_2016_flickr", "en")[: args.limit]
    references = read_split("test_2016_flickr", "de")[: args.limit]

    last = load_checkpoint(run / "checkpoints" / "last.ckpt")
    report = {
        "steps": last["global_step"],
        "training_minutes": training_minutes(last),
        "last_checkpoint": score(last, sources, references, args.max_tokens),
    }
    averaged_paths = last_checkpoints(run / "checkpoints", args.average)
    report[f"average_last_{args.average}"] = score(
        average_checkpoints(averaged_paths), sources, references, args.max_tokens
    )
    report["averaged_checkpoints"] = [path.name for path in averaged_paths]

    print(
        f"\nMulti30k test_2016_flickr en->de after {report['steps']} steps"
        + (f" ({report['training_minutes']:.1f} min of training)" if report["training_minutes"] else "")
    )
    print("checkpoint            sacreBLEU  lowercased  chrF")
    for key in ("last_checkpoint", f"average_last_{args.average}"):
        entry = report[key]
        print(f"{key:<20}  {entry['sacrebleu']:9.2f}  {entry['sacrebleu_lowercase']:10.2f}  {entry['chrf']:5.2f}")
    print(f"signature: {report['last_checkpoint']['signature']}")

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    metrics = sorted(run.glob("logs/version_*/metrics.csv"), key=lambda path: int(path.parent.name[8:]))
    if metrics:
        plot = Path(args.out).with_name("multi30k_learning_curve.png")
        learning_curve(metrics[-1], plot)
        print(f"learning curve: {plot}")
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"Written to {args.out}")


if __name__ == "__main__":
    main()

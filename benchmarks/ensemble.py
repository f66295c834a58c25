"""Ensembles on the demo task (numbers in digits -> English words): several seeds of `configs/demo.yaml` trained
briefly, the demo's test split translated by each of them and by their ensembles, and what an ensemble costs per
sentence against one model.

    python benchmarks/ensemble.py                                                  # 3 seeds of 150 updates
    python benchmarks/ensemble.py --seeds 0 1 --steps 3 --limit 16 --out /tmp/ensemble.json       # a quick look

Each seed is `hf-transformer fit --config configs/demo.yaml --seed_everything SEED` with the overrides that the results
record: fewer updates and warm-up steps, no validation, one checkpoint at the end. The seed sets the initialisation and
the dropout; the data and its order are the demo's (data.seed). All seeds read one tokenizer, which the first trains:
an ensemble's models must share it. Every setting that matters is passed on the command line, so that the results do
not follow later edits of the demo's config (its step count, say).

Every model and ensemble decodes with the demo's beam 4 and length penalty 0.6. Scores: sacreBLEU and the share of
numbers translated exactly. Cost: the seconds per sentence of the first seed alone and of the ensemble of all seeds,
taking turns over `--rounds` rounds on the first `--timing-sentences` test sentences, medians; their ratio is what the
ensemble costs. The machine is shared: read the ratio, measured side by side, rather than the seconds. Written to
`benchmarks/results/ensemble.json`.
"""

import argparse
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
from machine import device_name

from hf_transformer import translate
from hf_transformer.decoding import Ensemble
from hf_transformer.scoring import SACREBLEU, sacrebleu_scores
from lightning_modules.checkpoint import load_checkpoint, model_from_checkpoint, tokenizer_from_checkpoint
from lightning_modules.cli import main as hf_transformer

RESULTS = Path(__file__).resolve().parent / "results"
DEMO = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"


def train(seed: int, args: argparse.Namespace, work: Path) -> Path:
    """The last checkpoint of the demo trained `args.steps` updates from `seed`; a run of `work` that already has it
    (`--work` kept from an earlier call) is reused."""
    checkpoint = work / f"seed{seed}" / "checkpoints" / "last.ckpt"
    if checkpoint.is_file() and load_checkpoint(checkpoint)["global_step"] == args.steps:
        print(f"seed {seed}: reusing {checkpoint}")
        return checkpoint
    hf_transformer(["fit", *fit_overrides(seed, args, work)])
    return checkpoint


def configs(args: argparse.Namespace) -> list[str]:
    """--config DEMO, and each of `args.config` over it."""
    return [word for config in [str(DEMO), *args.config] for word in ("--config", config)]


def fit_overrides(seed: int | str, args: argparse.Namespace, work: Path) -> list[str]:
    return [
        *configs(args),
        f"--seed_everything={seed}",
        f"--trainer.max_steps={args.steps}",
        f"--model.schedule.warmup_steps={args.warmup_steps}",
        "--trainer.limit_val_batches=0",
        f"--checkpoint.every_n_train_steps={args.steps}",
        "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={work / f'seed{seed}'}",
        f"--data.tokenizer_dir={work / 'tokenizer'}",
    ]


def demo_test_split(args: argparse.Namespace, work: Path) -> tuple[list[str], list[str]]:
    """The sources and references of the demo's test split (the first `args.limit`), as `hf-transformer test` reads
    them."""
    from lightning_modules.cli.training import TranslationCLI

    warnings.filterwarnings("ignore", message="LightningCLI's args parameter")  # this script's own arguments
    cli = TranslationCLI(args=[*configs(args), f"--data.tokenizer_dir={work / 'tokenizer'}"], run=False)
    pairs = cli.datamodule.raw_pairs(cli.datamodule.hparams.test_split)
    return list(pairs["source_text"])[: args.limit], list(pairs["target_text"])[: args.limit]


def scores(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    sacrebleu = next(score.value for score in sacrebleu_scores(hypotheses, references) if score.name == SACREBLEU)
    exact = sum(h == r for h, r in zip(hypotheses, references, strict=True)) / len(references)
    return {"sacrebleu": sacrebleu, "exact_match": exact}


def decoded(model, tokenizer, sources: list[str], references: list[str]) -> dict:
    started = time.perf_counter()
    hypotheses = translate(model, tokenizer, sources)
    return {**scores(hypotheses, references), "seconds": time.perf_counter() - started}


def cost(models: list, tokenizer, sources: list[str], rounds: int) -> dict:
    """Seconds per sentence of the first model alone and of the ensemble of all, taking turns; medians."""
    runs = {"one_model": models[0], "ensemble": Ensemble(models)}
    seconds = {name: [] for name in runs}
    for round_index in range(rounds + 1):  # round 0 warms up: not counted
        for name in runs if round_index % 2 == 0 else reversed(runs):
            started = time.perf_counter()
            translate(runs[name], tokenizer, sources)
            if round_index:
                seconds[name].append((time.perf_counter() - started) / len(sources))
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    return {
        "sentences": len(sources),
        "rounds": rounds,
        "seconds_per_sentence": medians,
        "ratio_ensemble_over_one_model": medians["ensemble"] / medians["one_model"],
    }


def measure(models: list, tokenizer, seeds: list[int], sources: list[str], references: list[str]) -> dict:
    """The scores of each model, and of the ensembles of the first 2, 3, ... (the mean of their probabilities) and of
    all (the mean of their log-probabilities too)."""
    members = []
    for seed, model in zip(seeds, models, strict=True):
        members.append({"seed": seed, **decoded(model, tokenizer, sources, references)})
        print(f"seed {seed}: sacreBLEU {members[-1]['sacrebleu']:.2f}, exact {members[-1]['exact_match']:.3f}")
    settings = [(count, "probabilities") for count in range(2, len(models) + 1)]
    ensembles = []
    for count, average in [*settings, (len(models), "log-probabilities")]:
        ensemble = Ensemble(models[:count], average=average)
        ensembles.append(
            {"seeds": seeds[:count], "average": average, **decoded(ensemble, tokenizer, sources, references)}
        )
        print(
            f"ensemble of seeds {seeds[:count]} ({average}): sacreBLEU {ensembles[-1]['sacrebleu']:.2f}, exact "
            f"{ensembles[-1]['exact_match']:.3f}"
        )
    bleu = [member["sacrebleu"] for member in members]
    return {
        "members": members,
        "mean_member_sacrebleu": statistics.mean(bleu),
        "best_member_sacrebleu": max(bleu),
        "ensembles": ensembles,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="the seeds trained (default: 0 1 2)")
    parser.add_argument("--steps", type=int, default=150, help="updates of each seed (default: 150)")
    parser.add_argument("--warmup-steps", type=int, default=50, help="warm-up of each seed (default: 50)")
    parser.add_argument("--limit", type=int, default=None, help="translate only the first N test sentences")
    parser.add_argument("--timing-sentences", type=int, default=100, help="test sentences of the cost measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the cost measurement")
    parser.add_argument("--work", default=None, help="where the runs are kept (default: a temporary folder)")
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        help="a config file over the demo's, for every run (the tests' tiny one)",
    )
    parser.add_argument("--out", default=str(RESULTS / "ensemble.json"))
    args = parser.parse_args()
    if len(args.seeds) < 2:
        parser.error("--seeds: an ensemble needs two seeds or more")
    with tempfile.TemporaryDirectory() as temporary:
        work = Path(args.work or temporary)
        started = time.perf_counter()
        checkpoints = [load_checkpoint(train(seed, args, work)) for seed in args.seeds]
        training_minutes = (time.perf_counter() - started) / 60
        models = [model_from_checkpoint(checkpoint).eval() for checkpoint in checkpoints]
        tokenizer = tokenizer_from_checkpoint(checkpoints[0])
        sources, references = demo_test_split(args, work)
    generation = models[0].generation_config
    report = {
        "task": "the demo (configs/demo.yaml): numbers in digits -> English words, its test split",
        "fit": "hf-transformer fit --config configs/demo.yaml "
        + " ".join(fit_overrides("SEED", args, Path("WORK"))[2:]),
        "steps": args.steps,
        "warmup_steps": args.warmup_steps,
        "seeds": args.seeds,
        "training_minutes": training_minutes,
        "test_sentences": len(sources),
        "decoding": {"num_beams": generation.num_beams, "length_penalty": generation.length_penalty},
        **measure(models, tokenizer, args.seeds, sources, references),
        "cost": cost(models, tokenizer, sources[: args.timing_sentences], args.rounds),
        "device": device_name("cpu"),
        "threads": torch.get_num_threads(),
        "multi30k": "not measured: no Multi30k seed's checkpoints are kept (benchmarks/results/multi30k.json holds "
        "its runs' scores, not their weights)",
    }
    everyone = next(
        entry for entry in report["ensembles"] if entry["average"] == "probabilities" and entry["seeds"] == args.seeds
    )
    print(
        f"ensemble of all seeds: sacreBLEU {everyone['sacrebleu']:.2f}, the mean member "
        f"{report['mean_member_sacrebleu']:.2f}, the best {report['best_member_sacrebleu']:.2f}; it costs "
        f"{report['cost']['ratio_ensemble_over_one_model']:.2f}x one model per sentence"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"Written to {args.out}")


if __name__ == "__main__":
    main()

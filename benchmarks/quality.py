"""Translation quality of a Multi30k run: every score papers report, on test_2016_flickr and each later Multi30k test
set in the folder, for the last checkpoint and the average of the last N, with N (of those `--average` lists) and the
decoding settings (beam size, length penalty) chosen on `val`, never on test.

    hf-transformer fit --config configs/multi30k.yaml
    MULTI30K_DIR=path/to/multi30k python benchmarks/quality.py --run-dir runs/multi30k
    hf-transformer fit --config configs/multi30k.yaml --seed_everything 1 --trainer.default_root_dir runs/seed1
    MULTI30K_DIR=path/to/multi30k python benchmarks/quality.py --run-dir runs/seed1      # the recipe's second seed

Scores (`hf_transformer.scoring`, each printed with how it was computed): sacreBLEU (cased, detokenized, 13a, the
number to compare across papers that report sacreBLEU), lowercased sacreBLEU, chrF, the tokenized lowercased BLEU
that Multi30k papers report, and the compound-split tokenized BLEU of WMT14 en-de papers. Also the val -> test gaps, the
run's budget (steps, target tokens) and its time (training minutes, the median target tokens/s), and its learning
curves (the results page plots them). The JSON in benchmarks/results/ holds every scored run, one entry per recipe and
seed, for the results tables.

Each model's translations are kept in the run's folder (`translations.json`), so that runs can be compared on the same
sentences later (`benchmarks/compare.py`).
"""

import argparse
import csv
import dataclasses
import inspect
import itertools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import yaml
from machine import device_name
from multi30k import TRANSLATIONS, multi30k_dir, read_split, test_splits
from transformers import PreTrainedTokenizerFast

from hf_transformer import TransformerConfig, TransformerForConditionalGeneration, translate
from hf_transformer.decoding.search import DECODING_MAX_TOKENS
from hf_transformer.errors import UserError
from hf_transformer.scoring import (
    SACREBLEU,
    SACREBLEU_LOWERCASED,
    format_scores,
    translation_scores,
)
from lightning_modules import TranslationDataModule, TranslationModule
from lightning_modules.checkpoint import (
    average_checkpoints,
    last_checkpoints,
    load_checkpoint,
    model_from_checkpoint,
    tokenizer_from_checkpoint,
)
from lightning_modules.cli.arguments import positive_int
from lightning_modules.module import model_config

RESULTS = Path(__file__).resolve().parent / "results"
RATE = "throughput/target_tokens_per_sec"
Translator = tuple[TransformerForConditionalGeneration, PreTrainedTokenizerFast]


def score(translator: Translator, sources: list[str], references: list[str], max_tokens: int, **decoding) -> dict:
    """Translate `sources` with `translator` (a model and its tokenizer, `load`) and score the translations against
    `references`."""
    model, tokenizer = translator
    started = time.perf_counter()
    hypotheses = translate(model, tokenizer, sources, max_tokens=max_tokens, **decoding)
    seconds = time.perf_counter() - started
    scores = translation_scores(hypotheses, references, "de")
    return {
        "hypotheses": hypotheses,  # kept in the run's folder (`translations.json`), not in the results
        "decoding": decoding,
        "scores": {entry.name: entry.value for entry in scores},
        "how": {entry.name: entry.how for entry in scores},
        "sacrebleu_interval_95": next(entry.interval for entry in scores if entry.name == SACREBLEU),
        "table": format_scores(scores),
        "translate_seconds": seconds,
        "examples": [
            {"source": s, "reference": r, "hypothesis": h}
            for s, r, h in list(zip(sources, references, hypotheses, strict=True))[:5]
        ],
    }


def load(checkpoint: dict, device: str) -> Translator:
    """The checkpoint's model on `device` and its tokenizer: built once, then decoded with each setting and split."""
    return model_from_checkpoint(checkpoint).to(device), tokenizer_from_checkpoint(checkpoint)


def tune_decoding(
    translator: Translator,
    beams: list[int],
    penalties: list[float],
    max_tokens: int,
    limit: int | None,
    select_on: str,
) -> tuple[dict, dict]:
    """The beam size and length penalty with the best `select_on` score on `val`, every setting's val score, and the
    best setting's val result (`score`)."""
    sources, references = read_split("val", "en")[:limit], read_split("val", "de")[:limit]
    grid, results = {}, {}
    for num_beams, length_penalty in itertools.product(beams, penalties):
        setting = f"beam {num_beams}, length penalty {length_penalty}"
        results[setting] = score(
            translator, sources, references, max_tokens, num_beams=num_beams, length_penalty=length_penalty
        )
        grid[setting] = results[setting]["scores"][select_on]
        print(f"val: {setting}: {select_on} {grid[setting]:.2f}")
    best = max(grid, key=grid.get)
    num_beams, length_penalty = best.removeprefix("beam ").split(", length penalty ")
    return {"num_beams": int(num_beams), "length_penalty": float(length_penalty), "val_grid": grid}, results[best]


def choose_average(
    folder: Path, counts: list[int], val: Callable[[dict], tuple[Translator, dict, dict]]
) -> tuple[list[Path], dict, tuple[Translator, dict, dict], dict[str, float]]:
    """Of the averages of the last N step checkpoints, for each N of `counts`, the one that `val` (`tune_decoding` of
    its `load`ed model) scores highest: its checkpoints, the averaged checkpoint, its `val` result, and each N's best
    val score."""
    grid, best = {}, None
    for count in counts:
        paths = last_checkpoints(folder, count)
        average = average_checkpoints(paths)
        on_val = val(average)
        key = f"last {count}"
        grid[key] = max(on_val[1]["val_grid"].values())
        print(f"val: the average of the last {count}: {grid[key]:.2f}")
        if best is None or grid[key] > best[0]:  # one model held at a time: the best so far
            best = grid[key], paths, average, on_val
    return *best[1:], grid


def training_minutes(checkpoint: dict) -> float | None:
    """The time spent training, validation left out: the throughput callback's total, or Lightning's Timer's
    (active with `max_time`) in checkpoints written before the callback kept one."""
    callbacks = checkpoint.get("callbacks", {})
    if "trained_seconds" in callbacks.get("TranslationThroughput", {}):
        return callbacks["TranslationThroughput"]["trained_seconds"] / 60
    for name, state in callbacks.items():
        if name.startswith("Timer"):
            return state["time_elapsed"]["train"] / 60
    return None


def run_settings(run: Path) -> dict:
    """The resolved settings of the run's first start (`config.yaml`, which LightningCLI writes into its log)."""
    configs = sorted(run.glob("logs/version_*/config.yaml"), key=lambda path: int(path.parent.name[8:]))
    return yaml.safe_load(configs[0].read_text()) if configs else {}


RECIPE = Path(__file__).resolve().parents[1] / "configs" / "multi30k.yaml"


def flat_settings(section: dict) -> dict:
    """A run's `model` or `data` settings in the names recipes use, the flat options of 0.4 (`peak_lr`,
    `warmup_steps`, `cooldown_steps`, `rdrop_alpha`, `bpe_dropout`), from a config of either layout: since 0.4's, the
    schedule is an object and R-Drop, the cool-down and BPE-dropout are classes chosen by class path
    (lightning_modules/experimental)."""
    path = section.get("class_path", "")
    settings = dict(section.get("init_args") or {}) if "class_path" in section else dict(section)
    schedule = settings.pop("schedule", None) or {}
    settings |= schedule.get("init_args") or {}
    if path.endswith("RDropTranslationModule"):
        settings["rdrop_alpha"] = settings.pop("alpha", 5.0)
    return settings


# The value of each option of 0.4 that an experimental class replaced, where it changed nothing.
OFF = {"cooldown_steps": 0, "rdrop_alpha": 0.0, "bpe_dropout": 0.0}


def check_multi30k_run(run: Path, checkpoint: dict) -> None:
    """Refuse a run that was not trained on Multi30k en -> de, which this script scores (its entry would be titled so,
    and its scores compared with those of Multi30k runs): its data is the `dataset` (a Hub id or a folder) and the
    languages of its checkpoint's data module. Multi30k: a Hub copy of it, or a folder of its files (MULTI30K_DIR, or
    one named after it)."""
    data = checkpoint.get("datamodule_hyper_parameters") or flat_settings(run_settings(run).get("data") or {})
    dataset, source, target = (data.get(key) for key in ("dataset", "source_lang", "target_lang"))
    folder = Path(multi30k_dir()).resolve()
    multi30k = dataset is not None and ("multi30k" in str(dataset).lower() or Path(dataset).resolve() == folder)
    if not multi30k or (source, target) != ("en", "de"):
        trained_on = f"{dataset} {source} -> {target}" if dataset is not None else "data its checkpoint does not name"
        raise UserError(
            f"{run} was trained on {trained_on}, but quality.py scores Multi30k en -> de runs (data.dataset "
            f"{yaml.safe_load(RECIPE.read_text())['data']['dataset']} or a folder of Multi30k's files such as "
            f"{folder}, data.source_lang en, data.target_lang de): give the folder of such a run, or score this one "
            "with `hf-transformer test`"
        )


def model_changes(model: dict) -> list[str]:
    """The model's settings (`TransformerConfig` fields, preset and overrides resolved) in which a run differs from
    configs/multi30k.yaml, but the dropout, which every recipe's name states: what a tried setting changed."""
    shipped = flat_settings(yaml.safe_load(RECIPE.read_text())["model"])
    ours = model_config(model.get("preset", "base"), model.get("config"), model.get("init_from"))
    theirs = model_config(shipped["preset"], shipped["config"], None)
    return [
        f"{field.name.replace('_', ' ')} {getattr(ours, field.name)}"
        for field in dataclasses.fields(TransformerConfig)
        if field.name != "dropout" and getattr(ours, field.name) != getattr(theirs, field.name)
    ]


# The settings that change what a run learns from and that the recipe's name does not state already (the budget's
# max_tokens is named in every recipe): a run that changes one is another recipe, as one changing a model setting is.
RECIPE_DATA_FIELDS = ("bpe_vocab_size", "bpe_min_frequency", "bpe_dropout", "max_sentences")
RECIPE_TRAINING_FIELDS = ("cooldown_steps", "rdrop_alpha", "weight_decay")


def setting_changes(settings: dict, section: str, fields: tuple[str, ...], component: type) -> list[str]:
    """The `fields` in which a run's `settings` (its config's `section`: "data" or "model") differ from
    configs/multi30k.yaml's (or, where that leaves one out, from the default of `component`, which takes them)."""
    defaults = {name: parameter.default for name, parameter in inspect.signature(component).parameters.items()}
    shipped_section = flat_settings(yaml.safe_load(RECIPE.read_text())[section])
    shipped = {name: shipped_section.get(name, {**defaults, **OFF}[name]) for name in fields}
    return [
        f"{name.replace('_', ' ')} {settings.get(name, shipped[name])}"
        for name in fields
        if settings.get(name, shipped[name]) != shipped[name]
    ]


def recipe(run: Path, version: str) -> str:
    """The settings of the run that tell recipes apart (the seed aside: a recipe's seeds are averaged), and the
    version that trained it."""
    settings = run_settings(run)
    model, data = (flat_settings(settings.get(key) or {}) for key in ("model", "data"))
    trainer = settings.get("trainer") or {}
    config = model.get("config") or {}
    changes = ", ".join(
        [
            f"dropout {config.get('dropout')}",
            *model_changes(model),
            *setting_changes(model, "model", RECIPE_TRAINING_FIELDS, TranslationModule),
            *setting_changes(data, "data", RECIPE_DATA_FIELDS, TranslationDataModule),
        ]
    )
    return (
        f"hf-transformer {version}: {changes}, warm-up {model.get('warmup_steps')}, peak lr {model.get('peak_lr')}, "
        f"{data.get('max_tokens')}-token batches, max_steps {trainer.get('max_steps')}, "
        f"{trainer.get('precision')} with {config.get('attn_implementation') or 'sdpa'} attention"
    )


def median_rate(rows: list[dict[str, str]]) -> float | None:
    """The median of the target tokens/s that the run's step lines (`read_metrics`) logged (`TranslationThroughput`):
    its steady pace, which a pause or a start-up does not move as it moves the mean."""
    rates = [float(row[RATE]) for row in rows if row.get(RATE)]
    return statistics.median(rates) if rates else None


def read_metrics(metrics_csvs: list[Path]) -> list[dict[str, str]]:
    """The rows a run logged, from its `version_*` logs in order (one per start of the run): a resumed run redoes the
    steps after its checkpoint, so a later log's rows replace the earlier ones from its first training step on."""
    rows = []
    for metrics_csv in metrics_csvs:
        with open(metrics_csv) as file:
            logged = [row for row in csv.DictReader(file) if row.get("step")]
        trained = [int(row["step"]) for row in logged if row.get("train/loss")]  # each start logs data counts at 0
        if trained:
            rows = [row for row in rows if int(row["step"]) < min(trained)] + logged
    return rows


def add_run(runs: list[dict], entry: dict) -> list[dict]:
    """The scored runs with `entry` last: one file holds every run, and scoring a recipe's seed again replaces that
    seed's entry."""
    return [kept for kept in runs if (kept["recipe"], kept["seed"]) != (entry["recipe"], entry["seed"])] + [entry]


# The curves a run's entry keeps from its logs, for the plot of its recipe's seeds: the metric each reads.
CURVES = {"train_loss": "train/loss", "val_loss": "val/loss", "val_bleu": "val/bleu"}


def validation_sample(settings: dict) -> str:
    """What the validation of the learning curve ran on (trainer.limit_val_batches of val's batches, which come in an
    order fixed by the data's seed): runs whose samples differ have validation curves that compare only in shape."""
    limit = settings.get("trainer", {}).get("limit_val_batches")
    if limit is None or limit == 1.0:
        return "all of val"
    if isinstance(limit, float):
        return f"{limit:.0%} of val in a seed-fixed order"
    return f"{limit} batches of val in a seed-fixed order"


def curves(rows: list[dict[str, str]]) -> dict[str, list[list[float]]]:
    """The curves in the rows a run logged (`read_metrics`), each a list of [step, value]."""
    return {
        name: [[int(row["step"]), float(row[column])] for row in rows if row.get(column)]
        for name, column in CURVES.items()
    }


def comma_separated(cast: Callable[[str], int | float], kind: str) -> Callable[[str], list]:
    """An argparse type: a comma-separated list of `cast` values ("5,10,20"), each a `kind`."""

    def parse(text: str) -> list:
        try:
            return [cast(value) for value in text.split(",")]
        except (ValueError, argparse.ArgumentTypeError) as error:
            raise argparse.ArgumentTypeError(
                f"{text!r}: each comma-separated value must be a {kind} ({error})"
            ) from None

    return parse


def main() -> None:
    here = "cuda" if torch.cuda.is_available() else "cpu"
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", default="runs/multi30k")
    parser.add_argument(
        "--average",
        type=comma_separated(positive_int, "whole number of at least 1"),
        default="10",
        help="average this many last checkpoints; several (5,10,20): the one best on val",
    )
    parser.add_argument(
        "--beams",
        type=comma_separated(positive_int, "whole number of at least 1"),
        default="4,5",
        help="beam sizes to try on val",
    )
    parser.add_argument(
        "--length-penalties",
        type=comma_separated(float, "number"),
        default="1.0,1.3,1.6",
        help="length penalties to try on val",
    )
    parser.add_argument("--limit", type=int, default=None, help="score only the first N sentences of each split")
    parser.add_argument("--max-tokens", type=int, default=DECODING_MAX_TOKENS)
    parser.add_argument(
        "--device",
        default=here,
        help="where to translate (default: the GPU where there is one)",
    )
    parser.add_argument(
        "--select-on",
        default=SACREBLEU,
        choices=[SACREBLEU, SACREBLEU_LOWERCASED],
        help="the val score that chooses the decoding and gives the val -> test gap",
    )
    parser.add_argument(
        "--recipe", help="what the run trained, for the results pages (default: its settings and the version)"
    )
    parser.add_argument(
        "--trained-on",
        help="where the run trained, for the results pages (default: this machine's GPU, else its CPU)",
    )
    parser.add_argument("--out", default=str(RESULTS / "multi30k.json"))
    args = parser.parse_args()
    run = Path(args.run_dir)
    last = load_checkpoint(run / "checkpoints" / "last.ckpt")
    check_multi30k_run(run, last)

    def val(checkpoint: dict) -> tuple[Translator, dict, dict]:
        """The checkpoint's model, built once for val and the test sets, and its decoding chosen on val."""
        translator = load(checkpoint, args.device)
        return translator, *tune_decoding(
            translator, args.beams, args.length_penalties, args.max_tokens, args.limit, args.select_on
        )

    averaged_paths, average, average_on_val, averaging_grid = choose_average(run / "checkpoints", args.average, val)
    checkpoints = {"last_checkpoint": (last, val(last)), "average": (average, average_on_val)}

    version = last.get("hf_transformer_version", "an unknown version")
    throughput = last.get("callbacks", {}).get("TranslationThroughput", {})
    metrics = read_metrics(sorted(run.glob("logs/version_*/metrics.csv"), key=lambda path: int(path.parent.name[8:])))
    entry = {
        "recipe": args.recipe or recipe(run, version),
        "seed": run_settings(run).get("seed_everything"),
        "steps": last["global_step"],
        "target_tokens": throughput.get("trained_target_tokens"),
        "training_minutes": training_minutes(last),
        "target_tokens_per_sec": median_rate(metrics),
        "device": args.trained_on or device_name(here),
        "averaged_checkpoints": [path.name for path in averaged_paths],
        "averaging_grid": averaging_grid,
        "validation_sample": validation_sample(run_settings(run)),
        "learning_curve": curves(metrics),
    }
    tests = test_splits("en", "de")
    translations = {}
    for key, (checkpoint, (translator, decoding, best_on_val)) in checkpoints.items():
        settings = {"num_beams": decoding["num_beams"], "length_penalty": decoding["length_penalty"]}
        results = {"val": best_on_val}
        for split in tests:
            sources, references = read_split(split, "en")[: args.limit], read_split(split, "de")[: args.limit]
            results[split] = score(translator, sources, references, args.max_tokens, **settings)
        val = results["val"]["scores"][args.select_on]
        gaps = {split: results[split]["scores"][args.select_on] - val for split in tests}
        translations[key] = {split: result.pop("hypotheses") for split, result in results.items()}
        entry[key] = {"decoding": decoding, **results, "val_to_test_gap": gaps}
        print(f"\n{key} (step {checkpoint['global_step']}), {settings} chosen on val")
        for split in tests:
            print(f"{split}:\n{results[split]['table']}")
            print(f"val -> {split} gap ({args.select_on}): {gaps[split]:+.2f}")

    (run / TRANSLATIONS).write_text(json.dumps(translations, ensure_ascii=False) + "\n")

    minutes = f" ({entry['training_minutes']:.1f} min of training)" if entry["training_minutes"] else ""
    print(f"\nMulti30k en->de after {entry['steps']} steps{minutes}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs = add_run(json.loads(out.read_text())["runs"] if out.exists() else [], entry)
    out.write_text(json.dumps({"runs": runs}, indent=2) + "\n")
    print(f"Written to {out} ({len(runs)} runs)")
    print("The results page draws its learning curves from it: python -m sphinx -b html docs docs/_build/html")


if __name__ == "__main__":
    try:
        main()
    except UserError as error:  # a run folder or a setting that cannot be used: the message names the fix
        raise SystemExit(f"quality.py: error: {error}") from None

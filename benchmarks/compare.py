"""Is one Multi30k setting better than another, or could the difference come from which sentences were drawn? Compares
runs that quality.py scored, on the same sentences, by paired bootstrap resampling
(`hf_transformer.scoring.paired_bootstrap`): each side one run or several (the seeds of a setting, scored as their
mean), on val and every test set that all of them were scored on.

    MULTI30K_DIR=path/to/multi30k python benchmarks/compare.py --runs runs/dropout0 runs/dropout1 \\
        --baseline runs/seed0 runs/seed1

Each run's model is the one quality.py reports (`--model average`, the averaged checkpoints, or `last_checkpoint`), its
translations read from the run's folder (`translations.json`). Printed for each split: both sides' sacreBLEU, their
difference with its 95% interval over the resamples, and the two-sided p-value. Choose on val; the test sets say how
far the choice carries.
"""

import argparse
import json
from pathlib import Path
from typing import NoReturn

from multi30k import TRANSLATIONS, read_split

from hf_transformer.scoring import paired_bootstrap


def translations(run: Path, model: str) -> dict[str, list[str]]:
    """The run's translations of each split by the model `model`, as quality.py kept them, or exit saying why not."""
    path = run / TRANSLATIONS
    if not path.is_file():
        fail(f"{path} does not exist: score the run with benchmarks/quality.py first, which writes it")
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        fail(f"{path} is not readable JSON ({error}): it was cut short or damaged; score the run again with quality.py")
    if not isinstance(kept, dict) or not isinstance(kept.get(model), dict):
        held = ", ".join(kept) if isinstance(kept, dict) and kept else "none"
        fail(
            f"{path} holds no translations by the model {model!r} (--model; it holds: {held}): compare with --model "
            "one it holds, or score the run again with quality.py"
        )
    return kept[model]


def fail(message: str) -> NoReturn:
    """Exit with status 1 and `message` as one line, as the project's commands do."""
    raise SystemExit(f"compare.py: error: {message}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, nargs="+", required=True, help="the setting's runs (their folders)")
    parser.add_argument("--baseline", type=Path, nargs="+", required=True, help="the baseline's runs")
    parser.add_argument("--model", choices=["average", "last_checkpoint"], default="average")
    parser.add_argument("--resamples", type=int, default=1000)
    args = parser.parse_args()
    if args.resamples < 1:
        fail(f"--resamples {args.resamples}: draw at least 1 resample of the sentences (the default: 1000)")
    systems = [translations(run, args.model) for run in args.runs]
    baselines = [translations(run, args.model) for run in args.baseline]
    splits = [split for split in systems[0] if all(split in run for run in [*systems, *baselines])]
    if not splits:
        scored = "; ".join(
            f"{run}: {', '.join(kept) or 'none'}"
            for run, kept in zip([*args.runs, *args.baseline], [*systems, *baselines], strict=True)
        )
        fail(
            f"nothing compared: no split was scored for every run ({scored}). Score them on the same data with "
            "quality.py"
        )
    print(f"{', '.join(map(str, args.runs))} against {', '.join(map(str, args.baseline))} ({args.model}, sacreBLEU)")
    for split in splits:
        # quality.py's --limit scores the first N sentences of a split: the references are those N.
        references = read_split(split, "de")[: len(systems[0][split])]
        try:
            comparison = paired_bootstrap(
                [run[split] for run in systems], [run[split] for run in baselines], references, args.resamples
            )
        except ValueError as error:
            fail(f"{split}: {error} Score every run with the same --limit and data.")
        low, high = comparison.difference_interval
        print(
            f"{split}: {comparison.system:.2f} against {comparison.baseline:.2f}: "
            f"{comparison.system - comparison.baseline:+.2f} (95% interval {low:+.2f} to {high:+.2f}), "
            f"p = {comparison.p_value:.3f}"
        )


if __name__ == "__main__":
    main()

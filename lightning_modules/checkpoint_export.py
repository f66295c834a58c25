"""A training checkpoint (or the average of several) as a model folder in any registered format
(`hf_transformer.export.FORMATS`), with a model card that says how it was trained and how it scored."""

import json
import sys
from pathlib import Path
from typing import Any, TextIO

from hf_transformer.errors import UserError
from hf_transformer.export import DEFAULT_FORMAT, FORMATS, export_model
from hf_transformer.hub.model_card import write_model_card

from .checkpoint import (
    RUN_ID,
    average_checkpoints,
    averaging_span_warning,
    last_checkpoints,
    load_checkpoint,
    model_from_checkpoint,
    read_checkpoint,
    tokenizer_from_checkpoint,
)


def checkpoint_to_export(
    source: str | Path, average: int | None = None, report: TextIO | None = None
) -> dict[str, Any]:
    """The checkpoint `source`, or with `average` the average of the last `average` step checkpoints of its folder
    (`source` a folder of checkpoints or a file in it), saying on `report` (default: standard output) which steps it
    averaged."""
    source = Path(source)
    if not average:
        return load_checkpoint(source)
    folder = source if source.is_dir() else source.parent
    checkpoint = average_checkpoints(last_checkpoints(folder, average))
    steps = checkpoint["averaged_steps"]
    print(
        f"Averaged {len(steps)} checkpoints of {folder}, steps {', '.join(map(str, steps))}", file=report or sys.stdout
    )
    if warning := averaging_span_warning(steps):
        print(f"Warning: {warning}", file=sys.stderr)
    return checkpoint


def read_results(path: str | Path) -> dict[str, float]:
    """The scores for a model card in a JSON object of metric name -> number, as `hf-transformer test` writes them
    (`test_scores.json`: `test/bleu`, `test/chrf`, ...)."""
    try:
        results = json.loads(Path(path).read_text(encoding="utf-8"))
        return {str(name): float(value) for name, value in results.items()}
    except (OSError, ValueError, TypeError, AttributeError) as err:
        raise UserError(
            f"--results {path}: expected a JSON object of metric name -> number, such as the test_scores.json that "
            f"`hf-transformer test` writes ({err})"
        ) from err


# The scores `hf-transformer test` gave one checkpoint, kept beside it so that `export` and `push` put them on the card.
TESTED_FILE = "test_scores-step{step:06d}.json"


def keep_test_scores(checkpoint_path: str | Path, scores: dict[str, float], written_to: Path) -> Path | None:
    """Write the test `scores` of the checkpoint at `checkpoint_path` beside it, naming its run and step (the weights
    they belong to) and where the test wrote its files; None for a checkpoint without a run id (before 0.3)."""
    checkpoint_path = Path(checkpoint_path)
    checkpoint = read_checkpoint(checkpoint_path, mmap=True)
    if checkpoint.get(RUN_ID) is None:
        return None
    step = checkpoint["global_step"]
    record = {"run_id": checkpoint[RUN_ID], "step": step, "checkpoint": checkpoint_path.name, "scores": scores}
    record["test_files"] = str(written_to)
    path = checkpoint_path.parent / TESTED_FILE.format(step=step)
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return path


def kept_test_scores(checkpoint_path: str | Path, checkpoint: dict[str, Any]) -> tuple[dict[str, float], Path] | None:
    """The test scores kept beside `checkpoint_path` for these very weights (same run, same step), and their file;
    None for an average (no test scored it) or where none were kept."""
    if "averaged_steps" in checkpoint or checkpoint.get(RUN_ID) is None:
        return None
    path = Path(checkpoint_path).parent / TESTED_FILE.format(step=checkpoint["global_step"])
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if record.get("run_id") != checkpoint[RUN_ID] or record.get("step") != checkpoint["global_step"]:
        return None  # another run's, in a folder that was reused
    return {str(name): float(value) for name, value in record["scores"].items()}, path


def export_checkpoint(
    checkpoint: dict[str, Any],
    folder: str | Path,
    format: str = DEFAULT_FORMAT,
    *,
    repo_id: str | None = None,
    results: dict[str, float] | None = None,
    wandb_url: str | None = None,
    compute: str | None = None,
    **options: Any,
) -> Path:
    """Write the model and the tokenizer of `checkpoint` into `folder` in `format` with that format's `options`, and,
    for the formats that carry one, the model card (the keyword arguments of `write_model_card`: `repo_id`, the test
    and validation `results`, the W&B run, the compute). A checkpoint of 0.3 or 0.4 holds no description of its
    training: pass it through `lightning_modules.upgrade.described` first for a card that has one (the `export` and
    `push` commands do)."""
    folder = export_model(
        model_from_checkpoint(checkpoint), tokenizer_from_checkpoint(checkpoint), folder, format, **options
    )
    if FORMATS[format].has_card:
        write_model_card(
            folder, checkpoint, format=format, repo_id=repo_id, results=results, wandb_url=wandb_url, compute=compute
        )
    return folder

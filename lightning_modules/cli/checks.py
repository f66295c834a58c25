"""Checks of a training command line that LightningCLI would otherwise let pass and do the wrong thing (evaluate a
freshly initialised model, train from step 0 when asked to resume). Each raises a `UserError` that names the option
and the fix."""

from pathlib import Path

import lightning.pytorch as pl

from hf_transformer.errors import CheckpointNotFound

from ..callbacks import relative_to_cwd

# `ckpt_path` values that Lightning resolves itself rather than reading a file of that name.
SPECIAL_CKPT_PATHS = ("last", "best", "hpc", "registry")
EVALUATION_COMMANDS = ("validate", "test", "predict")


def check_model_source(subcommand: str, ckpt_path: str | None, init_from: str | None) -> None:
    """Refuse to evaluate a freshly initialised model (validate/test/predict without a checkpoint or a saved model)
    and a --ckpt_path file that does not exist, before the data is prepared."""
    if ckpt_path is None and init_from is None and subcommand in EVALUATION_COMMANDS:
        raise CheckpointNotFound(
            f"no model to {subcommand}: without --ckpt_path or --model.init_from it would be a freshly initialised "
            "one. Pass a checkpoint of a run (--ckpt_path last, or --ckpt_path runs/<run>/checkpoints/last.ckpt) or "
            "an exported model folder (--model.init_from exports/<name>)"
        )
    if ckpt_path is not None and ckpt_path not in SPECIAL_CKPT_PATHS and not Path(ckpt_path).is_file():
        raise CheckpointNotFound(f"--ckpt_path {ckpt_path}: no such file. Pass a .ckpt file written by a run")


def check_last_checkpoint(subcommand: str, ckpt_path: str | None, trainer: pl.Trainer) -> None:
    """`--ckpt_path last` finds a checkpoint or stops: Lightning, finding none, warns and goes on with a freshly
    initialised model (`fit` from step 0)."""
    if ckpt_path != "last":
        return
    folders = [Path(callback.dirpath) for callback in trainer.checkpoint_callbacks if callback.dirpath]
    if not folders:
        raise CheckpointNotFound(
            "--ckpt_path last: the checkpoint callback has no dirpath, so every run writes a new folder and there is "
            "no last checkpoint to find. Pin its dirpath in the config, or pass the file (--ckpt_path PATH)"
        )
    if any(path.is_file() for folder in folders for path in folder.glob("last*.ckpt")):
        return
    where = ", ".join(str(relative_to_cwd(folder)) for folder in folders)
    if subcommand == "fit":
        raise CheckpointNotFound(
            f"--ckpt_path last: nothing to resume, {where} holds no last.ckpt. Start a new run without --ckpt_path, "
            "or give the checkpoint callback the dirpath of the run to resume"
        )
    raise CheckpointNotFound(
        f"--ckpt_path last: {where} holds no last.ckpt, so there is no model to {subcommand}. Pass a checkpoint "
        "file (--ckpt_path PATH), or train first"
    )

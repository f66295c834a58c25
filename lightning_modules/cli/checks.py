"""Checks of a training command line that LightningCLI would otherwise leave to a traceback, or let pass and do the
wrong thing (evaluate a freshly initialised model, train from step 0 when asked to resume). Each raises a `UserError`
that names the file or option and the fix."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import yaml
from lightning.pytorch.accelerators import CUDAAccelerator, MPSAccelerator

from hf_transformer.errors import CheckpointNotFound, ConfigError, why_unwritable

from ..callbacks.resume import relative_to_cwd

# `ckpt_path` values that Lightning resolves itself rather than reading a file of that name.
SPECIAL_CKPT_PATHS = ("last", "best", "hpc", "registry")
EVALUATION_COMMANDS = ("validate", "test", "predict")


# Class paths that configs of hf-transformer 0.3 name (its run folders' config.yaml among them), and where the classes
# are since 0.4.
MOVED_CLASSES = {
    "lightning_modules.attention_callback.AttentionMap": "lightning_modules.callbacks.AttentionMap",
    "lightning_modules.hub_callback.PushToHubCallback": "lightning_modules.callbacks.PushToHubCallback",
    "lightning_modules.callbacks.AutoWandbLogger": "lightning_modules.loggers.AutoWandbLogger",
    "hf_transformer.modeling_transformer.": "hf_transformer.model.modeling_transformer.",
}
# Options of 0.3 and 0.4 that are objects now, chosen by class path (docs/upgrading.md), and what replaces each. A
# checkpoint that holds them resumes (`lightning_modules.upgrade`); a config or command line that sets them is refused.
_COOLDOWN = "lightning_modules.experimental.InverseSquareRootWithCooldown"
REPLACED_OPTIONS = {
    "model.peak_lr": "the schedule is an object: set model.schedule.peak_lr (lightning_modules.schedules."
    "InverseSquareRoot, the default schedule)",
    "model.warmup_steps": "the schedule is an object: set model.schedule.warmup_steps (lightning_modules.schedules."
    "InverseSquareRoot, the default schedule)",
    "model.cooldown_steps": f"a cool-down is the schedule {_COOLDOWN}: set model.schedule.class_path to it and "
    "model.schedule.init_args.cooldown_steps",
    "model.rdrop_alpha": "R-Drop is the module lightning_modules.experimental.RDropTranslationModule: set "
    "model.class_path to it and model.init_args.alpha",
    "data.bpe_dropout": "BPE-dropout is the data module lightning_modules.experimental.BPEDropoutDataModule: set "
    "data.class_path to it and data.init_args.bpe_dropout",
}


def check_config_files(args: list[str]) -> None:
    """Name the --config file that is not valid YAML, and where (jsonargparse's message names no file), or that names
    a class where an earlier version had it."""
    for option, value in zip(args, [*args[1:], ""], strict=True):
        if option.startswith("--config="):
            option, value = "--config", option.removeprefix("--config=")
        path = Path(value)
        if option != "--config" or not path.is_file():
            continue
        text = path.read_text()
        try:
            yaml.safe_load(text)
        except yaml.MarkedYAMLError as error:
            where = f"{path}{_at(error.problem_mark)}: {error.problem}"
            if error.context:
                where += f" ({error.context}{_at(error.context_mark)})"
            raise ConfigError(f"{where}; fix the YAML syntax there") from error
        for number, line in enumerate(text.splitlines(), start=1):
            for old, new in MOVED_CLASSES.items():
                if old in line:
                    raise ConfigError(
                        f"{path}, line {number}: {old} is {new} since hf-transformer 0.4; write that class path there"
                    )
        for option, line in _options(yaml.compose(text)):
            if option in REPLACED_OPTIONS:
                raise ConfigError(f"{path}, line {line}: {option} is gone: {REPLACED_OPTIONS[option]}")


def _options(document: yaml.Node | None) -> Iterator[tuple[str, int]]:
    """The `section.key` options that a config document sets, with their lines, in the sections that name no class
    path (those of earlier versions: a section that names one holds this version's `init_args`)."""
    if not isinstance(document, yaml.MappingNode):
        return
    for section, body in document.value:
        if not isinstance(body, yaml.MappingNode) or any(key.value == "class_path" for key, _ in body.value):
            continue
        yield from ((f"{section.value}.{key.value}", key.start_mark.line + 1) for key, _ in body.value)


def _at(mark: yaml.Mark | None) -> str:
    return f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""


def check_devices(trainer: Any, config_files: list[Any]) -> None:
    """Refuse GPU settings on a machine without a GPU before the data and the model are built (Lightning stops only
    when it builds the trainer, with a traceback)."""
    accelerator = str(trainer.accelerator)
    fsdp = "fsdp" in str(trainer.strategy).lower()
    cuda = CUDAAccelerator.is_available()
    if fsdp and not cuda:
        raise ConfigError(
            f"{_origin(config_files, 'strategy')} asks for FSDP, which shards a model across CUDA GPUs, but torch "
            "finds none on this machine. Train on the CPU without that config (one process), or with DDP across CPU "
            "processes: --trainer.accelerator cpu --trainer.strategy ddp --trainer.devices 2"
        )
    if accelerator in ("gpu", "cuda") and not (cuda or (accelerator == "gpu" and MPSAccelerator.is_available())):
        raise ConfigError(
            f"{_origin(config_files, 'accelerator')} sets trainer.accelerator: {accelerator}, but torch finds no GPU "
            "on this machine. Leave that config out, or set --trainer.accelerator cpu (DDP also runs on CPU "
            "processes: --trainer.devices 2)"
        )


def _origin(config_files: list[Any], key: str) -> str:
    """The last config file that sets trainer.`key`, or the command line."""
    origin = "the command line"
    for path in config_files:
        try:
            settings = yaml.safe_load(Path(str(path)).read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(settings, dict) and key in (settings.get("trainer") or {}):
            origin = str(path)
    return origin


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


def check_output_folders(subcommand: str | None, config: Any) -> None:
    """Refuse, before the data is read or a tokenizer trained, a run folder that cannot be written:
    trainer.default_root_dir (the logs, and by default the checkpoints and the tokenizer) and, for `fit`, the
    checkpoint folder. A remote URL (s3://...) is left to its file system."""
    folders = {"trainer.default_root_dir": config.trainer.default_root_dir or "."}
    if subcommand in (None, "fit"):
        folders["checkpoint.dirpath"] = config.checkpoint.dirpath
    for setting, folder in folders.items():
        if folder and "://" not in str(folder) and (reason := why_unwritable(folder)) is not None:
            raise ConfigError(f"{setting} {folder}: cannot write there ({reason}). Give a folder you can write to")

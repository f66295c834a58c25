"""LightningCLI with the project's links and one-line reports of mistakes in options and config files."""

import dataclasses
import difflib
import importlib
import json
import logging
import re
import sys
import warnings
from pathlib import Path
from typing import Any, NoReturn

import datasets
from jsonargparse import Namespace
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from hf_transformer import TransformerConfig
from hf_transformer.errors import ConfigError, UserError
from hf_transformer.scoring import format_scores, translation_scores

from ..callbacks import LineProgress, ResumableCheckpoint
from ..checkpoint import read_checkpoint
from ..data import TranslationDataModule
from ..export import keep_test_scores
from ..module import (
    TranslationModule,
    check_cooldown,
    check_module_arguments,
    check_resumable,
    model_config,
)
from .checks import check_config_files, check_devices, check_last_checkpoint, check_model_source


def _is_not_an_advertisement(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("💡 Tip:")  # Lightning's tips for its cloud products


def _quiet_output() -> None:
    """Output that reads well in a log file: no cloud tips, no progress bars redrawn in place by `datasets`, no
    warning about Lightning's own code that a user can do nothing about."""
    rank_zero_logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if _is_not_an_advertisement not in rank_zero_logger.filters:
        rank_zero_logger.addFilter(_is_not_an_advertisement)
    if not sys.stderr.isatty():
        datasets.disable_progress_bars()
    # Lightning 2.6 builds torch's LeafSpec, which torch deprecates (2.13 here: a FutureWarning at every fit and
    # test): Lightning's to change.
    leaf_spec = r"`isinstance\(treespec, LeafSpec\)` is deprecated"
    warnings.filterwarnings("ignore", message=leaf_spec, category=FutureWarning)


class TranslationArgumentParser(LightningArgumentParser):
    """Refuses abbreviated options (`--trainer.max_step` would silently set `max_steps`) and reports a mistake as one
    message naming the closest valid key, instead of jsonargparse's full usage text."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:  # a tentative parse inside jsonargparse, which catches the error
            super().error(message, ex)
        cause = ex
        while cause is not None and not isinstance(cause, UserError):  # e.g. raised by a link's function
            cause = cause.__cause__
        if cause is not None:
            raise cause  # its own message names the problem and the fix
        parser = getattr(ex, "subcommand_parser", None) or self
        valid_keys = list(parser.get_defaults().keys())
        # model.config is one dict-valued option: offer its fields too (--model.d_model -> --model.config.d_model).
        valid_keys += [f"model.config.{field.name}" for field in dataclasses.fields(TransformerConfig)]
        hints = []
        for key in re.findall(r"(?:--|')([A-Za-z_][\w.]*)", message):
            if key not in valid_keys:
                hints += [f"--{match}" for match in difflib.get_close_matches(key, valid_keys, n=1, cutoff=0.6)]
        hint = f" (did you mean {', '.join(dict.fromkeys(hints))}?)" if hints else ""
        raise ConfigError(f"{message}{hint}. `{parser.prog.replace(' [options]', '')} --help` lists the options.")


def model_positions(preset: str, config: dict[str, Any] | None, init_from: str | None) -> int:
    """The number of positions of the model that `TranslationModule` builds from these settings."""
    return model_config(preset, config, init_from).max_position_embeddings


def place_in_run_folder(config: Namespace) -> None:
    """The files of a run go into `trainer.default_root_dir` unless a setting names another folder: checkpoints/ and
    the trained tokenizer in tokenizer/. Set before instantiation: `--ckpt_path last` looks in the checkpoint folder
    before any callback is set up."""
    root = Path(config.trainer.default_root_dir or ".")
    if config.checkpoint.dirpath is None:
        config.checkpoint.dirpath = str(root / "checkpoints")
    if config.data.tokenizer is None and config.data.tokenizer_dir is None:
        config.data.tokenizer_dir = str(root / "tokenizer")


def progress_as_asked(trainer: Namespace) -> None:
    """Drop the default `LineProgress` where `trainer.enable_progress_bar` is false or the callbacks name another
    progress bar (e.g. `--trainer.callbacks+=TQDMProgressBar`): Lightning takes one progress bar, and none then."""
    if not isinstance(trainer.callbacks, list):
        return
    classes = [_class_of(callback.class_path) for callback in trainer.callbacks]
    others = [cls for cls in classes if issubclass(cls, ProgressBar) and not issubclass(cls, LineProgress)]
    if trainer.enable_progress_bar is False or others:
        kept = zip(trainer.callbacks, classes, strict=True)
        trainer.callbacks = [callback for callback, cls in kept if not issubclass(cls, LineProgress)]


def _class_of(class_path: str) -> type:
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


# What every run starts from (checkpoints, logging, progress); a config file states only what differs.
DEFAULTS = str(Path(__file__).with_name("defaults.yaml"))
# ... and validate and test besides: their scores printed once, not also as Lightning's table.
EVALUATION_DEFAULTS = str(Path(__file__).with_name("evaluation.yaml"))


def _defaults_for(run: bool) -> dict[str, Any]:
    """Where the parser reads DEFAULTS: in each subcommand's parser, or, without a subcommand (run=False, as in tests
    and notebooks), in the one parser there is."""
    if not run:
        return {"default_config_files": [DEFAULTS]}
    return {
        "fit": {"default_config_files": [DEFAULTS]},
        "validate": {"default_config_files": [DEFAULTS, EVALUATION_DEFAULTS]},
        "test": {"default_config_files": [DEFAULTS, EVALUATION_DEFAULTS]},
    }


class TranslationCLI(LightningCLI):
    def __init__(self, args: list[str] | None = None, **kwargs: Any) -> None:
        _quiet_output()
        super().__init__(
            TranslationModule,
            TranslationDataModule,
            args=args,
            parser_class=TranslationArgumentParser,
            parser_kwargs={"prog": "hf-transformer", **_defaults_for(run=kwargs.get("run", True))},
            trainer_defaults={"use_distributed_sampler": False},  # the data module shards its token-budget batches
            save_config_kwargs={"overwrite": True},
            # No --optimizer / --lr_scheduler: they would silently replace the module's AdamW and warm-up schedule
            # (configure_optimizers; set through model.peak_lr, model.warmup_steps, model.betas...).
            auto_configure_optimizers=False,
            **kwargs,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # The checkpoint callback of every run, set under `checkpoint:`; a config file states only what differs.
        parser.add_lightning_class_args(ResumableCheckpoint, "checkpoint")
        # The logs go into the run folder too.
        parser.link_arguments("trainer.default_root_dir", "trainer.logger.init_args.save_dir")
        # The tokenizer decides the vocabulary and special ids: the model takes them from the data module's.
        parser.link_arguments("data.tokenizer", "model.tokenizer", apply_on="instantiate")
        # The model decides how long a sequence may be: the data keeps and cuts pairs to its positions.
        for side in ("source", "target"):
            parser.link_arguments(
                ("model.preset", "model.config", "model.init_from"), f"data.max_{side}_positions", model_positions
            )

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        if args is None or isinstance(args, list):
            check_config_files(sys.argv[1:] if args is None else args)
        super().parse_arguments(parser, args)
        # LightningCLI reads the hyperparameters of a --ckpt_path file next, and names no file when it cannot.
        ckpt_path = self.config.get(f"{self.config.get('subcommand')}.ckpt_path")
        if ckpt_path and Path(ckpt_path).is_file():
            check_resumable(ckpt_path, read_checkpoint(ckpt_path, mmap=True))

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        # The data module is built first (the model takes the vocabulary from it) and trains a tokenizer: check the
        # training settings before that work.
        check_module_arguments(config.model)
        if self.subcommand == "fit":
            check_cooldown(config.model, config.trainer.max_steps)
        if config.trainer.enable_checkpointing is False:
            raise ConfigError(
                "trainer.enable_checkpointing=false: every run checkpoints (to resume, to average, to export); write "
                "fewer with a larger checkpoint.every_n_train_steps or a smaller checkpoint.save_top_k"
            )
        check_devices(config.trainer, config.config or [])
        progress_as_asked(config.trainer)
        if self.subcommand:
            check_model_source(self.subcommand, config.ckpt_path, config.model.init_from)
        place_in_run_folder(config)

    def before_fit(self) -> None:
        check_last_checkpoint(self.subcommand, self.config_init[self.subcommand].ckpt_path, self.trainer)

    before_validate = before_test = before_predict = before_fit

    def after_test(self) -> None:
        """Write the test hypotheses, one per line in test-set order, and every score a paper might report (each
        labelled with how it was computed, `hf_transformer.scoring`) next to them, and print the scores."""
        hypotheses, references = self.model.test_translations
        if not self.trainer.is_global_zero:
            return
        folder = Path(self.trainer.log_dir or self.trainer.default_root_dir)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "test_hypotheses.txt").write_text("".join(f"{line}\n" for line in hypotheses))
        target_lang = self.datamodule.hparams.target_lang
        scores = translation_scores(hypotheses, references, target_lang if len(target_lang) == 2 else "en")
        # name -> value, as `hf-transformer push --results` reads it; how each was computed is printed below.
        values = {
            name: float(value) for name, value in self.trainer.callback_metrics.items() if name.startswith("test/")
        }
        values.update({score.name: score.value for score in scores})
        (folder / "test_scores.json").write_text(json.dumps(values, indent=2) + "\n")
        print(f"{format_scores(scores)}\nTest hypotheses and scores written to {folder}")
        # Beside the checkpoint too, for the card of an export or push of it.
        if self.trainer.ckpt_path and Path(self.trainer.ckpt_path).is_file():
            keep_test_scores(self.trainer.ckpt_path, values, folder)

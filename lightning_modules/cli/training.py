"""LightningCLI with the project's links and one-line reports of mistakes in options and config files."""

import dataclasses
import difflib
import importlib
import inspect
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

from hf_transformer import TransformerConfig, TransformerForConditionalGeneration
from hf_transformer.decoding.ensemble import AVERAGES, check_same_tokenizer
from hf_transformer.errors import ConfigError, UserError
from hf_transformer.scoring import format_scores, translation_scores

from ..callbacks import LineProgress, ResumableCheckpoint
from ..callbacks.resume import InterruptibleTrainer
from ..checkpoint import read_checkpoint
from ..checkpoint_export import keep_test_scores
from ..data import TranslationDataModule
from ..module import TranslationModule, model_config
from ..schedules import PAPER_SCHEDULE, Schedule
from ..upgrade import check_resumable, class_path, upgraded_module_arguments
from .checks import (
    REPLACED_OPTIONS,
    check_config_files,
    check_devices,
    check_last_checkpoint,
    check_model_source,
    check_output_folders,
)


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

    def parse_object(self, cfg_obj: Any, *args: Any, **kwargs: Any) -> Namespace:
        """jsonargparse's `parse_object`, with the training module arguments of 0.3 and 0.4 in this version's layout
        (`upgrade.py`): LightningCLI parses a --ckpt_path file's module arguments with it, so that an old checkpoint
        resumes with its schedule and R-Drop."""
        return super().parse_object(upgraded_config(cfg_obj), *args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:  # a tentative parse inside jsonargparse, which catches the error
            super().error(message, ex)
        cause = ex
        while cause is not None and not isinstance(cause, UserError):  # e.g. raised by a link's function
            cause = cause.__cause__
        if cause is not None:
            raise cause  # its own message names the problem and the fix
        parser = getattr(ex, "subcommand_parser", None) or self
        message = one_line(message)
        defaults = parser.get_defaults()  # a jsonargparse Namespace: its keys are the options, dotted
        valid_keys = [key.replace(".init_args.", ".") for key in defaults.keys()]  # noqa: SIM118
        # model.config is one dict-valued option: offer its fields too (--model.d_model -> --model.config.d_model),
        # and so are the default schedule's arguments.
        valid_keys += [f"model.config.{field.name}" for field in dataclasses.fields(TransformerConfig)]
        valid_keys += [f"model.schedule.{name}" for name in inspect.signature(type(PAPER_SCHEDULE)).parameters]
        hints = []
        for key in re.findall(r"(?:--|')([A-Za-z_][\w.]*)", message):
            key = key.replace(".init_args.", ".")
            if key in REPLACED_OPTIONS:  # an option of an earlier version: one line naming what replaces it
                raise ConfigError(f"--{key} is gone: {REPLACED_OPTIONS[key]}")
            if key not in valid_keys:
                hints += [f"--{match}" for match in difflib.get_close_matches(key, valid_keys, n=1, cutoff=0.6)]
        hint = f" (did you mean {', '.join(dict.fromkeys(hints))}?)" if hints else ""
        command = parser.prog.replace(" [options]", "")
        raise ConfigError(
            f"{message}{hint}. `{command} --help` lists the options (`{command} --model.help TranslationModule` the "
            "model's)."
        )


def one_line(message: str) -> str:
    """jsonargparse's report of a mistake in the arguments of a class chosen by class path (the model, its schedule),
    which spans lines with the problem innermost, as one line that names the option: "--model.d_model=64: no such
    option"."""
    section = re.match(r'Parser key "([\w.]+)":\n', message)
    given = re.search(r"NestedArg\(key='([\w.]+)', val='?(.*?)'?\)\s*$", message)
    if section is None or given is None:
        return message
    boilerplate = ("Parser key", "Does not validate", "Subtypes:", "Errors:", "Given value", "Problem with given")
    lines = [line.strip().removeprefix("- ") for line in message.splitlines()[1:]]
    problems = [line for line in lines if line and not line.startswith(boilerplate) and "NoneType" not in line]
    problem = re.sub(r"^Option '[\w.]+' is not accepted", "no such option", problems[0] if problems else lines[-1])
    return f"--{section.group(1)}.{given.group(1)}={given.group(2)}: {problem}"


def upgraded_config(cfg_obj: Any) -> Any:
    """A config object (a dict, as LightningCLI parses a checkpoint's module arguments) whose `model` sections hold
    the flat training arguments of 0.3 or 0.4, with those sections in this version's layout: a class path and its
    init_args."""
    if not isinstance(cfg_obj, dict):
        return cfg_obj
    sections = [cfg_obj, *(value for value in cfg_obj.values() if isinstance(value, dict))]
    for section in sections:
        model = section.get("model")
        if isinstance(model, dict) and "class_path" not in model:
            upgraded = upgraded_module_arguments(model)
            if upgraded is not model:
                path = upgraded.pop("_class_path", class_path(TranslationModule))
                section["model"] = {"class_path": path, "init_args": upgraded}
    return cfg_obj


def init_args(section: Namespace) -> Namespace:
    """The arguments of a class of the config: `init_args` of a section chosen by class path."""
    return section.init_args if "init_args" in section else section


def place_in_run_folder(config: Namespace) -> None:
    """The files of a run go into `trainer.default_root_dir` unless a setting names another folder: checkpoints/ and
    the trained tokenizer in tokenizer/. Set before instantiation: `--ckpt_path last` looks in the checkpoint folder
    before any callback is set up."""
    root, data = Path(config.trainer.default_root_dir or "."), init_args(config.data)
    if config.checkpoint.dirpath is None:
        config.checkpoint.dirpath = str(root / "checkpoints")
    if data.tokenizer is None and data.tokenizer_dir is None:
        data.tokenizer_dir = str(root / "tokenizer")


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


def schedule_of(section: Namespace | Schedule) -> Schedule:
    """The schedule that a `model.schedule` section names (a class path and its init_args), made: it checks its
    arguments."""
    if isinstance(section, Schedule):
        return section
    arguments = section.get("init_args")
    return _class_of(section.class_path)(**(arguments.as_dict() if arguments else {}))


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
        # The model config of each model setting this run parsed: built once, however many links and checks ask.
        self._model_configs: dict[str, TransformerConfig] = {}
        super().__init__(
            TranslationModule,
            TranslationDataModule,
            args=args,
            # model.class_path and data.class_path choose a variant (lightning_modules.experimental); without one,
            # TranslationModule and TranslationDataModule.
            subclass_mode_model=True,
            subclass_mode_data=True,
            parser_class=TranslationArgumentParser,
            parser_kwargs={"prog": "hf-transformer", **_defaults_for(run=kwargs.get("run", True))},
            trainer_class=kwargs.pop("trainer_class", InterruptibleTrainer),  # a Ctrl-C stops after its step
            trainer_defaults={"use_distributed_sampler": False},  # the data module shards its token-budget batches
            save_config_kwargs={"overwrite": True},
            # No --optimizer / --lr_scheduler: they would silently replace the module's AdamW and warm-up schedule
            # (configure_optimizers; set through model.schedule, model.betas...).
            auto_configure_optimizers=False,
            **kwargs,
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # The checkpoint callback of every run, set under `checkpoint:`; a config file states only what differs.
        parser.add_lightning_class_args(ResumableCheckpoint, "checkpoint")
        # The logs go into the run folder too.
        parser.link_arguments("trainer.default_root_dir", "trainer.logger.init_args.save_dir")
        parser.set_defaults(
            {
                "model": {"class_path": class_path(TranslationModule)},
                "data": {"class_path": class_path(TranslationDataModule)},
            }
        )
        # The tokenizer decides the vocabulary and special ids: the model takes them from the data module's.
        parser.link_arguments("data.tokenizer", "model.init_args.tokenizer", apply_on="instantiate")
        # The model decides how long a sequence may be: the data keeps and cuts pairs to its positions.
        model = ("model.init_args.preset", "model.init_args.config", "model.init_args.init_from")
        for side in ("source", "target"):
            parser.link_arguments(model, f"data.init_args.max_{side}_positions", self.model_positions)
        # An ensemble for validate and test: not the module's (its models are no part of what fit trains or saves).
        parser.add_argument(
            "--ensemble_with",
            nargs="+",
            default=[],
            metavar="MODEL",
            help="validate and test: translate with the model (--ckpt_path or --model.init_from) and these models "
            "(exported folders or .ckpt files trained with the same tokenizer) as an ensemble. The BLEU, chrF and "
            "hypotheses are the ensemble's; no loss is logged (it is one model's)",
        )
        parser.add_argument(
            "--ensemble_average",
            choices=AVERAGES,
            default=AVERAGES[0],
            help="how the ensemble combines the models' next-token distributions: the mean of their probabilities "
            "(fairseq's) or of their log-probabilities (OpenNMT-py's)",
        )

    def model_config(self, preset: str, config: dict[str, Any] | None, init_from: str | None) -> TransformerConfig:
        """The config of the model that these settings make (`lightning_modules.module.model_config`), built once
        per run and setting: the links to the data and the checks before any work share it."""
        key = json.dumps([preset, config, init_from], sort_keys=True, default=str)
        if key not in self._model_configs:
            self._model_configs[key] = model_config(preset, config, init_from)
        return self._model_configs[key]

    def model_positions(self, preset: str, config: dict[str, Any] | None, init_from: str | None) -> int:
        """The number of positions of the model that `TranslationModule` builds from these settings."""
        return self.model_config(preset, config, init_from).max_position_embeddings

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
        model = init_args(config.model)
        # The data module is built first (the model takes the vocabulary from it) and trains a tokenizer: check the
        # module's settings, its schedule and the model config before that work.
        _class_of(config.model.class_path).check_arguments(model)
        schedule = schedule_of(model.schedule)
        if self.subcommand == "fit":
            schedule.check(config.trainer.max_steps)
        self.model_config(model.preset, model.config, model.init_from)
        if config.trainer.enable_checkpointing is False:
            raise ConfigError(
                "trainer.enable_checkpointing=false: every run checkpoints (to resume, to average, to export); write "
                "fewer with a larger checkpoint.every_n_train_steps or a smaller checkpoint.save_top_k"
            )
        check_devices(config.trainer, config.config or [])
        progress_as_asked(config.trainer)
        if self.subcommand:
            check_model_source(self.subcommand, config.ckpt_path, model.init_from)
        if config.ensemble_with and self.subcommand not in ("validate", "test"):
            raise ConfigError(
                f"--ensemble_with is for validate and test, which translate with an ensemble; {self.subcommand} trains "
                "one model. Train each member as its own run (--seed_everything N) and test them together"
            )
        place_in_run_folder(config)
        check_output_folders(self.subcommand, config)

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as error:
            # jsonargparse reports a class chosen by class path that refused its arguments as a list of the types it
            # tried; a `UserError` among the causes names the problem and the fix by itself.
            cause: BaseException | None = error
            while cause is not None and not isinstance(cause, UserError):
                cause = cause.__cause__ or cause.__context__
            if cause is None:
                raise
            raise cause from error

    def before_fit(self) -> None:
        check_last_checkpoint(self.subcommand, self.config_init[self.subcommand].ckpt_path, self.trainer)

    before_predict = before_fit

    def before_test(self) -> None:
        self.before_fit()
        config = self.config_init[self.subcommand]
        if config.ensemble_with:
            self.model.decode_with(ensemble_members(config, self.model.tokenizer), config.ensemble_average)

    before_validate = before_test

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
        members = self.config_init[self.subcommand].ensemble_with
        if members:
            print(
                f"Translated by the ensemble of the model and {', '.join(members)} (mean of the "
                f"{self.model.ensemble_average}); no loss is logged: it is one model's"
            )
        print(f"{format_scores(scores)}\nTest hypotheses and scores written to {folder}")
        # Beside the checkpoint too, for the card of an export or push of it: the scores of these weights alone, not
        # of an ensemble they were part of.
        if not members and self.trainer.ckpt_path and Path(self.trainer.ckpt_path).is_file():
            keep_test_scores(self.trainer.ckpt_path, values, folder)


def ensemble_members(config: Namespace, tokenizer: Any) -> list[TransformerForConditionalGeneration]:
    """The models of --ensemble_with, each checked to share `tokenizer`, the module's (its data's)."""
    from .arguments import load_engine

    first = config.ckpt_path or init_args(config.model).init_from
    models = []
    for source in config.ensemble_with:
        engine = load_engine(source)
        if engine.model is None:
            raise ConfigError(
                f"--ensemble_with {source} is a CTranslate2 model: pass the checkpoint or the folder "
                "exported with --format hf-transformer"
            )
        check_same_tokenizer(first, tokenizer, source, engine.tokenizer)
        models.append(engine.model)
    return models

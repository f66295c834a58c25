"""The training module arguments of checkpoints of earlier versions, in this version's layout, so that they resume.

0.3 and 0.4 took the schedule and R-Drop as flat arguments of `TranslationModule` (`peak_lr`, `warmup_steps`,
`cooldown_steps`, `rdrop_alpha`); they are now a schedule object (`model.schedule`) and a subclass chosen by class
path (`lightning_modules.experimental`). Older layouts (0.1, 0.2: the model sizes as module arguments) are refused,
naming the version that resumes them."""

import importlib
import importlib.metadata
import inspect
from typing import Any

from hf_transformer.errors import CheckpointError
from hf_transformer.hub.model_card import TRAINING_DESCRIPTION

from .experimental import InverseSquareRootWithCooldown, RDropTranslationModule
from .module import TranslationModule
from .schedules import InverseSquareRoot, Schedule

# The module arguments of 0.3 and 0.4 that are objects now.
FLAT_TRAINING_ARGUMENTS = ("peak_lr", "warmup_steps", "cooldown_steps", "rdrop_alpha")
# Keys that LightningCLI adds to the hyperparameters it saves.
CLI_KEYS = ("_instantiator", "_class_path")


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def upgraded_module_arguments(hparams: dict[str, Any]) -> dict[str, Any]:
    """`hparams` (a checkpoint's `hyper_parameters`) in this version's layout: the flat schedule and R-Drop arguments
    of 0.3 and 0.4 become `schedule` ({class_path, init_args}) and, with R-Drop, `_class_path` and `alpha`, as
    LightningCLI saves a module chosen by class path. Arguments in this layout come back unchanged."""
    if not any(name in hparams for name in FLAT_TRAINING_ARGUMENTS):
        return hparams
    upgraded = {name: value for name, value in hparams.items() if name not in FLAT_TRAINING_ARGUMENTS}
    peak_lr, warmup_steps = hparams.get("peak_lr"), hparams.get("warmup_steps", 4000)
    schedule: Schedule = InverseSquareRoot(peak_lr, warmup_steps)
    if hparams.get("cooldown_steps"):
        schedule = InverseSquareRootWithCooldown(hparams["cooldown_steps"], peak_lr, warmup_steps)
    upgraded["schedule"] = schedule.hyperparameters()
    if hparams.get("rdrop_alpha"):
        upgraded |= {"_class_path": class_path(RDropTranslationModule), "alpha": hparams["rdrop_alpha"]}
    return upgraded


def module_class(hparams: dict[str, Any]) -> type[TranslationModule]:
    """The training module class that `hparams` name (`_class_path`, where LightningCLI saved one), or
    `TranslationModule`."""
    path = hparams.get("_class_path")
    if not path:
        return TranslationModule
    module, _, name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise CheckpointError(f"the checkpoint's training module {path} cannot be imported ({error})") from error
    if not (isinstance(cls, type) and issubclass(cls, TranslationModule)):
        raise CheckpointError(f"the checkpoint's training module {path} is no TranslationModule")
    return cls


def module_arguments(cls: type[TranslationModule]) -> set[str]:
    """The arguments that `cls` takes: its own and those of each TranslationModule it passes `**kwargs` on to."""
    names: set[str] = set()
    for ancestor in cls.__mro__:
        if isinstance(ancestor, type) and issubclass(ancestor, TranslationModule):
            parameters = inspect.signature(ancestor).parameters.values()
            names |= {parameter.name for parameter in parameters if parameter.kind != parameter.VAR_KEYWORD}
    return names


def check_resumable(path: str, checkpoint: dict[str, Any]) -> None:
    """Refuse a checkpoint whose module arguments this version does not take, even upgraded, saying which version
    wrote it; its model still exports (`hf-transformer export` reads every version) and trains further with
    model.init_from."""
    hparams = upgraded_module_arguments(checkpoint.get("hyper_parameters", {}))
    unknown = sorted(set(hparams) - module_arguments(module_class(hparams)) - set(CLI_KEYS))
    if not unknown:
        return
    version = checkpoint.get("hf_transformer_version", "a version before 0.2.0")
    raise CheckpointError(
        f"{path} was written by hf-transformer {version}, whose training module took {', '.join(unknown[:4])}; this "
        f"version ({importlib.metadata.version('hf-transformer')}) takes every model setting, label smoothing "
        f"included, under model.preset and model.config. Resume it with the version that wrote it ({version}), or "
        f"export it (hf-transformer export {path} exports/old) and train on from that folder with --model.init_from "
        "exports/old."
    )


def describe_training(checkpoint: dict[str, Any]) -> list[tuple[str, str]]:
    """How the checkpoint's module trained, in words, for the model card: as the module wrote it, or, for a
    checkpoint of 0.3 or 0.4, from its upgraded arguments (the schedule's own description; R-Drop's row)."""
    if TRAINING_DESCRIPTION in checkpoint:
        return [tuple(row) for row in checkpoint[TRAINING_DESCRIPTION]]
    hparams = checkpoint.get("hyper_parameters") or {}
    if not any(name in hparams for name in FLAT_TRAINING_ARGUMENTS):
        return []  # an older layout, or no module arguments: the card shows what was recorded
    upgraded = upgraded_module_arguments(hparams)
    schedule_class = InverseSquareRootWithCooldown if hparams.get("cooldown_steps") else InverseSquareRoot
    schedule = schedule_class(**upgraded["schedule"]["init_args"])
    rows = [("Learning-rate schedule", schedule.describe(checkpoint["hf_config"]["d_model"]))]
    if "alpha" in upgraded:
        rows.append(RDropTranslationModule.description(upgraded["alpha"]))
    return rows


def described(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """`checkpoint` with its training described for the model card (`describe_training`), which one of 0.3 or 0.4 does
    not hold: what `export_checkpoint` is given by the commands that export a checkpoint."""
    return {**checkpoint, TRAINING_DESCRIPTION: describe_training(checkpoint)}

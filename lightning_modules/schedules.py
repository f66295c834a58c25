"""Learning-rate schedules: small objects that `TranslationModule` takes as `model.schedule`, chosen by class path in
YAML. Each checks its own settings, gives the rate of every update as a `LambdaLR` multiplier of a base learning rate
of 1, and describes itself in words (the model card's schedule row). Schedules whose experiment did not pay live in
`lightning_modules.experimental`."""

import inspect
import math
from collections.abc import Callable
from typing import Any

from hf_transformer.errors import ConfigError


def inverse_sqrt_lr_lambda(peak_lr: float, warmup_steps: int) -> Callable[[int], float]:
    """lr = peak_lr * min(step / warmup, sqrt(warmup / step)) for update step = 1, 2, ...: a linear warm-up to
    `peak_lr` at step `warmup_steps`, then decay with the inverse square root of the step (fairseq's inverse_sqrt). A
    LambdaLR multiplier of a base lr of 1; LambdaLR evaluates step 0 at construction, so the formula gets step + 1.

    Not transformers' `get_inverse_sqrt_schedule`: it is this curve one update late (it evaluates the number of updates
    already taken, so the first update gets lr 0 and the peak comes at update warmup + 1), and it has no offset to
    set; its base lr is the peak, so checkpoints saved with a base lr of 1 would resume at the wrong rate.
    """

    def lr_lambda(step: int) -> float:
        step += 1
        return peak_lr * min(step / warmup_steps, math.sqrt(warmup_steps / step))

    return lr_lambda


def noam_lr_lambda(d_model: int, warmup_steps: int) -> Callable[[int], float]:
    """The paper's lr = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (section 5.3, eq. 3): the inverse square
    root curve with its peak, (d_model * warmup)^-0.5, at step `warmup_steps`."""
    return inverse_sqrt_lr_lambda((d_model * warmup_steps) ** -0.5, warmup_steps)


class Schedule:
    """A learning-rate schedule of `TranslationModule` (`model.schedule`: a `class_path` and its `init_args`). A
    subclass keeps each argument of its `__init__` as an attribute of the same name, so that `hyperparameters` can
    write it back as a config names it."""

    def check(self, max_steps: int) -> None:
        """Refuse settings that do not fit a run of `max_steps` updates (`trainer.max_steps`, -1: no limit), naming
        the setting; the arguments themselves are checked when the schedule is made."""

    def lr_lambda(self, d_model: int, max_steps: int) -> Callable[[int], float]:
        """The learning rate of update step + 1, for `LambdaLR` over a base learning rate of 1."""
        raise NotImplementedError

    def describe(self, d_model: int) -> str:
        """The schedule in words, for the model card."""
        raise NotImplementedError

    def hyperparameters(self) -> dict[str, Any]:
        """The schedule as a config file names it and a checkpoint keeps it: its class path and arguments."""
        arguments = inspect.signature(type(self)).parameters
        return {
            "class_path": f"{type(self).__module__}.{type(self).__qualname__}",
            "init_args": {name: getattr(self, name) for name in arguments},
        }

    def __repr__(self) -> str:
        arguments = ", ".join(f"{name}={value!r}" for name, value in self.hyperparameters()["init_args"].items())
        return f"{type(self).__name__}({arguments})"


class InverseSquareRoot(Schedule):
    """A linear warm-up over `warmup_steps` updates to the peak learning rate, then decay with the inverse square root
    of the update (the paper's section 5.3; fairseq's inverse_sqrt).

    Args:
        peak_lr: the learning rate at the end of the warm-up; None is the paper's eq. 3, whose peak is
            (d_model * warmup_steps)^-0.5.
        warmup_steps: updates of linear warm-up (4000 in the paper).
    """

    def __init__(self, peak_lr: float | None = None, warmup_steps: int = 4000) -> None:
        if warmup_steps < 1:
            raise ConfigError(
                f"model.schedule.warmup_steps={warmup_steps!r} must be at least 1 (the paper warms up for 4000 steps)"
            )
        if peak_lr is not None and not peak_lr > 0:
            raise ConfigError(f"model.schedule.peak_lr={peak_lr!r} must be positive, or null for the paper's schedule")
        self.peak_lr, self.warmup_steps = peak_lr, warmup_steps

    def lr_lambda(self, d_model: int, max_steps: int) -> Callable[[int], float]:
        if self.peak_lr is None:
            return noam_lr_lambda(d_model, self.warmup_steps)
        return inverse_sqrt_lr_lambda(self.peak_lr, self.warmup_steps)

    def describe(self, d_model: int) -> str:
        if self.peak_lr is None:
            peak = (d_model * self.warmup_steps) ** -0.5
            return (
                "the paper's (section 5.3): d_model^-0.5 x min(step^-0.5, step x warmup^-1.5), "
                f"{self.warmup_steps} warm-up steps (peak {peak:.3g})"
            )
        return f"inverse square root: peak {self.peak_lr} after {self.warmup_steps} linear warm-up steps"


# The paper's schedule (section 5.3): the default of `TranslationModule`; schedules are not changed once made.
PAPER_SCHEDULE = InverseSquareRoot()

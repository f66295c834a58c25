"""A cool-down at the end of the inverse square root: the decay phase of warm-up-stable-decay schedules (Hägele et al.
2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations"). Measured at the Multi30k recipe's
budget, it gave the last checkpoint what averaging the last ten gives, and nothing on top (docs/experiments.md), so the
shipped configs keep the paper's schedule."""

from collections.abc import Callable

from hf_transformer.errors import ConfigError

from ..schedules import InverseSquareRoot


def with_cooldown(lr_lambda: Callable[[int], float], cooldown_steps: int, max_steps: int) -> Callable[[int], float]:
    """`lr_lambda` until `cooldown_steps` before `max_steps`, then a straight line from its value there to 0 at
    `max_steps`: a run of known length ends at a low learning rate, where the inverse square root alone would still be
    high."""
    start = max_steps - cooldown_steps
    at_start = lr_lambda(start)

    def cooled(step: int) -> float:
        if step < start:
            return lr_lambda(step)
        return at_start * max(0.0, (max_steps - step) / cooldown_steps)

    return cooled


class InverseSquareRootWithCooldown(InverseSquareRoot):
    """`InverseSquareRoot`, whose last `cooldown_steps` updates of `trainer.max_steps` decay linearly to 0:

        schedule:
          class_path: lightning_modules.experimental.InverseSquareRootWithCooldown
          init_args: {cooldown_steps: 3000, peak_lr: 0.005, warmup_steps: 2000}

    Args:
        cooldown_steps: the last updates of the run, which take the learning rate linearly down to 0 at
            `trainer.max_steps`.
        peak_lr: the learning rate at the end of the warm-up; None is the paper's eq. 3.
        warmup_steps: updates of linear warm-up.
    """

    def __init__(self, cooldown_steps: int, peak_lr: float | None = None, warmup_steps: int = 4000) -> None:
        super().__init__(peak_lr, warmup_steps)
        if cooldown_steps < 1:
            raise ConfigError(
                f"model.schedule.cooldown_steps={cooldown_steps!r} must be at least 1 (without a cool-down, the "
                "schedule is lightning_modules.schedules.InverseSquareRoot)"
            )
        self.cooldown_steps = cooldown_steps

    def check(self, max_steps: int) -> None:
        """Refuse a cool-down that does not fit between the warm-up and `trainer.max_steps` (also -1: no limit)."""
        needed = self.warmup_steps + self.cooldown_steps
        if max_steps < needed:
            raise ConfigError(
                f"model.schedule.cooldown_steps={self.cooldown_steps} needs trainer.max_steps ({max_steps}) of at "
                f"least model.schedule.warmup_steps + model.schedule.cooldown_steps ({needed}): the cool-down ends at "
                "trainer.max_steps"
            )

    def lr_lambda(self, d_model: int, max_steps: int) -> Callable[[int], float]:
        self.check(max_steps)
        return with_cooldown(super().lr_lambda(d_model, max_steps), self.cooldown_steps, max_steps)

    def describe(self, d_model: int) -> str:
        return (
            f"{super().describe(d_model)}, then a cool-down: the last {self.cooldown_steps} steps decay linearly to 0"
        )

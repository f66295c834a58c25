"""Learning-rate schedules, as `LambdaLR` multipliers of a base learning rate of 1."""

import math
from collections.abc import Callable


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


def with_cooldown(lr_lambda: Callable[[int], float], cooldown_steps: int, max_steps: int) -> Callable[[int], float]:
    """`lr_lambda` until `cooldown_steps` before `max_steps`, then a straight line from its value there to 0 at
    `max_steps` (the cool-down of warm-up-stable-decay schedules, Hägele et al. 2024, "Scaling Laws and Compute-Optimal
    Training Beyond Fixed Training Durations"): a run of known length ends at a low learning rate, where the inverse
    square root alone would still be high."""
    start = max_steps - cooldown_steps
    at_start = lr_lambda(start)

    def cooled(step: int) -> float:
        if step < start:
            return lr_lambda(step)
        return at_start * max(0.0, (max_steps - step) / cooldown_steps)

    return cooled


def noam_lr_lambda(d_model: int, warmup_steps: int) -> Callable[[int], float]:
    """The paper's lr = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (section 5.3, eq. 3): the inverse square
    root curve with its peak, (d_model * warmup)^-0.5, at step `warmup_steps`."""
    return inverse_sqrt_lr_lambda((d_model * warmup_steps) ** -0.5, warmup_steps)

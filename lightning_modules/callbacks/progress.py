"""`LineProgress`: training progress as plain lines, which read the same in a terminal and in a log file."""

import time
from collections import deque
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ProgressBar, Timer

from hf_transformer.model.loss import IGNORE_INDEX

from .resume import relative_to_cwd


class LineProgress(ProgressBar):
    """Progress as plain lines, which read the same in a terminal and in a log file: one when the check of validation
    before training starts (decoding takes a while with untrained weights), one after the first training step, then
    one every `every_n_steps` steps or `every_n_seconds` seconds, whichever comes first (loss, learning rate, target
    tokens/s, and the time left where trainer.max_steps or max_time bounds the run), one as each validation's
    decoding starts and one when it ends (loss, BLEU, chrF), and at the end of `fit` a summary: steps, time, BLEU,
    distinct sample translations, where the checkpoints and the tokenizer are, and the command that exports the model.
    A resumed run that has nothing left to train says so.

    The pace and the target tokens/s are those of the last `window_seconds` of training (validation left out), from
    the end of the first step on: the first step of a start or resume also pays for starting the data loader and
    allocating, so its line shows no time left yet. The time left adds, to the steps left at that pace, each
    validation still to come at the length of the last one."""

    def __init__(
        self,
        every_n_steps: int = 100,
        num_samples: int = 3,
        every_n_seconds: float = 60.0,
        window_seconds: float = 60.0,
    ) -> None:
        super().__init__()
        self.every_n_steps = every_n_steps
        self.every_n_seconds = every_n_seconds
        self.window_seconds = window_seconds
        self.num_samples = num_samples
        self._enabled = True
        self._started = self._printed_at = time.monotonic()
        self._printed_step: int | None = None
        self._start_step = 0
        self._resumed_step: int | None = None
        self._window: deque[tuple[float, int, Any]] = deque()  # (training clock, step, target tokens so far)
        self._tokens: Any = 0  # target tokens trained since the start or resume; a tensor, read only when printed
        self._validation_started: float | None = None
        self._validation_seconds = 0.0  # every validation's time within this fit, taken off the training clock
        self._last_validation: float | None = None

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def _print(self, trainer: pl.Trainer, line: str) -> None:
        if self._enabled and trainer.is_global_zero:
            print(line, flush=True)
            self._printed_at = time.monotonic()

    def _training_clock(self) -> float:
        return time.monotonic() - self._validation_seconds

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        self._resumed_step = checkpoint["global_step"]  # before `on_fit_start`, which sees the step only later

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._started = time.monotonic()
        self._start_step = self._resumed_step or 0
        verb = "Training" if self._resumed_step is None else "Resuming"
        self._print(trainer, f"{verb} from step {_step_of(trainer, self._start_step)} ({_count(pl_module)} parameters)")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._window.clear()
        self._tokens = 0
        self._validation_seconds, self._last_validation = 0.0, None

    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        batches = trainer.num_sanity_val_steps
        self._print(
            trainer,
            f"Checking validation on up to {batches} batch{'es' * (batches != 1)} before training "
            "(trainer.num_sanity_val_steps)",
        )

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if isinstance(batch, dict) and "labels" in batch:
            self._tokens = self._tokens + (batch["labels"] != IGNORE_INDEX).sum()  # a new object: the window keeps it
        if step == self._start_step:  # a micro-batch of the first step, accumulated
            return
        if not self._window or self._window[-1][1] != step:
            self._window.append((self._training_clock(), step, self._tokens))
            while len(self._window) > 2 and self._window[-1][0] - self._window[1][0] >= self.window_seconds:
                self._window.popleft()  # keeps the window spanning at least window_seconds once it can
        due = step % self.every_n_steps == 0 or step == self._start_step + 1
        due |= time.monotonic() - self._printed_at >= self.every_n_seconds
        if not due or step == self._printed_step:  # accumulated batches share a step
            return
        self._printed_step = step
        metrics = trainer.callback_metrics
        fields = [f"step {_step_of(trainer, step)}"]
        fields.append(_elapsed(time.monotonic() - self._started))
        left = self._time_left(trainer, step)
        if left is not None:
            fields.append(f"{_elapsed(left)} left")
        if "train/loss" in metrics:
            fields.append(f"loss {float(metrics['train/loss']):.3f}")
        learning_rates = [group["lr"] for optimizer in trainer.optimizers for group in optimizer.param_groups]
        if learning_rates:
            fields.append(f"lr {learning_rates[0]:.2e}")
        rate = self._target_tokens_per_second()
        if rate is not None:
            fields.append(f"{rate:,.0f} target tokens/s")
        self._print(trainer, " | ".join(fields))

    def _pace(self) -> float | None:
        """Seconds per step over the window; None before it holds two steps."""
        if len(self._window) < 2:
            return None
        (first_time, first_step, _), (last_time, last_step, _) = self._window[0], self._window[-1]
        return (last_time - first_time) / (last_step - first_step)

    def _target_tokens_per_second(self) -> float | None:
        if len(self._window) < 2:
            return None
        (first_time, _, first_tokens), (last_time, _, last_tokens) = self._window[0], self._window[-1]
        tokens = last_tokens - first_tokens
        if not isinstance(tokens, torch.Tensor) or last_time <= first_time:
            return None  # no batch counted (a loop of other batches)
        return float(tokens) / (last_time - first_time)

    def _time_left(self, trainer: pl.Trainer, step: int) -> float | None:
        """Until trainer.max_steps at the window's pace with the validations still to come, or what max_time leaves,
        whichever comes first; None when neither bounds the run or the pace is not measured yet."""
        bounds = [timer.time_remaining() for timer in trainer.callbacks if isinstance(timer, Timer)]
        pace = self._pace()
        if trainer.max_steps > 0 and pace is not None:
            validations = _validations_between(trainer, step, trainer.max_steps)
            bounds.append(pace * (trainer.max_steps - step) + validations * (self._last_validation or 0.0))
        bounds = [max(bound, 0.0) for bound in bounds if bound is not None]
        return min(bounds) if bounds else None

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return  # on_sanity_check_start said so
        self._validation_started = time.monotonic()
        beams = pl_module.model.generation_config.num_beams or 1
        search = f"beam search, {beams} beams" if beams > 1 else "greedy search"
        batches = sum(trainer.num_val_batches)
        self._print(
            trainer,
            f"validation at step {trainer.global_step}: translating {batches} batch{'es' * (batches != 1)} ({search})",
        )

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        if self._validation_started is not None:
            self._last_validation = time.monotonic() - self._validation_started
            self._validation_seconds += self._last_validation
            self._validation_started = None
        self._print(trainer, f"validation at step {trainer.global_step}: {_scores(trainer.callback_metrics, 'val')}")

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        resumed, self._resumed_step = self._resumed_step, None
        if not trainer.is_global_zero:
            return
        step, elapsed = trainer.global_step, _elapsed(time.monotonic() - self._started)
        if resumed == step:
            lines = ["", f"Nothing to train: {_finished(trainer, step)}"]
        else:
            trained = f"Trained {step} steps" if resumed is None else f"Trained from step {resumed} to {step}"
            scores = _scores(trainer.callback_metrics, "val")
            lines = ["", f"{trained} in {elapsed}" + (f"; validation: {scores}" if scores else "")]
            for source, reference, hypothesis in telling_samples(pl_module.val_samples, self.num_samples):
                lines += [f"  source:     {source}", f"  reference:  {reference}", f"  hypothesis: {hypothesis}"]
        checkpoint = trainer.checkpoint_callback
        if checkpoint is not None and checkpoint.dirpath:
            folder = relative_to_cwd(Path(checkpoint.dirpath))
            last = folder / f"{checkpoint.CHECKPOINT_NAME_LAST}{checkpoint.FILE_EXTENSION}"
            lines.append(f"Checkpoints: {folder}")
            datamodule = getattr(trainer, "datamodule", None)
            tokenizer_location = getattr(datamodule, "tokenizer_location", None)
            if tokenizer_location:
                lines.append(f"Tokenizer:   {tokenizer_location}")
            if last.exists():
                lines.append(f"Export it:   hf-transformer export {last} exports/<name>")
        print("\n".join(lines), flush=True)


def telling_samples(rows: list[list[str]], count: int) -> list[list[str]]:
    """`count` [source, reference, hypothesis] rows with distinct sources, spread over the sources' lengths (of three:
    a short, a middle and a long one). The first rows of a validation are its shortest, often one source repeated."""
    distinct = sorted({row[0]: row for row in rows}.values(), key=lambda row: len(row[0]))
    if len(distinct) <= count:
        return distinct
    return [distinct[int((i + 0.5) * len(distinct) / count)] for i in range(count)]


def _validations_between(trainer: pl.Trainer, step: int, last_step: int) -> int:
    """The validations still to come in training from the end of `step` (whose own validation, if due, follows its
    progress line) to `last_step`, where they come every val_check_interval batches across epochs
    (check_val_every_n_epoch null, as every config here sets); 0 where they come by epoch or time."""
    every = getattr(trainer, "val_check_batch", None)
    if getattr(trainer, "check_val_every_n_epoch", 1) is not None or not isinstance(every, int) or every <= 0:
        return 0
    batches_per_step = getattr(trainer, "accumulate_grad_batches", 1)
    return last_step * batches_per_step // every - (step * batches_per_step - 1) // every


def _finished(trainer: pl.Trainer, step: int) -> str:
    """Why a resumed run trained no step, and how to train it further."""
    if 0 < trainer.max_steps <= step:
        return (
            f"the run is at step {step}, its trainer.max_steps. To train it further, resume with a higher "
            "--trainer.max_steps"
        )
    return "the run has reached its trainer.max_time or max_epochs. To train it further, resume with a higher one"


def _step_of(trainer: pl.Trainer, step: int) -> str:
    return f"{step}/{trainer.max_steps}" if trainer.max_steps > 0 else str(step)


def _count(module: pl.LightningModule) -> str:
    return f"{sum(parameter.numel() for parameter in module.parameters()) / 1e6:.1f} M"


def _elapsed(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}:{seconds:02d}"


def _scores(metrics: dict[str, torch.Tensor], stage: str) -> str:
    names = {"loss": "loss {:.3f}", "bleu": "BLEU {:.1f}", "chrf": "chrF {:.1f}"}
    return ", ".join(
        form.format(float(metrics[f"{stage}/{name}"])) for name, form in names.items() if f"{stage}/{name}" in metrics
    )

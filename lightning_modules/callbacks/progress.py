"""`LineProgress`: training progress as plain lines, which read the same in a terminal and in a log file."""

import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ProgressBar, Timer

from .resume import relative_to_cwd


class LineProgress(ProgressBar):
    """Progress as plain lines, which read the same in a terminal and in a log file: one when the check of validation
    before training starts (decoding takes a while with untrained weights), one after the first training step, then
    one every `every_n_steps` steps or `every_n_seconds` seconds, whichever comes first (loss, learning rate, target
    tokens/s, and the time left where trainer.max_steps or max_time bounds the run), one as each validation's
    decoding starts and one when it ends (loss, BLEU, chrF), and at the end of `fit` a summary: steps, time, BLEU,
    distinct sample translations, where the checkpoints and the tokenizer are, and the command that exports the model.
    A resumed run that has nothing left to train says so."""

    def __init__(self, every_n_steps: int = 100, num_samples: int = 3, every_n_seconds: float = 60.0) -> None:
        super().__init__()
        self.every_n_steps = every_n_steps
        self.every_n_seconds = every_n_seconds
        self.num_samples = num_samples
        self._enabled = True
        self._started = self._printed_at = self._training_since = time.monotonic()
        self._printed_step: int | None = None
        self._start_step = 0
        self._resumed_step: int | None = None

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def _print(self, trainer: pl.Trainer, line: str) -> None:
        if self._enabled and trainer.is_global_zero:
            print(line, flush=True)
            self._printed_at = time.monotonic()

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        self._resumed_step = checkpoint["global_step"]  # before `on_fit_start`, which sees the step only later

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._started = time.monotonic()
        self._start_step = self._resumed_step or 0
        verb = "Training" if self._resumed_step is None else "Resuming"
        self._print(trainer, f"{verb} from step {_step_of(trainer, self._start_step)} ({_count(pl_module)} parameters)")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._training_since = time.monotonic()  # the pace of the steps leaves out the check of validation

    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._print(
            trainer,
            f"Checking validation on up to {trainer.num_sanity_val_steps} batches before training "
            "(trainer.num_sanity_val_steps)",
        )

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        due = step % self.every_n_steps == 0 or step == self._start_step + 1
        due |= time.monotonic() - self._printed_at >= self.every_n_seconds
        if not due or step in (self._start_step, self._printed_step):  # accumulated batches share a step
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
        if "throughput/target_tokens_per_sec" in metrics:
            fields.append(f"{float(metrics['throughput/target_tokens_per_sec']):,.0f} target tokens/s")
        self._print(trainer, " | ".join(fields))

    def _time_left(self, trainer: pl.Trainer, step: int) -> float | None:
        """Until trainer.max_steps at the pace so far (validations included) or max_time, whichever comes first;
        None when neither bounds the run."""
        bounds = [timer.time_remaining() for timer in trainer.callbacks if isinstance(timer, Timer)]
        if trainer.max_steps > 0 and step > self._start_step:
            pace = (time.monotonic() - self._training_since) / (step - self._start_step)
            bounds.append(pace * (trainer.max_steps - step))
        bounds = [max(bound, 0.0) for bound in bounds if bound is not None]
        return min(bounds) if bounds else None

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return  # on_sanity_check_start said so
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
        self._print(trainer, f"validation at step {trainer.global_step}: {_scores(trainer.callback_metrics, 'val')}")

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._print(trainer, f"test: {_scores(trainer.callback_metrics, 'test')}")

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

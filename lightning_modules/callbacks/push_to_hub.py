"""`PushToHubCallback`: share the model on the Hugging Face Hub from training, when it ends and on each new best."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from huggingface_hub import CommitInfo
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from hf_transformer.errors import HubError
from hf_transformer.hub.push import check_repo_id, find_token, push_folder
from hf_transformer.model_folder import written_whole

from ..checkpoint import load_checkpoint
from ..checkpoint_export import export_checkpoint

logger = logging.getLogger(__name__)


class PushToHubCallback(pl.Callback):
    """Pushes the model to `repo_id` when training ends and, with `push_on_best` (a logged metric, higher is better,
    e.g. `val/bleu`), after each validation that improves it.

    Each push exports the current weights with the model card (validation/test scores, W&B link, compute) into
    `export_dir` (default `<log dir>/hub_export`), replaced as a whole so an interrupted export never looks complete,
    then uploads it (`hub.push.push_folder`: a commit, and one pinning it in the card). A failed push is logged with
    how to retry (`hf-transformer push <export_dir> <repo_id>`); training goes on. Needs `TranslationModule` with
    `TranslationDataModule` (the tokenizer travels in the checkpoint). The token comes from HF_TOKEN or `hf auth
    login` when pushing and is never stored: it is no argument of this callback, so it is in no config, checkpoint or
    card.
    """

    def __init__(
        self,
        repo_id: str,
        private: bool = False,
        push_on_best: str | None = None,
        export_dir: str | None = None,
    ) -> None:
        super().__init__()
        check_repo_id(repo_id)  # a typo fails now, not after hours of training
        self.repo_id, self.private, self.push_on_best, self.export_dir = repo_id, private, push_on_best, export_dir
        self.best: float | None = None
        self.pushes: list[CommitInfo] = []
        self._started = time.perf_counter()
        self._warned_missing_metric = False

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and trainer.is_global_zero:
            try:
                find_token()  # no token: say so before training, not after it
            except HubError as error:
                raise HubError(f"PushToHubCallback pushes to {self.repo_id}: {error}") from error

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._started = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Only validations inside `fit`: `trainer.validate()` evaluates a model without training it further.
        if self.push_on_best is None or trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        value = trainer.callback_metrics.get(self.push_on_best)
        if value is None:
            if not self._warned_missing_metric:
                rank_zero_warn(f"PushToHubCallback: {self.push_on_best!r} was not logged; no push on best.")
                self._warned_missing_metric = True
            return
        value = float(value)
        if self.best is None or value > self.best:
            self.best = value
            self._push(trainer, f"New best {self.push_on_best} = {value:.2f} at step {trainer.global_step}")

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._push(trainer, f"Model after {trainer.global_step} training steps")

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best = state_dict.get("best")

    def _push(self, trainer: pl.Trainer, message: str) -> None:
        folder = Path(self.export_dir or Path(trainer.log_dir or trainer.default_root_dir) / "hub_export")
        # Every rank takes part in saving (sharded strategies gather the weights collectively); rank zero pushes. The
        # file sits beside the export, a path every rank knows without talking to the others.
        saved = folder.parent / f".{folder.name}.ckpt"
        trainer.save_checkpoint(saved, weights_only=True)
        if not trainer.is_global_zero:
            return
        try:
            checkpoint = load_checkpoint(saved)
        except ValueError as err:  # no tokenizer in it: trained without TranslationDataModule
            logger.error("Not pushing to %s: %s Train with TranslationDataModule.", self.repo_id, err)
            return
        finally:
            saved.unlink(missing_ok=True)
        export_replacing(checkpoint, folder, **self._card_info(trainer))
        try:
            commit = push_folder(folder, self.repo_id, private=self.private, commit_message=message)
        except HubError as err:
            logger.error(
                "%s The export is in %s: push it with `hf-transformer push %s %s`.", err, folder, folder, self.repo_id
            )
            return
        self.pushes.append(commit)
        rank_zero_info(f"Pushed {folder} to {self.repo_id}: {commit}")

    def _card_info(self, trainer: pl.Trainer) -> dict[str, Any]:
        results = {
            name: float(value)
            for name, value in trainer.callback_metrics.items()
            if name.startswith(("val/", "test/")) and value.numel() == 1
        }
        return {
            "repo_id": self.repo_id,
            "results": results,
            "wandb_url": _wandb_url(trainer),
            "compute": _compute(trainer, time.perf_counter() - self._started),
        }


def export_replacing(checkpoint: dict[str, Any], folder: Path, **card_info: Any) -> Path:
    """`export_checkpoint` written whole in the place of `folder`: a crash mid-export leaves the previous export or
    none, never a half-written folder under the final name."""
    with written_whole(folder) as staging:
        export_checkpoint(checkpoint, staging, **card_info)
    return folder


def _wandb_url(trainer: pl.Trainer) -> str | None:
    """The run page of an online W&B logger; offline runs have none yet."""
    for run_logger in trainer.loggers:
        if isinstance(run_logger, WandbLogger) and not run_logger.experiment.offline:
            return run_logger.experiment.url
    return None


def _compute(trainer: pl.Trainer, seconds: float) -> str:
    accelerator = type(trainer.accelerator).__name__.removesuffix("Accelerator")
    if accelerator == "CUDA" and torch.cuda.is_available():
        accelerator = torch.cuda.get_device_name()
    hours, minutes = divmod(round(seconds / 60), 60)
    return (
        f"{trainer.num_nodes * trainer.num_devices} x {accelerator}, precision {trainer.precision}, "
        f"{hours} h {minutes:02d} min of training"
    )

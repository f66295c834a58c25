"""Engineering around training that belongs to no single module: throughput, padding and MFU logging, and a
W&B logger that falls back to offline runs."""

import netrc
import os
import time
from typing import Any
from urllib.parse import urlparse

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.throughput import get_available_flops
from lightning.pytorch.loggers import WandbLogger


class TranslationThroughput(pl.Callback):
    """Logs target tokens/s, source+target tokens/s, padding efficiency (real / padded tokens) and, where the
    device's peak FLOP/s is known, model FLOPs utilisation (the model's `training_flops` per second over the peak)."""

    def __init__(self, log_every_n_steps: int = 10):
        super().__init__()
        self.log_every_n_steps = log_every_n_steps
        self._reset()

    def _reset(self) -> None:
        self._start = time.perf_counter()
        self._target_tokens = self._real_tokens = self._padded_tokens = self._flops = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        dtype = {"bf16": torch.bfloat16, "16": torch.float16}.get(trainer.precision.split("-")[0], torch.float32)
        self._peak_flops = get_available_flops(pl_module.device, dtype)
        self._reset()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset()  # evaluation time is not training throughput

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: dict, batch_idx: int
    ) -> None:
        labels, attention_mask = batch["labels"], batch["attention_mask"]
        # Counted on the device and read only when logging, so no step waits for the GPU.
        source_lengths, target_lengths = attention_mask.sum(-1), (labels != -100).sum(-1)
        target_tokens = target_lengths.sum()
        self._target_tokens += target_tokens
        self._real_tokens += source_lengths.sum() + target_tokens
        if self._peak_flops:
            self._flops += pl_module.model.training_flops(source_lengths, target_lengths)
        self._padded_tokens += attention_mask.numel() + labels.numel()
        if (batch_idx + 1) % self.log_every_n_steps:
            return
        seconds = time.perf_counter() - self._start
        self._target_tokens, self._real_tokens = int(self._target_tokens), int(self._real_tokens)
        metrics = {
            "throughput/target_tokens_per_sec": self._target_tokens / seconds,
            "throughput/tokens_per_sec": self._real_tokens / seconds,
            "throughput/padding_efficiency": self._real_tokens / self._padded_tokens,
        }
        if self._peak_flops:
            metrics["throughput/mfu"] = int(self._flops) / seconds / self._peak_flops
        pl_module.log_dict(metrics)
        self._reset()


def wandb_credentials_found() -> bool:
    """True when W&B can log in without asking: an API key in the environment or in ~/.netrc (`wandb login`)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


class AutoWandbLogger(WandbLogger):
    """Lightning's `WandbLogger`, online when W&B credentials are found and offline otherwise (the run is written to
    `<save_dir>/wandb/offline-run-*`; upload it later with `wandb sync`). `offline` forces either."""

    def __init__(
        self,
        project: str | None = "hf-transformer",
        name: str | None = None,
        save_dir: str = ".",
        id: str | None = None,
        offline: bool | None = None,
        log_model: bool = False,
        tags: list[str] | None = None,
        group: str | None = None,
    ):
        if offline is None:
            # "dryrun" is W&B's older spelling of offline, still accepted by wandb 0.31.
            offline = os.environ.get("WANDB_MODE") in ("offline", "dryrun") or not wandb_credentials_found()
        super().__init__(
            project=project,
            name=name,
            save_dir=save_dir,
            id=id,
            offline=offline,
            log_model=log_model and not offline,
            tags=tags,
            group=group,
        )
        # The choice, readable before the run starts (`experiment.offline` would start it).
        self.offline, self.log_model = offline, log_model and not offline

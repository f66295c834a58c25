"""`TranslationThroughput`: tokens per second, padding efficiency and MFU of training, counted without waiting for the
device."""

import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.throughput import get_available_flops
from lightning.pytorch.trainer.states import TrainerFn

from hf_transformer import TransformerConfig
from hf_transformer.model.loss import IGNORE_INDEX


class TranslationThroughput(pl.Callback):
    """Logs `throughput/target_tokens_per_sec`, `throughput/tokens_per_sec` (source + target), `throughput/
    padding_efficiency` (real / padded tokens) and, where Lightning knows the device's peak FLOP/s,
    `throughput/mfu` (`training_flops` per second over that peak), every `log_every_n_steps` batches.

    It also keeps the run's totals, saved in each checkpoint and carried across resumes: `trained_target_tokens`, the
    target tokens of every training batch (a recipe's budget in tokens, as papers state it), and `trained_seconds`,
    the time spent training, validation left out.

    Not Lightning's `ThroughputMonitor`: it calls `torch.cuda.synchronize()` after every training batch, and the
    token counts its `length_fn` returns must be host numbers (`Throughput.update` compares each to the last), a
    second wait for the GPU per batch. Here the counts stay on the device until a step that logs.
    """

    def __init__(self, log_every_n_steps: int = 10):
        super().__init__()
        self.log_every_n_steps = log_every_n_steps
        self.trained_target_tokens: int | torch.Tensor = 0
        self.trained_seconds = 0.0
        self._reset()

    def state_dict(self) -> dict[str, Any]:
        seconds = self.trained_seconds + time.perf_counter() - self._start  # with the interval under way
        return {"trained_target_tokens": int(self.trained_target_tokens), "trained_seconds": seconds}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.trained_target_tokens = state_dict["trained_target_tokens"]
        self.trained_seconds = state_dict["trained_seconds"]

    def _reset(self) -> None:
        self._start = time.perf_counter()
        self._target_tokens = self._real_tokens = self._padded_tokens = self._flops = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        dtype = {"bf16": torch.bfloat16, "16": torch.float16}.get(trainer.precision.split("-")[0], torch.float32)
        self._peak_flops = get_available_flops(pl_module.device, dtype)
        self._reset()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:  # a validation within training
            self.trained_seconds += time.perf_counter() - self._start

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset()  # evaluation time is not training throughput

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: dict, batch_idx: int
    ) -> None:
        labels, attention_mask = batch["labels"], batch["attention_mask"]
        # Counted on the device and read only when logging, so no step waits for the GPU.
        source_lengths, target_lengths = attention_mask.sum(-1), (labels != IGNORE_INDEX).sum(-1)
        target_tokens = target_lengths.sum()
        self._target_tokens += target_tokens
        self.trained_target_tokens += target_tokens
        self._real_tokens += source_lengths.sum() + target_tokens
        if self._peak_flops:
            self._flops += training_flops(pl_module.model.config, source_lengths, target_lengths)
        self._padded_tokens += attention_mask.numel() + labels.numel()
        if (batch_idx + 1) % self.log_every_n_steps:
            return
        seconds = time.perf_counter() - self._start
        self.trained_seconds += seconds
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


def training_flops(
    config: TransformerConfig, source_lengths: torch.Tensor, target_lengths: torch.Tensor
) -> torch.Tensor:
    """Model FLOPs of one training step (forward and backward) of a model with this `TransformerConfig` on pairs of
    these lengths: the numerator of MFU.

    Counts the matrix multiplies, at 2 FLOPs per multiply-add and 3x the forward for forward + backward (the
    convention of PaLM's appendix B): the projections and feed-forward layers of every real token, the attention
    scores and weighted sums in full (as fused kernels compute them, causal or not) and the output projection of
    every target token. Padding, which the model does not compute, does not count, nor does recomputation.
    Takes and returns tensors, so that counting on a GPU does not wait for it.
    """
    d = config.d_model
    source, target = source_lengths.long(), target_lengths.long()
    source_tokens, target_tokens = source.sum(), target.sum()
    encoder_layer = source_tokens * (4 * d * d + 2 * d * config.encoder_ffn_dim) + 2 * d * (source * source).sum()
    decoder_layer = (
        # Self-attention (Q, K, V, output), encoder-decoder queries and output, feed-forward.
        target_tokens * (6 * d * d + 2 * d * config.decoder_ffn_dim)
        + source_tokens * 2 * d * d  # the encoder-decoder keys and values, computed once per layer
        + 2 * d * ((target * target).sum() + (target * source).sum())
    )
    output_projection = target_tokens * d * config.vocab_size
    return 6 * (config.encoder_layers * encoder_layer + config.decoder_layers * decoder_layer + output_projection)

"""The training logic: teacher forcing with label smoothing, Adam with the paper's warm-up schedule, and evaluation by
loss, perplexity and BLEU/chrF of beam-search translations."""

import math
from collections.abc import Callable
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from torch import nn
from torchmetrics.text import CHRFScore, SacreBLEUScore

from hf_transformer import TransformerConfig, TransformerForConditionalGeneration
from hf_transformer.integrity import non_finite_tensors
from hf_transformer.loss import translation_loss
from hf_transformer.translate import beam_search

from .checkpoint import tokenizer_from_checkpoint, tokenizer_state

ModelSize = int | None


def noam_lr_lambda(d_model: int, warmup_steps: int, factor: float = 1.0):
    """lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)  (section 5.3), as a LambdaLR multiplier of a
    base lr of 1. LambdaLR evaluates step 0 at construction, so the formula gets step + 1."""

    def lr_lambda(step: int) -> float:
        step += 1
        return factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)

    return lr_lambda


def inverse_sqrt_lr_lambda(peak_lr: float, warmup_steps: int):
    """Linear warm-up to `peak_lr`, then peak_lr * sqrt(warmup / step) (fairseq's inverse_sqrt)."""

    def lr_lambda(step: int) -> float:
        step += 1
        return peak_lr * min(step / warmup_steps, math.sqrt(warmup_steps / step))

    return lr_lambda


class TranslationModule(pl.LightningModule):
    """Trains a `TransformerForConditionalGeneration` on batches from `TranslationDataModule`.

    Every argument is a plain value, so checkpoints reload with `torch.load(weights_only=True)`. The model sizes start
    from `preset` ("base" or "big", Table 3); each size argument left at None keeps the preset's value. `vocab_size`
    and the special token ids are linked from the data module's tokenizer by the CLI.

    `compile=True` runs the training loss (forward, loss and the loss's gradients) as one `torch.compile` graph with
    dynamic shapes, so that token-budget batches of every shape share it: worth it on GPUs, where an eager step waits
    for Python; on a CPU the compilation takes longer than a short run saves.
    """

    def __init__(
        self,
        preset: Literal["base", "big"] = "base",
        d_model: ModelSize = None,
        encoder_layers: ModelSize = None,
        decoder_layers: ModelSize = None,
        attention_heads: ModelSize = None,
        ffn_dim: ModelSize = None,
        dropout: float | None = None,
        attention_dropout: float = 0.0,
        activation_dropout: float = 0.0,
        normalize_before: bool = False,
        max_position_embeddings: int = 1024,
        vocab_size: int = 37000,
        pad_token_id: int = 0,
        bos_token_id: int = 1,
        eos_token_id: int = 2,
        label_smoothing: float = 0.1,
        lr_schedule: Literal["noam", "inverse_sqrt"] = "noam",
        lr_factor: float = 1.0,
        peak_lr: float = 5e-4,
        warmup_steps: int = 4000,
        betas: tuple[float, float] = (0.9, 0.98),
        eps: float = 1e-9,
        weight_decay: float = 0.0,
        num_beams: int = 4,
        length_penalty: float = 0.6,
        max_length_offset: int = 50,
        num_logged_samples: int = 8,
        init_from: str | None = None,
        compile: bool = False,
    ):
        super().__init__()
        self.save_hyperparameters()
        sizes = {
            "d_model": d_model,
            "encoder_layers": encoder_layers,
            "decoder_layers": decoder_layers,
            "encoder_attention_heads": attention_heads,
            "decoder_attention_heads": attention_heads,
            "encoder_ffn_dim": ffn_dim,
            "decoder_ffn_dim": ffn_dim,
            "dropout": dropout,
        }
        config = TransformerConfig.from_preset(
            preset,
            **{name: value for name, value in sizes.items() if value is not None},
            attention_dropout=attention_dropout,
            activation_dropout=activation_dropout,
            normalize_before=normalize_before,
            max_position_embeddings=max_position_embeddings,
            vocab_size=vocab_size,
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            decoder_start_token_id=bos_token_id,
        )
        if init_from is not None:
            self.model = TransformerForConditionalGeneration.from_pretrained(init_from)
            if self.model.config.vocab_size != vocab_size:
                raise ValueError(
                    f"init_from={init_from!r} has a vocabulary of {self.model.config.vocab_size} tokens but the data "
                    f"module's tokenizer has {vocab_size}: set data.tokenizer to the model's tokenizer ({init_from})."
                )
        else:
            self.model = TransformerForConditionalGeneration(config)
        self.model.generation_config.num_beams = num_beams
        self.model.generation_config.length_penalty = length_penalty
        self.label_smoothing = label_smoothing
        # Module dicts, so Lightning moves the metrics to the device with the model.
        self.bleu = nn.ModuleDict({stage: SacreBLEUScore(tokenize="13a") for stage in ("val", "test")})
        self.chrf = nn.ModuleDict({stage: CHRFScore(n_word_order=0) for stage in ("val", "test")})
        self._samples: list[list[str]] = []
        self._hypotheses: list[tuple[int, str]] = []

    # --- training ----------------------------------------------------------------------------------------------

    def configure_model(self) -> None:
        if self.hparams.compile:
            self.compile_training_loss()

    def compile_training_loss(self, backend: str | Callable = "inductor") -> None:
        """Replace `training_loss` by its `torch.compile`d graph. Shapes are dynamic from the first batch on, so that
        the token-budget batches, whose lengths and row counts all differ, share one graph. Compiles the class's
        method, so that a second call (Lightning calls `configure_model` for every fit, validate or test) does not
        wrap the compiled function again."""
        method = type(self).training_loss.__get__(self)
        self.training_loss = torch.compile(method, dynamic=True, backend=backend)

    def training_loss(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The summed label-smoothed loss over the target tokens of `batch` and their number (`translation_loss`)."""
        return translation_loss(self.model, batch, self.label_smoothing)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss_sum, target_tokens = self.training_loss(batch)
        loss = loss_sum / target_tokens
        if not torch.isfinite(loss):
            raise FloatingPointError(f"Training loss is {loss.item()} at step {self.global_step}. {self.resume_hint()}")
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/target_tokens", target_tokens.float(), reduce_fx="sum")
        return loss

    def on_train_batch_start(self, batch: dict[str, Any], batch_idx: int) -> None:
        states = getattr(self, "_rng_states_to_restore", None)
        if states:
            torch.set_rng_state(states["torch_rng_state"])
            if "cuda_rng_states" in states and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(states["cuda_rng_states"])
            self._rng_states_to_restore = None

    def configure_optimizers(self):
        hparams = self.hparams
        if hparams.lr_schedule == "noam":
            lr_lambda = noam_lr_lambda(self.model.config.d_model, hparams.warmup_steps, hparams.lr_factor)
        else:
            lr_lambda = inverse_sqrt_lr_lambda(hparams.peak_lr, hparams.warmup_steps)
        # One fused kernel for all parameters on GPUs (Adam was 13% of an eager step's GPU time), one multi-tensor
        # loop elsewhere.
        fused = self.device.type == "cuda"
        optimizer = torch.optim.AdamW(
            self.parameters(),
            lr=1.0,
            betas=tuple(hparams.betas),
            eps=hparams.eps,
            weight_decay=hparams.weight_decay,
            fused=fused,
            foreach=not fused,
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # --- evaluation --------------------------------------------------------------------------------------------

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def _evaluate(self, batch: dict[str, Any], stage: str) -> None:
        loss_sum, target_tokens = translation_loss(self.model, batch)
        batch_size = batch["input_ids"].shape[0]
        # Summed over batches and ranks, then divided: the corpus-level per-token loss.
        self.log(f"{stage}/nll_sum", loss_sum, reduce_fx="sum", sync_dist=True, batch_size=batch_size)
        self.log(f"{stage}/target_tokens", target_tokens.float(), reduce_fx="sum", sync_dist=True)

        hypotheses = self.translate(batch["input_ids"], batch["attention_mask"])
        references = [[reference] for reference in batch["target_text"]]
        self.bleu[stage].update(hypotheses, references)
        self.chrf[stage].update(hypotheses, references)
        if stage == "val" and len(self._samples) < self.hparams.num_logged_samples:
            rows = zip(batch["source_text"], batch["target_text"], hypotheses, strict=True)
            self._samples.extend([source, reference, hypothesis] for source, reference, hypothesis in rows)
            del self._samples[self.hparams.num_logged_samples :]  # a batch may hold more rows than are missing
        if stage == "test":
            self._hypotheses.extend(zip(batch["index"].tolist(), hypotheses, strict=True))

    def translate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[str]:
        """Beam search as the model's generation config says (the paper's beam 4, length penalty 0.6), each output
        at most its input's length + `max_length_offset` tokens (50 in section 6.1)."""
        output_ids = beam_search(
            self.model, input_ids, attention_mask, max_length_offset=self.hparams.max_length_offset
        )
        return self.tokenizer.batch_decode(output_ids, skip_special_tokens=True)

    @property
    def tokenizer(self):
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is not None:
            return datamodule.tokenizer
        if getattr(self, "_checkpoint_tokenizer", None) is None:
            raise RuntimeError("No tokenizer: run with a TranslationDataModule or load this module from a checkpoint.")
        return self._checkpoint_tokenizer

    def on_validation_epoch_end(self) -> None:
        self._log_scores("val")
        if self._samples and not self.trainer.sanity_checking and hasattr(self.logger, "log_text"):
            self.logger.log_text("val/samples", columns=["source", "reference", "hypothesis"], data=self._samples)
        self._samples = []

    def on_test_epoch_end(self) -> None:
        self._log_scores("test")

    def _log_scores(self, stage: str) -> None:
        metrics = self.trainer.callback_metrics
        nll = metrics[f"{stage}/nll_sum"] / metrics[f"{stage}/target_tokens"].clamp(min=1)
        self.log(f"{stage}/loss", nll, sync_dist=False)
        self.log(f"{stage}/perplexity", nll.exp(), sync_dist=False)
        # SacreBLEU reports 0-100; torchmetrics' states are sums, so compute() is the exact corpus score over ranks.
        self.log(f"{stage}/bleu", 100 * self.bleu[stage].compute(), prog_bar=True)
        self.log(f"{stage}/chrf", 100 * self.chrf[stage].compute())
        self.bleu[stage].reset()
        self.chrf[stage].reset()

    def gathered_test_hypotheses(self) -> list[str]:
        """The test hypotheses of all ranks, in the order of the test set."""
        gathered = [self._hypotheses]
        if self.trainer.world_size > 1:
            gathered = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(gathered, self._hypotheses)
        hypotheses = dict(pair for rank_pairs in gathered for pair in rank_pairs)
        self._hypotheses = []
        return [hypotheses[index] for index in sorted(hypotheses)]

    # --- checkpoints: the HF config and the tokenizer travel inside -------------------------------------------

    def resume_hint(self) -> str:
        """Where a diverged run resumes from and what to change: the last checkpoint written, never a diverged state."""
        callback = self.trainer.checkpoint_callback
        last = getattr(callback, "last_model_path", "")
        where = (
            f"Resume from the last checkpoint written, {last} (--ckpt_path last),"
            if last
            else "No checkpoint was written before it: start again"
        )
        return (
            f"{where} with a lower learning rate (model.lr_factor or model.peak_lr), more warm-up "
            "(model.warmup_steps), gradient clipping (trainer.gradient_clip_val) or bf16-mixed instead of 16-mixed "
            "precision."
        )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # A checkpoint is a state to resume from: one with non-finite weights would fail again at every resume.
        non_finite = non_finite_tensors(checkpoint["state_dict"].items())
        if non_finite:
            raise FloatingPointError(
                f"The weights are not finite after step {checkpoint['global_step']} ({', '.join(non_finite[:3])}...), "
                f"so they are not saved. {self.resume_hint()}"
            )
        checkpoint["hf_config"] = self.model.config.to_dict()
        checkpoint["generation_config"] = self.model.generation_config.to_dict()
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is not None:
            checkpoint["tokenizer"] = tokenizer_state(datamodule.tokenizer)

        # Dropout masks continue where they were, so a resumed run trains exactly like one that never stopped.
        checkpoint["torch_rng_state"] = torch.get_rng_state()
        if torch.cuda.is_available():
            checkpoint["cuda_rng_states"] = torch.cuda.get_rng_state_all()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Restored at the first batch, not here: re-creating the data iterator draws from the global RNG in between.
        self._rng_states_to_restore = {
            k: checkpoint[k] for k in ("torch_rng_state", "cuda_rng_states") if k in checkpoint
        }
        if "tokenizer" in checkpoint:
            self._checkpoint_tokenizer = tokenizer_from_checkpoint(checkpoint)

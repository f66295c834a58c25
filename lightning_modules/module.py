"""The training logic: the model's own loss (teacher forcing with label smoothing), Adam with the paper's warm-up
schedule, and evaluation by loss, perplexity and BLEU/chrF of beam-search translations."""

import dataclasses
import difflib
import importlib.metadata
import inspect
import math
from collections.abc import Callable
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.strategies import FSDPStrategy, Strategy
from torch import nn
from torchmetrics.text import CHRFScore, SacreBLEUScore
from transformers import PreTrainedTokenizerFast

from hf_transformer import TransformerConfig, TransformerForConditionalGeneration
from hf_transformer.errors import CheckpointError, ConfigError, TrainingDiverged
from hf_transformer.integrity import non_finite_tensors, token_ids_checked_by_caller
from hf_transformer.loss import IGNORE_INDEX
from hf_transformer.translate import beam_search

from .callbacks import ExactResume, telling_samples
from .checkpoint import check_same_model, tokenizer_from_checkpoint, tokenizer_state
from .tokenization import model_vocabulary

# Validation rows kept for the logger's sample table and the end-of-run summary.
NUM_LOGGED_SAMPLES = 8
# Training batches between reads of the count of non-finite losses, which is kept on the device so that no step waits
# for the GPU; it is also read before every checkpoint, so no checkpoint is saved after a non-finite loss.
NON_FINITE_CHECK_INTERVAL = 100


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
    """`lr_lambda` until `cooldown_steps` before `max_steps`, then a linear decay from its value there to 0 at
    `max_steps` (the cool-down of warm-up-stable-decay schedules, Hägele et al. 2024, "Scaling Laws and Compute-Optimal
    Training Beyond Fixed Training Durations"): a run of known length ends at a low learning rate, where the inverse
    square root alone would still be high."""
    start = max_steps - cooldown_steps

    def cooled(step: int) -> float:
        if step < start:
            return lr_lambda(step)
        return lr_lambda(start) * max(0.0, (max_steps - step) / cooldown_steps)

    return cooled


def noam_lr_lambda(d_model: int, warmup_steps: int, factor: float = 1.0) -> Callable[[int], float]:
    """The paper's lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (section 5.3): the inverse square
    root curve with its peak, factor * (d_model * warmup)^-0.5, at step `warmup_steps`."""
    return inverse_sqrt_lr_lambda(factor * (d_model * warmup_steps) ** -0.5, warmup_steps)


def fused_adam_allowed(precision_plugin: Precision, gradient_clip_val: float | None) -> bool:
    """Whether Lightning will step a fused Adam: its mixed-precision plugin refuses to clip the gradients of an
    optimizer that unscales them itself (fp16's gradient scaler would unscale them inside the fused step) and stops the
    run at its first step, as a bf16-mixed run of configs/multi30k.yaml on an H200 showed."""
    return not (gradient_clip_val and isinstance(precision_plugin, MixedPrecision))


def clips_norm_through_fsdp(
    strategy: Strategy, gradient_clip_val: float | None, gradient_clip_algorithm: str | None
) -> bool:
    """Whether clipping the gradients' norm must go through FSDP's root module: Lightning's FSDP plugin refuses to clip
    by norm (Lightning issue #19235), since each rank holds a shard of the gradients and only the root module computes
    the whole norm. Clipping by value needs no norm, and Lightning's plugin does it."""
    clips_norm = (gradient_clip_algorithm or "norm") == "norm"
    return bool(gradient_clip_val) and clips_norm and isinstance(strategy, FSDPStrategy)


def model_config(preset: str, overrides: dict[str, Any] | None, vocabulary: dict[str, int]) -> TransformerConfig:
    """The `preset` with `overrides` (model.config) and the tokenizer's `vocabulary`; a mistake names the field."""
    overrides = dict(overrides or {})
    # attn_implementation is an argument of every config (eager, sdpa, flex_attention...) rather than a field.
    fields = [field.name for field in dataclasses.fields(TransformerConfig)] + ["attn_implementation"]
    for name in overrides:
        if name not in fields:
            closest = difflib.get_close_matches(name, fields, n=1)
            hint = f" (did you mean {closest[0]!r}?)" if closest else ""
            raise ConfigError(f"model.config: {name!r} is not a TransformerConfig field{hint}")
    try:
        return TransformerConfig.from_preset(preset, **{**overrides, **vocabulary})
    except ValueError as err:
        raise ConfigError(f"model.config: {err}") from err


def check_resumable(path: str, checkpoint: dict[str, Any]) -> None:
    """Refuse a checkpoint whose module arguments this version does not take, saying which version wrote it; its
    model still exports (`hf-transformer export` reads every version) and trains further with model.init_from."""
    accepted = set(inspect.signature(TranslationModule).parameters)
    unknown = sorted(set(checkpoint.get("hyper_parameters", {})) - accepted - {"_instantiator", "_class_path"})
    if unknown:
        version = checkpoint.get("hf_transformer_version", "a version before 0.2.0")
        raise CheckpointError(
            f"{path} was written by hf-transformer {version}, whose training module took {', '.join(unknown[:4])}; "
            f"this version ({importlib.metadata.version('hf-transformer')}) takes every model setting, label smoothing "
            "included, under model.preset and model.config. Resume it with the version that wrote it, or export it "
            "(hf-transformer export "
            f"{path} exports/old) and train on from that folder with --model.init_from exports/old."
        )


def check_same_weights(checkpoint: dict[str, Any], module: pl.LightningModule) -> None:
    """Refuse a checkpoint whose weights are not the ones this config's model has (pre-LN adds a layer norm at the end
    of each stack), naming the settings that differ: Lightning's `load_state_dict` listed only the missing keys."""
    expected, saved = set(module.state_dict()), set(checkpoint["state_dict"])
    if expected == saved:
        return
    ours, theirs = module.model.config.to_dict(), checkpoint.get("hf_config", {})
    settings = [
        f"model.config.{field.name} is {theirs[field.name]!r} in the checkpoint, {ours.get(field.name)!r} here"
        for field in dataclasses.fields(TransformerConfig)
        if field.name in theirs and theirs[field.name] != ours.get(field.name)
    ]
    weights = sorted(expected ^ saved)
    names = ", ".join(weights[:2]) + (f" and {len(weights) - 2} more" if len(weights) > 2 else "")
    raise CheckpointError(
        f"the checkpoint (--ckpt_path) holds another architecture than this config builds: "
        f"{'; '.join(settings) or 'the weights differ'} (weights in one and not the other: {names}). The settings "
        "must agree to resume or evaluate it: use those of the run that wrote it, or train with the new ones as a "
        "new run (another trainer.default_root_dir, without --ckpt_path)"
    )


def check_training_settings(hparams: dict[str, Any]) -> None:
    """Refuse settings that would fail only later (a division by zero in the schedule, a loss error after the
    sanity check), naming the setting."""
    rules = {
        "warmup_steps": (lambda value: value >= 1, "must be at least 1 (the paper warms up for 4000 steps)"),
        "peak_lr": (lambda value: value is None or value > 0, "must be positive, or null for the paper's schedule"),
        "eps": (lambda value: value > 0, "must be positive (the paper uses 1e-9)"),
        "betas": (lambda value: all(0 <= beta < 1 for beta in value), "must both be in [0, 1) (the paper: 0.9, 0.98)"),
        "weight_decay": (lambda value: value >= 0, "must be at least 0"),
        "cooldown_steps": (lambda value: value >= 0, "must be at least 0 (0: no cool-down)"),
        "rdrop_alpha": (lambda value: value >= 0, "must be at least 0 (0: no R-Drop; 5 in its paper)"),
    }
    for name, (is_valid, rule) in rules.items():
        if not is_valid(hparams[name]):
            raise ConfigError(f"model.{name}={hparams[name]!r} {rule}")


def check_module_arguments(arguments: dict[str, Any]) -> None:
    """Everything `TranslationModule` checks before building anything, from its arguments alone: the training settings
    and the model config (unless the model comes from `init_from`). Raises `ConfigError` naming the setting."""
    check_training_settings(arguments)
    if arguments["init_from"] is None:
        model_config(arguments["preset"], arguments["config"], vocabulary={})


class TranslationModule(pl.LightningModule):
    """Trains a `TransformerForConditionalGeneration` on batches from `TranslationDataModule`.

    The model is one value: the paper's `preset` with `config` overrides (any `TransformerConfig` field), or a saved
    model (`init_from`); its vocabulary and special token ids come from `tokenizer`, which the CLI links from the data
    module. The other arguments are training settings. Hyperparameters are plain values (the tokenizer travels in the
    checkpoint as text), so checkpoints reload with `torch.load(weights_only=True)`.

    Args:
        tokenizer: the tokenizer of the data (linked from the data module by the CLI).
        preset: the paper's model that `config` starts from: "base" or "big" (Table 3).
        config: TransformerConfig fields that replace the preset's, e.g. {d_model: 128, encoder_layers: 3,
            max_position_embeddings: 128}; a later config file that sets it replaces it whole, --model.config.KEY
            overrides one field.
        init_from: a saved model (folder or Hub id) to train further instead of a new one.
        peak_lr: the learning rate at the end of the warm-up, then decaying with the inverse square root of the step;
            None is the paper's schedule (eq. 3), whose peak is (d_model * warmup_steps)^-0.5.
        warmup_steps: steps of linear warm-up (4000 in the paper).
        betas: Adam's beta1 and beta2 (0.9 and 0.98 in the paper).
        eps: Adam's epsilon (1e-9 in the paper).
        weight_decay: AdamW's decoupled weight decay (none in the paper).
        cooldown_steps: the last `cooldown_steps` of `trainer.max_steps` decay the learning rate linearly to 0; 0 (the
            paper) keeps the inverse square root to the end.
        rdrop_alpha: R-Drop (Liang et al. 2021): each step runs every pair of the batch twice, under two dropout masks,
            and adds rdrop_alpha / 2 times the symmetric KL divergence of the two output distributions to the two
            cross-entropies; 0, as in the Transformer paper, runs each pair once. A step costs more than one on a
            batch twice the size (1.3x on Multi30k, README), so halve `data.max_tokens` to come near the plain cost.
        generation: GenerationConfig fields for validation and the saved model, over the paper's beam 4 and length
            penalty 0.6, e.g. {num_beams: 2}.
        compile: run the training loss (forward, loss and the loss's gradients) as one `torch.compile` graph with
            dynamic shapes, shared by token-budget batches of every shape: worth it on GPUs, where an eager step
            waits for Python; on a CPU the compilation takes longer than a short run saves.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerFast | None = None,
        preset: Literal["base", "big"] = "base",
        config: dict[str, Any] | None = None,
        init_from: str | None = None,
        peak_lr: float | None = None,
        warmup_steps: int = 4000,
        betas: tuple[float, float] = (0.9, 0.98),
        eps: float = 1e-9,
        weight_decay: float = 0.0,
        cooldown_steps: int = 0,
        rdrop_alpha: float = 0.0,
        generation: dict[str, Any] | None = None,
        compile: bool = False,
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["tokenizer"])
        check_training_settings(self.hparams)
        self.tokenizer = tokenizer
        vocabulary = model_vocabulary(tokenizer) if tokenizer is not None else {}
        if init_from is not None:
            self.model = TransformerForConditionalGeneration.from_pretrained(init_from)
            if vocabulary and self.model.config.vocab_size != vocabulary["vocab_size"]:
                raise ConfigError(
                    f"model.init_from={init_from!r} has a vocabulary of {self.model.config.vocab_size} tokens but the "
                    f"data module's tokenizer has {vocabulary['vocab_size']}: set data.tokenizer to the model's "
                    f"tokenizer ({init_from})."
                )
        else:
            self.model = TransformerForConditionalGeneration(model_config(preset, config, vocabulary))
        unknown = self.model.generation_config.update(**(generation or {}))
        if unknown:
            raise ConfigError(f"model.generation: {sorted(unknown)} are not GenerationConfig fields")
        # Module dicts, so Lightning moves the metrics to the device with the model.
        self.register_buffer("non_finite_losses", torch.zeros((), dtype=torch.long), persistent=False)
        self.bleu = nn.ModuleDict({stage: SacreBLEUScore(tokenize="13a") for stage in ("val", "test")})
        self.chrf = nn.ModuleDict({stage: CHRFScore(n_word_order=0) for stage in ("val", "test")})
        self._samples: list[list[str]] = []
        self.val_samples: list[list[str]] = []  # [source, reference, hypothesis] rows of the last validation
        self._translations: list[tuple[int, str, str]] = []  # (line of the test split, hypothesis, reference)

    # --- training ----------------------------------------------------------------------------------------------

    def configure_callbacks(self) -> list[pl.Callback]:
        return [ExactResume()]  # part of training correctly, so not left to the configs' callback lists

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

    def training_loss(self, batch: dict[str, Any]) -> torch.Tensor:
        """The model's loss on `batch`: label-smoothed cross-entropy per target token (`config.label_smoothing`), with
        R-Drop's KL term on the batch run twice if `rdrop_alpha` is set."""
        inputs = {name: batch[name] for name in ("input_ids", "attention_mask", "labels")}
        rdrop_alpha = self.hparams.rdrop_alpha
        if rdrop_alpha:
            inputs = {name: torch.cat([tensor, tensor]) for name, tensor in inputs.items()}
        return self.model(**inputs, rdrop_alpha=rdrop_alpha).loss

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        # The data module's collate checked the ids on the CPU; checked again here, they would make the step wait
        # for the device (outside `training_loss`, which may be compiled).
        with token_ids_checked_by_caller():
            loss = self.training_loss(batch)
        self.non_finite_losses += ~torch.isfinite(loss.detach())
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if (batch_idx + 1) % NON_FINITE_CHECK_INTERVAL == 0:
            self.stop_if_diverged()

    def stop_if_diverged(self) -> None:
        """Raise `TrainingDiverged` if a loss since the last check was NaN or infinite (one read from the device)."""
        if int(self.non_finite_losses):
            raise TrainingDiverged(
                f"The training loss became NaN or infinite before step {self.global_step}. {self.resume_hint()}"
            )

    def configure_optimizers(self):
        hparams = self.hparams
        if hparams.peak_lr is None:
            lr_lambda = noam_lr_lambda(self.model.config.d_model, hparams.warmup_steps)
        else:
            lr_lambda = inverse_sqrt_lr_lambda(hparams.peak_lr, hparams.warmup_steps)
        if hparams.cooldown_steps:
            max_steps = self.trainer.max_steps
            if not hparams.warmup_steps + hparams.cooldown_steps <= max_steps:
                raise ConfigError(
                    f"model.cooldown_steps={hparams.cooldown_steps} needs trainer.max_steps ({max_steps}) of at least "
                    f"model.warmup_steps + model.cooldown_steps ({hparams.warmup_steps + hparams.cooldown_steps}): the "
                    "cool-down ends at trainer.max_steps"
                )
            lr_lambda = with_cooldown(lr_lambda, hparams.cooldown_steps, max_steps)
        # One fused kernel for all parameters on GPUs (Adam was 13% of an eager step's GPU time) where Lightning allows
        # it, one multi-tensor loop elsewhere.
        fused = self.device.type == "cuda" and fused_adam_allowed(
            self.trainer.precision_plugin, self.trainer.gradient_clip_val
        )
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

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Lightning's clipping (`trainer.gradient_clip_val`), by FSDP's root module where Lightning cannot do it."""
        if clips_norm_through_fsdp(self.trainer.strategy, gradient_clip_val, gradient_clip_algorithm):
            self.trainer.model.clip_grad_norm_(gradient_clip_val)
        else:
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    # --- evaluation --------------------------------------------------------------------------------------------

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def _evaluate(self, batch: dict[str, Any], stage: str) -> None:
        labels = batch["labels"]
        target_tokens = (labels != IGNORE_INDEX).sum()
        nll = self.model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels, label_smoothing=0.0
        ).loss
        loss_sum = nll * target_tokens
        batch_size = batch["input_ids"].shape[0]
        # Summed over batches and ranks, then divided: the corpus-level per-token loss.
        self.log(f"{stage}/nll_sum", loss_sum, reduce_fx="sum", sync_dist=True, batch_size=batch_size)
        self.log(f"{stage}/target_tokens", target_tokens.float(), reduce_fx="sum", sync_dist=True)

        hypotheses = self.translate(batch["input_ids"], batch["attention_mask"])
        references = [[reference] for reference in batch["target_text"]]
        self.bleu[stage].update(hypotheses, references)
        self.chrf[stage].update(hypotheses, references)
        if stage == "val":
            rows = zip(batch["source_text"], batch["target_text"], hypotheses, strict=True)
            self._samples.extend([source, reference, hypothesis] for source, reference, hypothesis in rows)
        if stage == "test":
            self._translations.extend(zip(batch["index"].tolist(), hypotheses, batch["target_text"], strict=True))

    def translate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[str]:
        """Beam search as the model's generation config says (the paper's beam 4, length penalty 0.6), each output
        at most its input's length + 50 tokens (section 6.1, `MAX_LENGTH_OFFSET`)."""
        output_ids = beam_search(self.model, input_ids, attention_mask)
        return self.tokenizer.batch_decode(output_ids, skip_special_tokens=True)

    def on_validation_epoch_end(self) -> None:
        self._log_scores("val")
        self._samples = telling_samples(self._samples, NUM_LOGGED_SAMPLES)
        if not self.trainer.sanity_checking:
            self.val_samples = self._samples
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

    def gathered_test_translations(self) -> tuple[list[str], list[str]]:
        """The test hypotheses of all ranks and their references, in the order of the test set."""
        gathered = [self._translations]
        if self.trainer.world_size > 1:
            gathered = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(gathered, self._translations)
        by_line = {line: (hypothesis, reference) for rank in gathered for line, hypothesis, reference in rank}
        self._translations = []
        pairs = [by_line[line] for line in sorted(by_line)]
        return [hypothesis for hypothesis, _ in pairs], [reference for _, reference in pairs]

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
            f"{where} with a lower learning rate (model.peak_lr), more warm-up "
            "(model.warmup_steps), gradient clipping (trainer.gradient_clip_val) or bf16-mixed instead of 16-mixed "
            "precision."
        )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # A checkpoint is a state to resume from: one after a non-finite loss, or with non-finite weights, would fail
        # again at every resume.
        self.stop_if_diverged()
        non_finite = non_finite_tensors(checkpoint["state_dict"].items())
        if non_finite:
            raise TrainingDiverged(
                f"The weights are not finite after step {checkpoint['global_step']} ({', '.join(non_finite[:3])}...), "
                f"so they are not saved. {self.resume_hint()}"
            )
        checkpoint["hf_transformer_version"] = importlib.metadata.version("hf-transformer")
        checkpoint["hf_config"] = self.model.config.to_dict()
        checkpoint["generation_config"] = self.model.generation_config.to_dict()
        if self.tokenizer is not None:
            checkpoint["tokenizer"] = tokenizer_state(self.tokenizer)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.tokenizer is None and "tokenizer" in checkpoint:
            self.tokenizer = tokenizer_from_checkpoint(checkpoint)
        check_same_model(checkpoint, self.model.config, self.tokenizer)
        check_same_weights(checkpoint, self)

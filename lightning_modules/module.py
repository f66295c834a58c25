"""The training logic: the model's own loss (teacher forcing with label smoothing), Adam with a learning-rate
schedule (`schedules.py`; the paper's warm-up by default), and evaluation by loss, perplexity and BLEU/chrF of
beam-search translations. Variants whose experiment did not pay (R-Drop, a cool-down) are subclasses and schedules in
`lightning_modules.experimental`, chosen by class path."""

import dataclasses
import difflib
import importlib.metadata
from collections.abc import Callable, Mapping
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.strategies import FSDPStrategy, Strategy
from transformers import PreTrainedTokenizerFast

from hf_transformer import TransformerConfig, TransformerForConditionalGeneration
from hf_transformer.decoding.ensemble import Average, Ensemble
from hf_transformer.decoding.search import beam_search
from hf_transformer.errors import CheckpointError, ConfigError, TrainingDiverged
from hf_transformer.hub.model_card import TRAINING_DESCRIPTION
from hf_transformer.model.integrity import non_finite_tensors
from hf_transformer.model.loss import IGNORE_INDEX
from hf_transformer.model_folder import saved_config
from hf_transformer.scoring import LOGGED_SCORES, VALIDATION_BLEU, VALIDATION_CHRF, sacrebleu_scores

from .callbacks.progress import telling_samples
from .callbacks.resume import ExactResume
from .checkpoint import check_same_model, tokenizer_from_checkpoint, tokenizer_state
from .data.tokenization import model_vocabulary
from .schedules import PAPER_SCHEDULE, Schedule

# The logged name of each score of `hf_transformer.scoring` that a test logs.
TEST_METRICS = {score: f"test/{name}" for name, score in LOGGED_SCORES.items()}
# Validation rows kept for the logger's sample table and the end-of-run summary.
NUM_LOGGED_SAMPLES = 8
# Training batches between reads of the count of non-finite losses, which is kept on the device so that no step waits
# for the GPU; it is also read before every checkpoint, so no checkpoint is saved after a non-finite loss.
NON_FINITE_CHECK_INTERVAL = 100


def fused_adam_allowed(precision_plugin: Precision, gradient_clip_val: float | None) -> bool:
    """Whether Lightning will step a fused Adam: its mixed-precision plugin refuses to clip the gradients of an
    optimizer that unscales them itself (fp16's gradient scaler would unscale them inside the fused step) and stops the
    run at its first step."""
    return not (gradient_clip_val and isinstance(precision_plugin, MixedPrecision))


def clips_norm_through_fsdp(
    strategy: Strategy, gradient_clip_val: float | None, gradient_clip_algorithm: str | None
) -> bool:
    """Whether clipping the gradients' norm must go through FSDP's root module: Lightning's FSDP plugin refuses to clip
    by norm (Lightning issue #19235), since each rank holds a shard of the gradients and only the root module computes
    the whole norm. Clipping by value needs no norm, and Lightning's plugin does it."""
    clips_norm = (gradient_clip_algorithm or "norm") == "norm"
    return bool(gradient_clip_val) and clips_norm and isinstance(strategy, FSDPStrategy)


def model_config(
    preset: str, overrides: dict[str, Any] | None, init_from: str | None, vocabulary: dict[str, int] | None = None
) -> TransformerConfig:
    """The config of the model a run trains, by the one rule of the settings model.preset < model.config <
    model.init_from: the saved model's (`init_from`) where one is named, else the `preset` with `overrides` and the
    tokenizer's `vocabulary` (its size and special ids). A mistake names the field."""
    if init_from is not None:
        return saved_config(init_from)
    overrides = dict(overrides or {})
    # attn_implementation is an argument of every config (eager, sdpa, flex_attention...) rather than a field.
    fields = [field.name for field in dataclasses.fields(TransformerConfig)] + ["attn_implementation"]
    for name in overrides:
        if name not in fields:
            closest = difflib.get_close_matches(name, fields, n=1)
            hint = f" (did you mean {closest[0]!r}?)" if closest else ""
            raise ConfigError(f"model.config: {name!r} is not a TransformerConfig field{hint}")
    try:
        return TransformerConfig.from_preset(preset, **{**overrides, **(vocabulary or {})})
    except ValueError as err:
        raise ConfigError(f"model.config: {err}") from err


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


def batch_inputs(batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    """What the model takes of a training batch: the source, its mask and the labels."""
    return {name: batch[name] for name in ("input_ids", "attention_mask", "labels")}


def check_training_settings(hparams: Mapping[str, Any]) -> None:
    """Refuse optimizer settings that would fail only later, naming the setting (the schedule checks its own)."""
    rules = {
        "eps": (lambda value: value > 0, "must be positive (the paper uses 1e-9)"),
        "betas": (lambda value: all(0 <= beta < 1 for beta in value), "must both be in [0, 1) (the paper: 0.9, 0.98)"),
        "weight_decay": (lambda value: value >= 0, "must be at least 0"),
    }
    for name, (is_valid, rule) in rules.items():
        if not is_valid(hparams[name]):
            raise ConfigError(f"model.{name}={hparams[name]!r} {rule}")


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
        schedule: the learning-rate schedule, a class path with its arguments (`lightning_modules.schedules`):
            by default `InverseSquareRoot`, the paper's warm-up of 4000 steps and eq. 3, e.g.
            {class_path: lightning_modules.schedules.InverseSquareRoot, init_args: {peak_lr: 0.002, warmup_steps:
            200}}, or --model.schedule.peak_lr 0.002.
        betas: Adam's beta1 and beta2 (0.9 and 0.98 in the paper).
        eps: Adam's epsilon (1e-9 in the paper).
        weight_decay: AdamW's decoupled weight decay (none in the paper).
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
        schedule: Schedule = PAPER_SCHEDULE,
        betas: tuple[float, float] = (0.9, 0.98),
        eps: float = 1e-9,
        weight_decay: float = 0.0,
        generation: dict[str, Any] | None = None,
        compile: bool = False,
    ):
        super().__init__()
        # Plain values only (a checkpoint reloads with weights_only=True): the schedule as a config names it, also in
        # the hyperparameters that the loggers record.
        self.save_hyperparameters(ignore=["tokenizer", "schedule"])
        self.save_hyperparameters({**self.hparams, "schedule": schedule.hyperparameters()})
        self.check_arguments(self.hparams)
        self.tokenizer, self.schedule = tokenizer, schedule
        vocabulary = model_vocabulary(tokenizer) if tokenizer is not None else {}
        if init_from is None:
            self.model = TransformerForConditionalGeneration(model_config(preset, config, init_from, vocabulary))
        else:
            self.model = TransformerForConditionalGeneration.from_pretrained(init_from)
            if vocabulary and self.model.config.vocab_size != vocabulary["vocab_size"]:
                raise ConfigError(
                    f"model.init_from={init_from!r} has a vocabulary of {self.model.config.vocab_size} tokens but the "
                    f"data module's tokenizer has {vocabulary['vocab_size']}: set data.tokenizer to the model's "
                    f"tokenizer ({init_from})."
                )
        unknown = self.model.generation_config.update(**(generation or {}))
        if unknown:
            raise ConfigError(f"model.generation: {sorted(unknown)} are not GenerationConfig fields")
        # Module dicts, so Lightning moves the metrics to the device with the model.
        self.register_buffer("non_finite_losses", torch.zeros((), dtype=torch.long), persistent=False)
        # Validation's scores are sums over batches and ranks (torchmetrics); the test split's are computed once, from
        # all its translations, by `hf_transformer.scoring` (`on_test_epoch_end`).
        self.val_bleu = VALIDATION_BLEU.torchmetrics()
        self.val_chrf = VALIDATION_CHRF.torchmetrics()
        # The divisor of the optimizer step's summed losses, this rank's target tokens in the step so far and in the
        # batch under way (`on_train_batch_start`).
        self._step_divisor: torch.Tensor | None = None
        self._step_tokens: torch.Tensor | None = None
        self._batch_tokens: torch.Tensor | None = None
        self._samples: list[list[str]] = []
        self.val_samples: list[list[str]] = []  # [source, reference, hypothesis] rows of the last validation
        self._translations: list[tuple[int, str, str]] = []  # (line of the test split, hypothesis, reference)
        self.test_translations: tuple[list[str], list[str]] = ([], [])  # the last test's, in the split's order
        # Models that validation and test decode with `self.model` as an ensemble (`decode_with`): a plain list, so
        # that they are neither this module's parameters nor in its checkpoints.
        self.ensemble_members: list[TransformerForConditionalGeneration] = []
        self.ensemble_average: Average = "probabilities"

    @classmethod
    def check_arguments(cls, arguments: Mapping[str, Any]) -> None:
        """Refuse settings of the module's `arguments` that would fail only later, naming the setting: the CLI checks
        them before any work (the data module, built first, may train a tokenizer), the module when it is made. The
        schedule checks its own when it is made."""
        check_training_settings(arguments)

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

    def training_loss(self, batch: dict[str, Any], num_items_in_batch: torch.Tensor | None = None) -> torch.Tensor:
        """The model's loss on `batch`: label-smoothed cross-entropy (`config.label_smoothing`) summed over the target
        tokens and divided by `num_items_in_batch`, by default the batch's own target tokens."""
        return self.model(**batch_inputs(batch), num_items_in_batch=num_items_in_batch).loss

    def on_train_batch_start(self, batch: dict[str, Any], batch_idx: int) -> None:
        """Count the step's target tokens. Every token of an optimizer step weighs the same, as in the paper's
        per-token loss, however the token-budget batches of the ranks and accumulated micro-batches differ: the step's
        first micro-batch fixes one divisor for every rank (its target tokens over all ranks, per rank), so that DDP's
        mean of the ranks' gradients is the gradient of the tokens' sum over that count; `on_before_optimizer_step`
        corrects it to the count of the whole step where micro-batches were accumulated."""
        tokens = self._batch_tokens = (batch["labels"] != IGNORE_INDEX).sum()
        if self._step_divisor is None:
            everywhere = self.trainer.strategy.reduce(tokens.clone(), reduce_op="sum")  # reduces in place
            self._step_divisor, self._step_tokens = everywhere / self.trainer.world_size, tokens
        else:
            self._step_tokens = self._step_tokens + tokens

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        # The data module's collate checked the ids on the CPU; a model in training mode does not check them again
        # (a check would make the step wait for the device).
        if self._step_divisor is None:  # called outside a fit: the batch's own per-token loss
            tokens = divisor = (batch["labels"] != IGNORE_INDEX).sum()
        else:  # counted by `on_train_batch_start`
            tokens, divisor = self._batch_tokens, self._step_divisor
        loss = self.training_loss(batch, divisor)
        per_token = loss.detach() * divisor / tokens
        self.non_finite_losses += ~torch.isfinite(per_token)
        self.log("train/loss", per_token, prog_bar=True)
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Rescale accumulated gradients from the first micro-batch's token count to the whole step's (Lightning has
        divided each micro-batch's loss by `accumulate_grad_batches`); runs before gradient clipping."""
        accumulated = self.trainer.accumulate_grad_batches
        if accumulated > 1:
            step_tokens = self.trainer.strategy.reduce(self._step_tokens.clone(), reduce_op="sum")
            scale = self._step_divisor * self.trainer.world_size * accumulated / step_tokens
            for parameter in self.parameters():
                if parameter.grad is not None:
                    parameter.grad.mul_(scale)
        self._step_divisor = None

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if (batch_idx + 1) % NON_FINITE_CHECK_INTERVAL == 0:
            self.stop_if_diverged()

    def stop_if_diverged(self) -> None:
        """Raise `TrainingDiverged` if a loss since the last check was NaN or infinite, on any rank (one read from the
        device): every rank stops together, where one stopping alone would leave the others waiting in a collective."""
        if int(self.trainer.strategy.reduce(self.non_finite_losses.clone(), reduce_op="sum")):
            raise TrainingDiverged(
                f"The training loss became NaN or infinite before step {self.global_step}. {self.resume_hint()}"
            )

    def configure_optimizers(self):
        hparams = self.hparams
        lr_lambda = self.schedule.lr_lambda(self.model.config.d_model, self.max_steps())
        # One fused kernel for all parameters on GPUs, where Lightning allows it (an eager step's optimizer update is
        # a large share of its GPU time); one multi-tensor loop elsewhere.
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

    def max_steps(self) -> int:
        """`trainer.max_steps`, the run's updates: -1 (no limit) also outside a Trainer."""
        try:
            return self.trainer.max_steps
        except RuntimeError:  # not attached to a Trainer
            return -1

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

    def describe_training(self) -> list[tuple[str, str]]:
        """How this module trains, in words, row by row for the model card (which reads them from the checkpoint,
        `TRAINING_DESCRIPTION`): the schedule's own description; a subclass adds its rows."""
        return [("Learning-rate schedule", self.schedule.describe(self.model.config.d_model))]

    # --- evaluation --------------------------------------------------------------------------------------------

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def decode_with(self, models: list[TransformerForConditionalGeneration], average: Average) -> None:
        """Validation and test translate with `self.model` and `models` as an `Ensemble` (averaging their
        `average`), which must share this module's tokenizer; they log no loss, which is one model's."""
        self.ensemble_members, self.ensemble_average = [model.eval() for model in models], average

    def on_validation_start(self) -> None:
        for model in self.ensemble_members:
            model.to(self.device)

    on_test_start = on_validation_start

    def _evaluate(self, batch: dict[str, Any], stage: str) -> None:
        if not self.ensemble_members:
            self._log_nll(batch, stage)
        hypotheses = self.translate(batch["input_ids"], batch["attention_mask"])
        references = [[reference] for reference in batch["target_text"]]
        if stage == "val":
            self.val_bleu.update(hypotheses, references)
            self.val_chrf.update(hypotheses, references)
            rows = zip(batch["source_text"], batch["target_text"], hypotheses, strict=True)
            self._samples.extend([source, reference, hypothesis] for source, reference, hypothesis in rows)
        if stage == "test":
            self._translations.extend(zip(batch["index"].tolist(), hypotheses, batch["target_text"], strict=True))

    def _log_nll(self, batch: dict[str, Any], stage: str) -> None:
        labels = batch["labels"]
        target_tokens = (labels != IGNORE_INDEX).sum()
        nll = self.model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            labels=labels,
            label_smoothing=0.0,
            return_logits=False,  # the loss alone: never all of an evaluation batch's logits at once
        ).loss
        loss_sum = nll * target_tokens
        batch_size = batch["input_ids"].shape[0]
        # Summed over batches and ranks, then divided: the corpus-level per-token loss.
        self.log(f"{stage}/nll_sum", loss_sum, reduce_fx="sum", sync_dist=True, batch_size=batch_size)
        self.log(f"{stage}/target_tokens", target_tokens.float(), reduce_fx="sum", sync_dist=True)

    def translate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[str]:
        """Beam search as the model's generation config says (the paper's beam 4, length penalty 0.6), each output
        at most its input's length + 50 tokens (section 6.1, `MAX_LENGTH_OFFSET`); with `decode_with`'s models, of
        their ensemble."""
        model = self.model
        if self.ensemble_members:
            model = Ensemble([self.model, *self.ensemble_members], average=self.ensemble_average)
        output_ids = [best[0].token_ids for best in beam_search(model, input_ids, attention_mask)]
        return self.tokenizer.batch_decode(output_ids, skip_special_tokens=True)

    def on_validation_epoch_end(self) -> None:
        if not self.ensemble_members:
            self._log_loss("val")
        # SacreBLEU reports 0-100; torchmetrics' states are sums, so compute() is the exact corpus score over ranks.
        self.log("val/bleu", 100 * self.val_bleu.compute(), prog_bar=True)
        self.log("val/chrf", 100 * self.val_chrf.compute())
        self.val_bleu.reset()
        self.val_chrf.reset()
        self._samples = telling_samples(self._samples, NUM_LOGGED_SAMPLES)
        if not self.trainer.sanity_checking:
            self.val_samples = self._samples
        if self._samples and not self.trainer.sanity_checking and hasattr(self.logger, "log_text"):
            self.logger.log_text("val/samples", columns=["source", "reference", "hypothesis"], data=self._samples)
        self._samples = []

    def on_test_epoch_end(self) -> None:
        if not self.ensemble_members:
            self._log_loss("test")
        hypotheses, references = self._gather_test_translations()
        self.test_translations = hypotheses, references
        # On every rank, from all ranks' translations: each logs the same corpus score.
        for score in sacrebleu_scores(hypotheses, references):
            if score.name in TEST_METRICS:
                self.log(TEST_METRICS[score.name], score.value)

    def _log_loss(self, stage: str) -> None:
        metrics = self.trainer.callback_metrics
        nll = metrics[f"{stage}/nll_sum"] / metrics[f"{stage}/target_tokens"].clamp(min=1)
        self.log(f"{stage}/loss", nll, sync_dist=False)
        self.log(f"{stage}/perplexity", nll.exp(), sync_dist=False)

    def _gather_test_translations(self) -> tuple[list[str], list[str]]:
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
            f"{where} with a lower learning rate (model.schedule.peak_lr), more warm-up "
            "(model.schedule.warmup_steps), gradient clipping (trainer.gradient_clip_val) or bf16-mixed instead of "
            "16-mixed precision."
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
        checkpoint[TRAINING_DESCRIPTION] = self.describe_training()
        if self.tokenizer is not None:
            checkpoint["tokenizer"] = tokenizer_state(self.tokenizer)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.tokenizer is None and "tokenizer" in checkpoint:
            self.tokenizer = tokenizer_from_checkpoint(checkpoint)
        check_same_model(checkpoint, self.model.config, self.tokenizer)
        check_same_weights(checkpoint, self)

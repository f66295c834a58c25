"""R-Drop (Liang et al. 2021, "R-Drop: Regularized Dropout for Neural Networks"): every pair of a batch runs twice,
under two dropout masks, and the loss adds the symmetric KL divergence of each target token's two output
distributions to the two cross-entropies (their eq. 3), pulling the sub-models that dropout samples towards each other.
At the Multi30k recipe's budget it trained on half the pairs of an update and lost on validation
(docs/experiments.md): `RDropTranslationModule` is chosen by class path, the main module knows nothing of it.

The whole loss is computed as the model's own is (`hf_transformer/model/loss.py`): chunk by chunk of tokens, each chunk
of the two copies projected onto the vocabulary once, and the cross-entropies, the divergence and their gradients with
respect to the logits computed together in closed form in the forward pass, so that no fp32 [tokens, vocabulary] tensor
is held for every token of the doubled batch at once.
"""

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from lightning.pytorch.utilities import rank_zero_warn

from hf_transformer import TransformerConfig
from hf_transformer.errors import ConfigError
from hf_transformer.model.integrity import check_token_ids
from hf_transformer.model.loss import IGNORE_INDEX, logits_chunks, projection_dtype, target_span

from ..module import TranslationModule, batch_inputs

# The model's dropouts: R-Drop compares the outputs of two masks of them.
DROPOUTS = ("dropout", "attention_dropout", "activation_dropout")


def warn_without_dropout(config: TransformerConfig) -> None:
    """Warn of R-Drop on a model without dropout: its two copies of a pair are one and the same computation, so each
    step runs every pair twice for a divergence that is always 0. A warning, not an error: that is also the way to
    check that R-Drop's loss reduces to the plain loss."""
    if not any(getattr(config, name) for name in DROPOUTS):
        rank_zero_warn(
            f"R-Drop (model.class_path {RDropTranslationModule.__module__.rsplit('.', 1)[0]}.RDropTranslationModule) "
            "compares the outputs of two dropout masks, but every dropout of the model is 0 ("
            f"{', '.join(f'model.config.{name}' for name in DROPOUTS)}): each step runs every pair twice for a "
            "divergence that is always 0. Set a dropout above 0, or train the plain "
            "lightning_modules.TranslationModule",
            category=UserWarning,
        )


def _rdrop_loss(
    logits: torch.Tensor,
    logits_pair: torch.Tensor,
    target: torch.Tensor,
    is_target: torch.Tensor,
    label_smoothing: float,
    divergence_weight: float,
    compute_gradient: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Summed over the tokens where `is_target` ([tokens, 1]): the label-smoothed cross-entropies of fp32 `logits` and
    `logits_pair` ([tokens, vocab], p and q their softmaxes) at `target` ([tokens, 1]), plus `divergence_weight` times
    KL(p || q) + KL(q || p) = sum over the vocabulary of (p - q)(log p - log q); that divergence alone; and the loss's
    gradients with respect to both logits (None unless asked). With d = log p - log q, w the weight and s the smoothed
    target (1 - eps) * one-hot + eps / vocab, the gradient with respect to the first logits is
    p - s + w * (p * (d - <p, d>) + p - q), and with respect to the second q - s + w * (q * (<q, d> - d) + q - p).
    Overwrites both logits."""
    log_p, log_q = logits.log_softmax(-1), logits_pair.log_softmax(-1)
    # Cross-entropy against the smoothed target: -(1 - eps) * log p_target - eps * mean(log p), for each copy.
    cross_entropy = (log_p.gather(1, target) + log_q.gather(1, target)) * (label_smoothing - 1)
    if label_smoothing:
        cross_entropy -= (log_p.mean(-1, keepdim=True) + log_q.mean(-1, keepdim=True)) * label_smoothing
    p, q = log_p.exp(), log_q.exp()
    difference = log_p.sub_(log_q)  # d, in the buffer of log p
    p_minus_q = torch.sub(p, q, out=logits)
    divergence = torch.where(is_target, (p_minus_q * difference).sum(-1, keepdim=True), 0.0).sum()
    loss = torch.where(is_target, cross_entropy, 0.0).sum() + divergence_weight * divergence
    if not compute_gradient:
        return loss, divergence, None, None
    q_dot_d, p_dot_d = (q * difference).sum(-1, keepdim=True), (p * difference).sum(-1, keepdim=True)
    grad_pair = torch.sub(q_dot_d, difference, out=logits_pair).mul_(divergence_weight).add_(1).mul_(q)
    grad_pair.sub_(p_minus_q, alpha=divergence_weight)
    grad = difference.sub_(p_dot_d).mul_(divergence_weight).add_(1).mul_(p).add_(p_minus_q, alpha=divergence_weight)
    smoothed_target = torch.full_like(grad[:, :1], label_smoothing - 1)
    for gradient in (grad, grad_pair):
        gradient.sub_(label_smoothing / gradient.shape[-1]).scatter_add_(1, target, smoothed_target).mul_(is_target)
    return loss, divergence, grad, grad_pair


class _LinearRDropLoss(torch.autograd.Function):
    """R-Drop's loss of the logits `hidden @ weight.T` and `hidden_pair @ weight.T`, and its gradients, chunk by
    chunk; and the divergence alone, which takes no gradient."""

    @staticmethod
    def forward(ctx, hidden, hidden_pair, weight, labels, label_smoothing, divergence_weight, num_chunks, gradients):
        dtype = projection_dtype(hidden)
        weight_in_dtype = weight.to(dtype)
        loss = hidden.new_zeros((), dtype=torch.float32)
        divergence = torch.zeros_like(loss)
        if gradients:
            # Written chunk by chunk into buffers allocated once: small gradients allocated between the chunks' large
            # temporaries keep glibc's allocator from reusing their memory (the peak memory test's step then holds
            # about as much as the full logits).
            grad_hidden = torch.empty_like(hidden, dtype=dtype)
            grad_hidden_pair = torch.empty_like(hidden_pair, dtype=dtype)
            grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        chunks = zip(
            hidden.to(dtype).tensor_split(num_chunks),
            hidden_pair.to(dtype).tensor_split(num_chunks),
            labels.tensor_split(num_chunks),
            grad_hidden.tensor_split(num_chunks) if gradients else [None] * num_chunks,
            grad_hidden_pair.tensor_split(num_chunks) if gradients else [None] * num_chunks,
            strict=True,
        )
        for chunk, chunk_pair, labels_chunk, grad_chunk, grad_chunk_pair in chunks:
            logits, logits_pair = (chunk @ weight_in_dtype.T).float(), (chunk_pair @ weight_in_dtype.T).float()
            target, is_target = labels_chunk.clamp(min=0)[:, None], (labels_chunk != IGNORE_INDEX)[:, None]
            chunk_loss, chunk_divergence, grad, grad_pair = _rdrop_loss(
                logits, logits_pair, target, is_target, label_smoothing, divergence_weight, gradients
            )
            loss += chunk_loss
            divergence += chunk_divergence
            if gradients:
                grad, grad_pair = grad.to(dtype), grad_pair.to(dtype)
                torch.mm(grad, weight_in_dtype, out=grad_chunk)
                torch.mm(grad_pair, weight_in_dtype, out=grad_chunk_pair)
                grad_weight += grad.T @ chunk + grad_pair.T @ chunk_pair
        if gradients:
            ctx.save_for_backward(
                grad_hidden.to(hidden.dtype), grad_hidden_pair.to(hidden_pair.dtype), grad_weight.to(weight.dtype)
            )
        ctx.mark_non_differentiable(divergence)
        return loss, divergence

    @staticmethod
    def backward(ctx, grad_loss, grad_divergence):
        grad_hidden, grad_hidden_pair, grad_weight = (grad * grad_loss for grad in ctx.saved_tensors)
        return grad_hidden, grad_hidden_pair, grad_weight, None, None, None, None, None


class RDropLoss(NamedTuple):
    """R-Drop's loss, and the divergence in it (unweighted, without gradient: what training logs), each summed over
    the target tokens."""

    loss: torch.Tensor
    divergence: torch.Tensor


def rdrop_loss(
    hidden_states: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, label_smoothing: float, alpha: float
) -> RDropLoss:
    """R-Drop's loss (their eq. 3) summed over the target tokens: the label-smoothed cross-entropies of both copies plus
    alpha / 2 times the divergence KL(P1 || P2) + KL(P2 || P1), where P are the softmaxes of the logits `hidden_states @
    weight.T`; and that divergence. `hidden_states` ([2 x batch, length, d_model], the decoder output) hold the batch
    twice, its second half the same pairs as its first under other dropout masks, and `labels` ([batch, length], -100
    where nothing counts) are those of one half. Equal to the loss of the full logits in value and gradients, with each
    half's fp32 logits for at most `LOGITS_CHUNK_BYTES` at a time (`logits_chunks`); under autocast the projection runs
    in the autocast dtype and the softmaxes in fp32."""
    hidden, hidden_pair = (half.flatten(0, 1) for half in hidden_states.chunk(2))
    num_chunks = logits_chunks(hidden.shape[0], weight.shape[0], hidden.device)
    gradients = torch.is_grad_enabled() and (hidden_states.requires_grad or weight.requires_grad)
    return RDropLoss(
        *_LinearRDropLoss.apply(
            hidden, hidden_pair, weight, labels.flatten(), label_smoothing, alpha / 2, num_chunks, gradients
        )
    )


def check_alpha(alpha: float) -> None:
    if not alpha > 0:
        raise ConfigError(
            f"model.alpha={alpha!r} must be positive (R-Drop's authors translate with 5); without R-Drop, the module "
            "is lightning_modules.TranslationModule"
        )


class RDropTranslationModule(TranslationModule):
    """`TranslationModule` whose training loss is R-Drop's (`rdrop_loss`): each step runs every pair of the batch
    twice, under two dropout masks, and adds alpha / 2 times the symmetric KL divergence of the two output
    distributions to the two cross-entropies, per target token of the doubled batch; a step computes twice
    `data.max_tokens`. `train/loss` is the loss minimized, and `train/rdrop_divergence` the divergence per target
    token (`train/loss` holds alpha / 4 times it).

        model:
          class_path: lightning_modules.experimental.RDropTranslationModule
          init_args: {alpha: 5, preset: base, ...}

    Args:
        alpha: R-Drop's weight (5 in its authors' translation script).
        **kwargs: the arguments of `TranslationModule`.
    """

    def __init__(self, alpha: float = 5.0, **kwargs: Any) -> None:
        check_alpha(alpha)
        super().__init__(**kwargs)
        warn_without_dropout(self.model.config)
        self.alpha = alpha
        # The last training loss's divergence, summed over its target tokens: written inside `training_loss`, which
        # may be compiled, and logged by `training_step`.
        self.register_buffer("divergence", torch.zeros(()), persistent=False)

    @classmethod
    def check_arguments(cls, arguments: Mapping[str, Any]) -> None:
        super().check_arguments(arguments)
        check_alpha(arguments.get("alpha", 5.0))

    def training_loss(self, batch: dict[str, Any], num_items_in_batch: torch.Tensor | None = None) -> torch.Tensor:
        """R-Drop's loss of the batch run twice, divided by twice `num_items_in_batch` (by default the batch's target
        tokens)."""
        inputs = batch_inputs(batch)
        if num_items_in_batch is None:
            num_items_in_batch = (inputs["labels"] != IGNORE_INDEX).sum()
        # One batch holding each pair twice: the two copies draw different dropout masks in one forward pass. The base
        # model runs the decoder as `forward(labels=...)` does (inputs shifted right, up to each row's last target), and
        # `rdrop_loss` projects its output onto the vocabulary once for the cross-entropies and the divergence.
        twice = {name: torch.cat([tensor, tensor]) for name, tensor in inputs.items()}
        check_token_ids(inputs["labels"], self.model.config.vocab_size, IGNORE_INDEX, "labels", training=self.training)
        decoder_output = self.model.base_model(
            twice["input_ids"],
            twice["attention_mask"],
            self.model.prepare_decoder_input_ids_from_labels(twice["labels"]),
            target_span(twice["labels"]),
            use_cache=False,
        ).last_hidden_state
        weight, smoothing = self.model.get_output_embeddings().weight, self.model.config.label_smoothing
        loss, divergence = rdrop_loss(decoder_output, weight, inputs["labels"], smoothing, self.alpha)
        self.divergence.copy_(divergence)
        return loss / (2 * num_items_in_batch)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("train/rdrop_divergence", self.divergence / (batch["labels"] != IGNORE_INDEX).sum())
        return loss

    def describe_training(self) -> list[tuple[str, str]]:
        return [*super().describe_training(), self.description(self.alpha)]

    @staticmethod
    def description(alpha: float) -> tuple[str, str]:
        """The model card's row of R-Drop with weight `alpha`."""
        return (
            "R-Drop",
            f"alpha {alpha} (Liang et al. 2021): each pair runs twice under two dropout masks, and alpha / 2 times the "
            "symmetric KL divergence of the two output distributions adds to the two cross-entropies",
        )

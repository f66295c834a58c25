"""The training loss: label-smoothed cross-entropy (section 5.4) of the output projection (3.4), computed chunk by
chunk so that the [tokens, vocabulary] logits are never held in fp32 for every token at once. It is the loss of
`TransformerForConditionalGeneration.forward(labels=...)`, so every trainer trains the same thing; saved folders carry
this file with their remote code.

At 64k target tokens and a 32k vocabulary, full fp32 logits are 8 GiB, written and read several times by the softmax,
the loss and its gradient. Here each chunk of tokens is projected, scored and differentiated in the forward pass (the
gradient of softmax cross-entropy is known in closed form), and only the gradients with respect to the decoder output
and the projection matrix are kept: the fused linear cross-entropy of Liger Kernel and Apple's Cut Cross-Entropy,
written in plain PyTorch so that it runs, and compiles, on every device.
"""

import math

import torch

from .speed import up_to_last

# The fp32 logits of one chunk stay under this size (the chunk count is rounded so that chunks are equal). On a CPU, a
# chunk that stays in the last-level cache from the projection through the softmax to the gradient is faster (measured:
# docs, "Speed"); on an accelerator, large chunks keep the kernels busy.
LOGITS_CHUNK_BYTES = 256 * 2**20
CPU_LOGITS_CHUNK_BYTES = 8 * 2**20
IGNORE_INDEX = -100


def shift_tokens_right(
    labels: torch.Tensor, pad_token_id: int | None, decoder_start_token_id: int | None
) -> torch.Tensor:
    """Teacher forcing: the decoder input is the target shifted right by one, starting with the start token."""
    for field, value in (("pad_token_id", pad_token_id), ("decoder_start_token_id", decoder_start_token_id)):
        if value is None:
            raise ValueError(
                f"config.{field} is None, but the decoder input is derived from labels with it (labels shifted right, "
                f"-100 replaced by padding): set model.config.{field} to the tokenizer's id, or pass decoder_input_ids."
            )
    decoder_input_ids = labels.roll(1, dims=-1)  # not labels[:, :-1], whose length would make torch.compile
    decoder_input_ids[:, 0] = decoder_start_token_id  # specialise short targets
    return decoder_input_ids.masked_fill_(decoder_input_ids == IGNORE_INDEX, pad_token_id)


def _smoothed_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, is_target: torch.Tensor, label_smoothing: float, compute_gradient: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Summed label-smoothed cross-entropy of fp32 `logits` ([tokens, vocab]) at `target` ([tokens, 1], counted where
    `is_target`), and its gradient with respect to the logits (None unless asked): softmax(logits) minus the smoothed
    target (1 - eps) * one-hot + eps / vocab. Overwrites `logits`: they are the only [tokens, vocab] fp32 buffer,
    exponentiated once, in place (`logsumexp` would write a second one and the gradient exponentiate again)."""
    max_logit = logits.amax(-1, keepdim=True)
    # Cross-entropy against the smoothed target: log Z - (1 - eps) * z_target - eps * mean(z).
    smoothed_logit = logits.gather(1, target) * (1 - label_smoothing)
    if label_smoothing:
        smoothed_logit += logits.mean(-1, keepdim=True) * label_smoothing
    shifted_normalizer = logits.sub_(max_logit).exp_().sum(-1, keepdim=True)  # Z / exp(max)
    loss = torch.where(is_target, shifted_normalizer.log() + max_logit - smoothed_logit, 0.0).sum()
    if not compute_gradient:
        return loss, None
    grad = logits.div_(shifted_normalizer).sub_(label_smoothing / logits.shape[-1])
    grad.scatter_add_(1, target, torch.full_like(grad[:, :1], label_smoothing - 1))
    return loss, grad.mul_(is_target)


def logits_chunks(tokens: int, vocab_size: int, device: torch.device) -> int:
    """The number of equal chunks of `tokens` whose fp32 logits each stay under `LOGITS_CHUNK_BYTES`
    (`CPU_LOGITS_CHUNK_BYTES` on a CPU)."""
    chunk_bytes = CPU_LOGITS_CHUNK_BYTES if device.type == "cpu" else LOGITS_CHUNK_BYTES
    return max(1, math.ceil(tokens * vocab_size * 4 / chunk_bytes))


def projection_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The dtype the output projection of `hidden` runs in: autocast's where it is on (as `F.linear` would), else
    `hidden`'s."""
    device = hidden.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype


class _LinearCrossEntropy(torch.autograd.Function):
    """Sum over tokens of the label-smoothed cross-entropy of `hidden @ weight.T`, and its gradients, chunk by chunk."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, label_smoothing, num_chunks, compute_gradients):
        dtype = projection_dtype(hidden)
        weight_in_dtype = weight.to(dtype)
        loss = hidden.new_zeros((), dtype=torch.float32)
        grad_hidden = []
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if compute_gradients else None
        for hidden_chunk, labels_chunk in zip(
            hidden.to(dtype).tensor_split(num_chunks), labels.tensor_split(num_chunks), strict=True
        ):
            logits = (hidden_chunk @ weight_in_dtype.T).float()
            target, is_target = labels_chunk.clamp(min=0)[:, None], (labels_chunk != IGNORE_INDEX)[:, None]
            chunk_loss, grad = _smoothed_cross_entropy(logits, target, is_target, label_smoothing, compute_gradients)
            loss += chunk_loss
            if compute_gradients:
                grad = grad.to(dtype)
                grad_hidden.append(grad @ weight_in_dtype)
                grad_weight += grad.T @ hidden_chunk
        if compute_gradients:
            ctx.save_for_backward(torch.cat(grad_hidden).to(hidden.dtype), grad_weight.to(weight.dtype))
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = (grad * grad_loss for grad in ctx.saved_tensors)
        return grad_hidden, grad_weight, None, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Summed label-smoothed cross-entropy of the logits `hidden @ weight.T` ([tokens, d_model] @ [d_model, vocab]) at
    `labels` ([tokens], -100 ignored): equal to `F.cross_entropy(hidden @ weight.T, labels, label_smoothing=...,
    reduction="sum")` in value and gradients, with fp32 logits for at most `LOGITS_CHUNK_BYTES` at a time
    (`CPU_LOGITS_CHUNK_BYTES` on a CPU). Under autocast the projection runs in the autocast dtype (as `F.linear` would)
    and the softmax in fp32."""
    num_chunks = logits_chunks(hidden.shape[0], weight.shape[0], hidden.device)
    compute_gradients = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    return _LinearCrossEntropy.apply(hidden, weight, labels, label_smoothing, num_chunks, compute_gradients)


def target_span(labels: torch.Tensor) -> torch.Tensor:
    """The decoder positions up to each row's last target token; the rest is padding, which no target attends to
    under the causal mask. (A -100 between targets is no padding: later positions attend to it.)"""
    return up_to_last(labels != IGNORE_INDEX)


def translation_loss(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    label_smoothing: float,
    num_items_in_batch: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """The loss of teacher forcing: label-smoothed cross-entropy of the decoder output `hidden_states` ([batch, length,
    d_model]) projected by `weight` at `labels` ([batch, length], -100 on padding), summed over the target tokens and
    divided by their number (or by `num_items_in_batch`, the target tokens of all accumulated micro-batches).

    Every position is projected onto the vocabulary and padding is ignored by its label, at the cost of the few
    percent of padding that token-budget batches have: selecting the target positions would need their number on the
    host, a wait for the device in every step (and a data-dependent shape that a `torch.compile` graph cannot hold)."""
    summed = linear_cross_entropy(hidden_states.flatten(0, 1), weight, labels.flatten(), label_smoothing)
    return summed / ((labels != IGNORE_INDEX).sum() if num_items_in_batch is None else num_items_in_batch)

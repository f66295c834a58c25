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

# The fp32 logits of one chunk stay under this size (the chunk count is rounded so that chunks are equal). On a CPU, a
# chunk that stays in the last-level cache from the projection through the softmax to the gradient is faster: 8 MiB made
# the training step of configs/multi30k.yaml 10% shorter on a 2-core EPYC (medians; 2 MiB was slower than either). On an
# accelerator, large chunks keep the kernels busy.
LOGITS_CHUNK_BYTES = 256 * 2**20
CPU_LOGITS_CHUNK_BYTES = 8 * 2**20
IGNORE_INDEX = -100


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher forcing: the decoder input is the target shifted right by one, starting with the start token."""
    decoder_input_ids = labels.roll(1, dims=-1)  # not labels[:, :-1], whose length would make torch.compile
    decoder_input_ids[:, 0] = decoder_start_token_id  # specialise short targets
    return decoder_input_ids.masked_fill_(decoder_input_ids == IGNORE_INDEX, pad_token_id)


def _smoothed_target_term(values: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """(1 - eps) * values[target] + eps * mean(values) per token: the expectation of `values` ([tokens, vocab]: logits
    or log-probabilities) under the smoothed target (1 - eps) * one-hot + eps / vocab."""
    smoothed = values.gather(1, target) * (1 - label_smoothing)
    if label_smoothing:
        smoothed += values.mean(-1, keepdim=True) * label_smoothing
    return smoothed


def _subtract_smoothed_target_(
    probs: torch.Tensor, target: torch.Tensor, is_target: torch.Tensor, label_smoothing: float
) -> torch.Tensor:
    """probs - ((1 - eps) * one-hot + eps / vocab), zero for ignored tokens, in place: the gradient of the smoothed
    cross-entropy with respect to the logits, given `probs` = their softmax."""
    probs.sub_(label_smoothing / probs.shape[-1])
    probs.scatter_add_(1, target, torch.full_like(probs[:, :1], label_smoothing - 1))
    return probs.mul_(is_target)


def _smoothed_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, is_target: torch.Tensor, label_smoothing: float, compute_gradient: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Summed label-smoothed cross-entropy of fp32 `logits` ([tokens, vocab]) at `target` ([tokens, 1], counted where
    `is_target`), and its gradient with respect to the logits (None unless asked). Overwrites `logits`: they are the
    only [tokens, vocab] fp32 buffer, exponentiated once, in place (`logsumexp` would write a second one and the
    gradient exponentiate again: 0.11 s instead of 0.07 s per step of configs/multi30k.yaml on a 2-core CPU)."""
    max_logit = logits.amax(-1, keepdim=True)
    # Cross-entropy against the smoothed target: log Z - (1 - eps) * z_target - eps * mean(z).
    smoothed_logit = _smoothed_target_term(logits, target, label_smoothing)
    shifted_normalizer = logits.sub_(max_logit).exp_().sum(-1, keepdim=True)  # Z / exp(max)
    loss = torch.where(is_target, shifted_normalizer.log() + max_logit - smoothed_logit, 0.0).sum()
    if not compute_gradient:
        return loss, None
    return loss, _subtract_smoothed_target_(logits.div_(shifted_normalizer), target, is_target, label_smoothing)


def _softmax_and_log_softmax_(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The softmax and the log-softmax of fp32 `logits` ([tokens, vocab]), exponentiating once (`logsumexp` and then
    `exp` of its result exponentiate twice: R-Drop's loss and gradient ran 1.05x as fast this way on a 2-core CPU,
    medians of 7 rounds). The log-softmax overwrites `logits`."""
    shifted = logits.sub_(logits.amax(-1, keepdim=True))
    probs = shifted.exp()
    normalizer = probs.sum(-1, keepdim=True)
    return probs.div_(normalizer), shifted.sub_(normalizer.log())


def _rdrop_cross_entropy(
    logits: torch.Tensor,
    logits_pair: torch.Tensor,
    target: torch.Tensor,
    is_target: torch.Tensor,
    label_smoothing: float,
    rdrop_alpha: float,
    compute_gradient: bool,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """R-Drop's loss (Liang et al. 2021, eq. 3) of two fp32 logits of the same tokens under two dropout masks: both
    label-smoothed cross-entropies plus alpha/2 * (KL(p || q) + KL(q || p)), summed over the tokens, and the gradients
    with respect to both logits (None unless asked). With d = log p - log q, the gradient with respect to the first
    logits is p - smoothed one-hot + alpha/2 * (p * (1 + d - KL(p || q)) - q), and the mirror image for the second.
    Overwrites both logits; every [tokens, vocab] operation is one pass over memory, in place where it can be."""
    (probs, log_probs), (probs_pair, log_probs_pair) = map(_softmax_and_log_softmax_, (logits, logits_pair))
    loss = -sum(
        torch.where(is_target, _smoothed_target_term(x, target, label_smoothing), 0.0).sum()
        for x in (log_probs, log_probs_pair)
    )
    log_ratio = log_probs.sub_(log_probs_pair)
    kl = torch.linalg.vecdot(probs, log_ratio)[:, None]  # KL(p || q)
    kl_pair = -torch.linalg.vecdot(probs_pair, log_ratio)[:, None]  # KL(q || p)
    loss += rdrop_alpha / 2 * torch.where(is_target, kl + kl_pair, 0.0).sum()
    if not compute_gradient:
        return loss, None
    half_alpha = torch.where(is_target, rdrop_alpha / 2, 0.0)
    grads = []
    for p, q, kl_p, sign in ((probs, probs_pair, kl, 1), (probs_pair, probs, kl_pair, -1)):
        # p * (1 + alpha/2 * (1 - KL + d)) - alpha/2 * q, then minus the smoothed target; d = sign * log_ratio.
        grad = torch.addcmul(1 + half_alpha * (1 - kl_p), half_alpha, log_ratio, value=sign).mul_(p)
        grad.addcmul_(q, half_alpha, value=-1)
        grads.append(_subtract_smoothed_target_(grad, target, is_target, label_smoothing))
    return loss, tuple(grads)


class _LinearCrossEntropy(torch.autograd.Function):
    """Sum over tokens of the label-smoothed cross-entropy of `hidden @ weight.T`, and its gradients, chunk by chunk.
    With `hidden_pair`, the same tokens' decoder output under other dropout, R-Drop's loss of the two instead."""

    @staticmethod
    def forward(ctx, hidden, hidden_pair, weight, labels, label_smoothing, rdrop_alpha, num_chunks, compute_gradients):
        device = hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        weight_in_dtype = weight.to(dtype)
        hiddens = (hidden,) if hidden_pair is None else (hidden, hidden_pair)
        loss = hidden.new_zeros((), dtype=torch.float32)
        grad_hiddens = [[] for _ in hiddens]
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if compute_gradients else None
        chunks = zip(
            *(h.to(dtype).tensor_split(num_chunks) for h in hiddens), labels.tensor_split(num_chunks), strict=True
        )
        for *hidden_chunks, labels_chunk in chunks:
            logits = [(hidden_chunk @ weight_in_dtype.T).float() for hidden_chunk in hidden_chunks]
            targets = labels_chunk.clamp(min=0)[:, None], (labels_chunk != IGNORE_INDEX)[:, None]
            if hidden_pair is None:
                chunk_loss, grad = _smoothed_cross_entropy(*logits, *targets, label_smoothing, compute_gradients)
                grad_logits = (grad,)
            else:
                chunk_loss, grad_logits = _rdrop_cross_entropy(
                    *logits, *targets, label_smoothing, rdrop_alpha, compute_gradients
                )
            loss += chunk_loss
            if compute_gradients:
                for grads, hidden_chunk, grad in zip(grad_hiddens, hidden_chunks, grad_logits, strict=True):
                    grad = grad.to(dtype)
                    grads.append(grad @ weight_in_dtype)
                    grad_weight += grad.T @ hidden_chunk
        if compute_gradients:
            ctx.save_for_backward(
                *(torch.cat(grads).to(hidden.dtype) for grads in grad_hiddens), grad_weight.to(weight.dtype)
            )
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, *grad_hidden_pair, grad_weight = (grad * grad_loss for grad in ctx.saved_tensors)
        grad_hidden_pair = grad_hidden_pair[0] if grad_hidden_pair else None
        return grad_hidden, grad_hidden_pair, grad_weight, None, None, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    label_smoothing: float = 0.0,
    hidden_pair: torch.Tensor | None = None,
    rdrop_alpha: float = 0.0,
) -> torch.Tensor:
    """Summed label-smoothed cross-entropy of the logits `hidden @ weight.T` ([tokens, d_model] @ [d_model, vocab]) at
    `labels` ([tokens], -100 ignored): equal to `F.cross_entropy(hidden @ weight.T, labels, label_smoothing=...,
    reduction="sum")` in value and gradients, with fp32 logits for at most `LOGITS_CHUNK_BYTES` at a time
    (`CPU_LOGITS_CHUNK_BYTES` on a CPU). Under autocast the projection runs in the autocast dtype (as `F.linear` would)
    and the softmax in fp32.

    With `hidden_pair` (the same tokens' decoder output under other dropout masks), R-Drop's loss instead: the summed
    cross-entropies of both plus `rdrop_alpha` / 2 times their symmetric KL divergence; the two logits of a chunk
    together stay under the size."""
    chunk_bytes = CPU_LOGITS_CHUNK_BYTES if hidden.device.type == "cpu" else LOGITS_CHUNK_BYTES
    logits_bytes = hidden.shape[0] * weight.shape[0] * 4 * (1 if hidden_pair is None else 2)
    num_chunks = max(1, math.ceil(logits_bytes / chunk_bytes))
    inputs = (hidden, weight) if hidden_pair is None else (hidden, hidden_pair, weight)
    compute_gradients = torch.is_grad_enabled() and any(tensor.requires_grad for tensor in inputs)
    return _LinearCrossEntropy.apply(
        hidden, hidden_pair, weight, labels, label_smoothing, rdrop_alpha, num_chunks, compute_gradients
    )


def target_span(labels: torch.Tensor) -> torch.Tensor:
    """The decoder positions up to each row's last target token; the rest is padding, which no target attends to
    under the causal mask. (A -100 between targets is no padding: later positions attend to it.)"""
    return (labels != IGNORE_INDEX).flip(-1).cumsum(-1).flip(-1) > 0


def translation_loss(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    label_smoothing: float,
    num_items_in_batch: int | torch.Tensor | None = None,
    rdrop_alpha: float = 0.0,
) -> torch.Tensor:
    """The loss of teacher forcing: label-smoothed cross-entropy of the decoder output `hidden_states` ([batch, length,
    d_model]) projected by `weight` at `labels` ([batch, length], -100 on padding), summed over the target tokens and
    divided by their number (or by `num_items_in_batch`, the target tokens of all accumulated micro-batches).

    With `rdrop_alpha` > 0 the batch holds every pair twice, its second half repeating its first (R-Drop: the two
    halves see different dropout masks), and the loss adds `rdrop_alpha` / 2 times the symmetric KL divergence of
    each token's two output distributions (`linear_cross_entropy`), still divided by the target tokens of the batch.

    Every position is projected onto the vocabulary and padding is ignored by its label, at the cost of the few
    percent of padding that token-budget batches have: selecting the target positions would need their number on the
    host, a wait for the device in every step (and a data-dependent shape that a `torch.compile` graph cannot hold)."""
    is_target = labels != IGNORE_INDEX
    hidden_states, targets = hidden_states.flatten(0, 1), labels.flatten()
    if rdrop_alpha:
        halves_differ = labels.shape[0] % 2 or not (torch.compiler.is_compiling() or torch.equal(*labels.chunk(2)))
        if halves_differ:
            raise ValueError("rdrop_alpha needs a batch whose second half repeats its first, e.g. torch.cat([b, b])")
        hidden_states, hidden_pair = hidden_states.chunk(2)
        summed = linear_cross_entropy(
            hidden_states, weight, targets.chunk(2)[0], label_smoothing, hidden_pair, rdrop_alpha
        )
    else:
        summed = linear_cross_entropy(hidden_states, weight, targets, label_smoothing)
    return summed / (is_target.sum() if num_items_in_batch is None else num_items_in_batch)

"""R-Drop (Liang et al. 2021, "R-Drop: Regularized Dropout for Neural Networks"): every pair of a batch runs twice,
under two dropout masks, and the loss adds the symmetric KL divergence of each target token's two output
distributions to the two cross-entropies (their eq. 3), pulling the sub-models that dropout samples towards each other.

The divergence is computed as the model's loss is (`hf_transformer/model/loss.py`): chunk by chunk of tokens, each
chunk projected onto the vocabulary, scored and differentiated in closed form in the forward pass, so that no fp32
[tokens, vocabulary] tensor is held for every token of the doubled batch at once.
"""

import torch

from hf_transformer.model.loss import IGNORE_INDEX, logits_chunks, projection_dtype


def _symmetric_kl(
    logits: torch.Tensor, logits_pair: torch.Tensor, is_target: torch.Tensor, compute_gradient: bool
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Summed KL(p || q) + KL(q || p) = sum over the vocabulary of (p - q)(log p - log q) of fp32 `logits` and
    `logits_pair` ([tokens, vocab], p and q their softmaxes), counted where `is_target` ([tokens, 1]), and its
    gradients with respect to both logits (None unless asked). With d = log p - log q, the gradient with respect to
    the first logits is p * (d - <p, d>) + p - q, and with respect to the second q * (<q, d> - d) + q - p."""
    log_p, log_q = logits.log_softmax(-1), logits_pair.log_softmax(-1)
    p, q = log_p.exp(), log_q.exp()
    difference = log_p.sub_(log_q)  # d, in the buffer of log p
    p_minus_q = torch.sub(p, q, out=logits)  # the logits' buffer, no longer needed
    divergence = torch.where(is_target, (p_minus_q * difference).sum(-1, keepdim=True), 0.0).sum()
    if not compute_gradient:
        return divergence, None, None
    grad_pair = q.mul_((q * difference).sum(-1, keepdim=True) - difference).sub_(p_minus_q)
    grad = p.mul_(difference.sub_((p * difference).sum(-1, keepdim=True))).add_(p_minus_q)
    return divergence, grad.mul_(is_target), grad_pair.mul_(is_target)


class _LinearSymmetricKL(torch.autograd.Function):
    """Sum over tokens of the symmetric KL divergence of `hidden @ weight.T` and `hidden_pair @ weight.T`, and its
    gradients, chunk by chunk."""

    @staticmethod
    def forward(ctx, hidden, hidden_pair, weight, labels, num_chunks, compute_gradients):
        dtype = projection_dtype(hidden)
        weight_in_dtype = weight.to(dtype)
        divergence = hidden.new_zeros((), dtype=torch.float32)
        if compute_gradients:
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
            grad_hidden.tensor_split(num_chunks) if compute_gradients else [None] * num_chunks,
            grad_hidden_pair.tensor_split(num_chunks) if compute_gradients else [None] * num_chunks,
            strict=True,
        )
        for chunk, chunk_pair, labels_chunk, grad_chunk, grad_chunk_pair in chunks:
            logits, logits_pair = (chunk @ weight_in_dtype.T).float(), (chunk_pair @ weight_in_dtype.T).float()
            is_target = (labels_chunk != IGNORE_INDEX)[:, None]
            chunk_divergence, grad, grad_pair = _symmetric_kl(logits, logits_pair, is_target, compute_gradients)
            divergence += chunk_divergence
            if compute_gradients:
                grad, grad_pair = grad.to(dtype), grad_pair.to(dtype)
                torch.mm(grad, weight_in_dtype, out=grad_chunk)
                torch.mm(grad_pair, weight_in_dtype, out=grad_chunk_pair)
                grad_weight += grad.T @ chunk + grad_pair.T @ chunk_pair
        if compute_gradients:
            ctx.save_for_backward(
                grad_hidden.to(hidden.dtype), grad_hidden_pair.to(hidden_pair.dtype), grad_weight.to(weight.dtype)
            )
        return divergence

    @staticmethod
    def backward(ctx, grad_divergence):
        grad_hidden, grad_hidden_pair, grad_weight = (grad * grad_divergence for grad in ctx.saved_tensors)
        return grad_hidden, grad_hidden_pair, grad_weight, None, None, None


def symmetric_kl_divergence(hidden_states: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """KL(P1 || P2) + KL(P2 || P1) summed over the target tokens (R-Drop's eq. 2 twice), where P are the softmaxes of
    the logits `hidden_states @ weight.T`: `hidden_states` ([2 x batch, length, d_model], the decoder output) hold the
    batch twice, its second half the same pairs as its first under other dropout masks, and `labels` ([batch, length],
    -100 where nothing counts) are those of one half. Equal to the divergence of the full logits in value and
    gradients, with each half's fp32 logits for at most `LOGITS_CHUNK_BYTES` at a time (`logits_chunks`); under
    autocast the projection runs in the autocast dtype and the softmaxes in fp32."""
    hidden, hidden_pair = (half.flatten(0, 1) for half in hidden_states.chunk(2))
    num_chunks = logits_chunks(hidden.shape[0], weight.shape[0], hidden.device)
    compute_gradients = torch.is_grad_enabled() and (hidden_states.requires_grad or weight.requires_grad)
    return _LinearSymmetricKL.apply(hidden, hidden_pair, weight, labels.flatten(), num_chunks, compute_gradients)

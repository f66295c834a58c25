"""R-Drop (Liang et al. 2021, "R-Drop: Regularized Dropout for Neural Networks"): every pair of a batch runs twice,
under two dropout masks, and the loss adds the symmetric KL divergence of each target token's two output
distributions to the two cross-entropies (their eq. 3), pulling the sub-models that dropout samples towards each other.
"""

import torch

from hf_transformer.model.loss import IGNORE_INDEX


def symmetric_kl_divergence(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """KL(P1 || P2) + KL(P2 || P1) summed over the target tokens (R-Drop's eq. 2 twice), where `logits` ([2 x batch,
    length, vocab]) hold the batch twice, its second half the same pairs as its first under other dropout masks, and
    `labels` ([batch, length], -100 where nothing counts) are those of one half. Per token, the sum over the vocabulary
    of (p1 - p2)(log p1 - log p2), computed in fp32."""
    log_probs, log_probs_pair = logits.float().log_softmax(-1).chunk(2)
    divergence = ((log_probs.exp() - log_probs_pair.exp()) * (log_probs - log_probs_pair)).sum(-1)
    return divergence.masked_fill(labels == IGNORE_INDEX, 0.0).sum()

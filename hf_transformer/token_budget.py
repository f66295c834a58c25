"""Packing items of different lengths into batches under a token budget: the one packer behind training batches
(`lightning_modules.data.batching`) and `translate()`. It works on numpy arrays and returns batch boundaries, so that
an epoch's plan over a corpus of a hundred million pairs is two arrays, not a hundred million Python ints."""

from collections.abc import Sequence

import numpy as np


def token_budget_boundaries(costs: np.ndarray, max_tokens: int, max_sentences: int | None = None) -> np.ndarray:
    """Cut the items of `costs`, in their order, into consecutive batches of n items with n * (largest cost in the
    batch) <= `max_tokens` and n <= `max_sentences`, each batch as large as the rule allows (greedily, in order).

    Returns the batches' boundaries: batch k holds items `boundaries[k]:boundaries[k + 1]`. An item's cost is the
    length it is padded to times the rows it takes, so `max_tokens` bounds the tokens of the padded tensor: a pair's
    longer side for training, a sentence's length times the beams for beam search. An item costlier than
    `max_tokens` gets a batch of its own.
    """
    costs = np.asarray(costs)  # any integer type: the products below are int64
    count = len(costs)
    limit = min(max_sentences or count, count)
    # A batch never holds more items than the budget divided by its cheapest item's cost (at least 1).
    window = max(1, min(limit, max_tokens // max(1, int(costs.min(initial=1)))))
    sizes = np.arange(1, window + 1)
    boundaries, start = [0], 0
    while start < count:
        longest = np.maximum.accumulate(costs[start : start + window])
        fits = sizes[: len(longest)] * longest <= max_tokens
        # The batch ends before the first item that does not fit; the first item always goes in.
        size = len(longest) if fits.all() else max(1, int(fits.argmin()))
        start += size
        boundaries.append(start)
    return np.asarray(boundaries, dtype=np.int64)


def pack_token_budget(
    costs: Sequence[int] | np.ndarray,
    max_tokens: int,
    max_sentences: int | None = None,
    order: Sequence[int] | np.ndarray | None = None,
) -> list[list[int]]:
    """The indices in `order` (default: by ascending cost) cut into batches by `token_budget_boundaries`, as lists:
    for the few batches of a call to `translate()`."""
    costs = np.asarray(costs, dtype=np.int64)
    order = np.argsort(costs, kind="stable") if order is None else np.asarray(order, dtype=np.int64)
    boundaries = token_budget_boundaries(costs[order], max_tokens, max_sentences)
    return [order[start:end].tolist() for start, end in zip(boundaries[:-1], boundaries[1:], strict=True)]

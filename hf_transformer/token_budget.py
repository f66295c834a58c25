"""Packing items of different lengths into batches under a token budget: the one packer behind training batches
(`lightning_modules.data.batching`) and `translate()`."""

from collections.abc import Iterable, Sequence


def pack_token_budget(
    costs: Sequence[int],
    max_tokens: int,
    max_sentences: int | None = None,
    order: Iterable[int] | None = None,
) -> list[list[int]]:
    """Cut the indices in `order` (default: by ascending cost) into consecutive batches of n items with
    n * (largest cost in the batch) <= `max_tokens` and n <= `max_sentences`.

    An item's cost is the length it is padded to times the rows it takes, so `max_tokens` bounds the tokens of the
    padded tensor: a pair's longer side for training, a sentence's length times the beams for beam search. An item
    costlier than `max_tokens` gets a batch of its own.
    """
    if order is None:
        order = sorted(range(len(costs)), key=costs.__getitem__)
    limit = max_sentences or len(costs)
    batches, current, longest = [], [], 0
    for index in order:
        grown = max(longest, costs[index])
        if current and ((len(current) + 1) * grown > max_tokens or len(current) == limit):
            batches.append(current)
            current, grown = [], costs[index]
        current.append(index)
        longest = grown
    if current:
        batches.append(current)
    return batches

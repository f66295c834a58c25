"""The token-budget batch sampler, the resumable loader and the collator, on made-up lengths."""

import tracemalloc

import numpy as np
import pytest
import torch

from hf_transformer.errors import DataError
from hf_transformer.token_budget import pack_token_budget, token_budget_boundaries
from lightning_modules.data import batching
from lightning_modules.data.batching import (
    ResumableDataLoader,
    TokenBudgetBatchSampler,
    TranslationCollator,
    padding_efficiency,
)


def random_lengths(count: int = 1000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    source = rng.integers(2, 40, count)
    return source, np.clip(source + rng.integers(-5, 6, count), 2, None)


def test_budget_and_max_sentences_hold_for_every_batch():
    source, target = random_lengths()
    sampler = TokenBudgetBatchSampler(source, target, max_tokens=300, max_sentences=20)
    for batch in sampler:
        assert len(batch) <= 20
        assert len(batch) * max(source[batch].max(), target[batch].max()) <= 300


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_get_disjoint_batches_of_equal_count_covering_the_data(world_size):
    source, target = random_lengths()
    for epoch in range(3):
        per_rank = []
        for rank in range(world_size):
            sampler = TokenBudgetBatchSampler(source, target, 300, rank=rank, world_size=world_size, seed=1)
            sampler.set_epoch(epoch)
            per_rank.append(list(sampler))
        assert len({len(batches) for batches in per_rank}) == 1
        indices = [i for batches in per_rank for batch in batches for i in batch]
        assert sorted(indices) == list(range(len(source)))


def test_plan_depends_only_on_seed_and_epoch():
    source, target = random_lengths()

    def plan(seed, epoch):
        sampler = TokenBudgetBatchSampler(source, target, 300, seed=seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    assert plan(0, 0) == plan(0, 0)
    assert plan(0, 0) != plan(0, 1)
    assert plan(0, 0) != plan(1, 0)


def test_evaluation_order_is_fixed():
    source, target = random_lengths()
    sampler = TokenBudgetBatchSampler(source, target, 300, shuffle=False)
    assert sampler.plan(0) == sampler.plan(5)


def test_a_fraction_of_the_evaluation_batches_holds_pairs_of_every_length():
    """A fractional trainer.limit_val_batches keeps the first batches: given in length order, they held the shortest
    pairs only. The batches themselves are those of before, the length-ordered packing, given in a fixed order."""
    source, target = random_lengths(2000)
    for seed in range(3):
        batches = list(TokenBudgetBatchSampler(source, target, 300, shuffle=False, seed=seed))
        kept = source[np.concatenate(batches[: int(0.25 * len(batches))])]
        # Short pairs fill few batches (many a batch), so a sample of batches reaches into the shortest pairs less far.
        assert kept.min() <= np.percentile(source, 15) and kept.max() >= np.percentile(source, 90)
    sampler = TokenBudgetBatchSampler(source, target, 300, shuffle=False)
    order, starts, ends = sampler.plan_arrays()
    assert (np.diff(source[order]) >= 0).all()
    in_place = np.argsort(starts)
    packing = token_budget_boundaries(np.maximum(source[order], target[order]), 300)
    assert np.append(starts[in_place], ends[in_place][-1]).tolist() == packing.tolist()


def test_sampler_is_its_own_sampler_for_lightning_set_epoch():
    sampler = TokenBudgetBatchSampler(*random_lengths(), 300)
    sampler.sampler.set_epoch(4)
    assert sampler.epoch == 4


def test_pair_longer_than_budget_is_an_error():
    with pytest.raises(DataError, match="max_tokens=10"):
        TokenBudgetBatchSampler([5, 12], [5, 3], max_tokens=10)


def test_sorted_batching_pads_far_less_than_random():
    source, target = random_lengths(5000)
    sampler = TokenBudgetBatchSampler(source, target, 1000)
    ours = padding_efficiency(sampler, source, target)
    shuffled = np.array_split(np.random.default_rng(0).permutation(len(source)), len(sampler))
    assert ours > 0.9 > 0.7 > padding_efficiency(shuffled, source, target)


def test_padding_efficiency_counts_both_sides():
    assert padding_efficiency([[0, 1]], [2, 4], [3, 3]) == pytest.approx((2 + 4 + 3 + 3) / (2 * 4 + 2 * 3))


@pytest.mark.parametrize("max_sentences", [None, 3])
def test_packer_keeps_every_padded_batch_within_the_budget_in_the_given_order(max_sentences):
    """For beam search a sentence costs its length times the beams: the budget bounds the beam-expanded tensor."""
    lengths, num_beams = random_lengths(200)[0].tolist(), 4
    batches = pack_token_budget([num_beams * length for length in lengths], 300, max_sentences)
    assert [i for batch in batches for i in batch] == sorted(range(len(lengths)), key=lengths.__getitem__)
    for batch in batches:
        assert len(batch) * num_beams * max(lengths[i] for i in batch) <= 300
        assert max_sentences is None or len(batch) <= max_sentences
    assert len(batches) < len(lengths) / 2  # batches are filled, not cut early

    order = np.random.default_rng(0).permutation(len(lengths)).tolist()
    assert [i for batch in pack_token_budget(lengths, 300, order=order) for i in batch] == order


def greedy_batches(costs: list[int], max_tokens: int, max_sentences: int | None) -> list[list[int]]:
    """The packing rule, item by item: a batch grows while n * (largest cost) stays within the budget."""
    batches, current, longest = [], [], 0
    for index, cost in enumerate(costs):
        if current and ((len(current) + 1) * max(longest, cost) > max_tokens or len(current) == max_sentences):
            batches.append(current)
            current, longest = [], 0
        current.append(index)
        longest = max(longest, cost)
    return batches + [current] if current else batches


@pytest.mark.parametrize("seed", range(20))
def test_the_array_packer_cuts_where_the_item_by_item_rule_does(seed):
    """`token_budget_boundaries` looks at windows of items at once: the same batches as the rule applied one item at a
    time, also with items over the budget, equal costs, zero costs and a sentence limit."""
    rng = np.random.default_rng(seed)
    costs = rng.integers(0 if seed % 5 == 0 else 1, 40, size=int(rng.integers(1, 300))).tolist()
    if seed % 3 == 0:
        costs[int(rng.integers(len(costs)))] = 500  # over the budget
    max_tokens, max_sentences = int(rng.integers(40, 200)), [None, 1, 7][seed % 3]
    boundaries = token_budget_boundaries(np.array(costs), max_tokens, max_sentences)
    batches = [list(range(start, end)) for start, end in zip(boundaries[:-1], boundaries[1:], strict=True)]
    assert batches == greedy_batches(costs, max_tokens, max_sentences)


def test_packer_gives_an_item_over_the_budget_a_batch_of_its_own():
    assert pack_token_budget([2, 50, 3, 4], 10) == [[0, 2], [3], [1]]


def loader_over(lengths: np.ndarray, num_workers: int = 0, **sampler_args) -> ResumableDataLoader:
    """A loader whose batches are the index lists themselves."""
    sampler = TokenBudgetBatchSampler(lengths, lengths, 60, **sampler_args)
    return ResumableDataLoader(
        list(range(len(lengths))), batch_sampler=sampler, collate_fn=list, num_workers=num_workers
    )


@pytest.mark.parametrize(("epoch", "num_workers"), [(0, 0), (2, 0), (2, 2)])
def test_loader_resumes_with_the_next_unseen_batch(epoch, num_workers):
    lengths = random_lengths(300)[0]
    loader = loader_over(lengths, num_workers, seed=3)
    loader.batch_sampler.set_epoch(epoch)
    full = list(loader)
    seen = []
    for batch in loader:
        seen.append(batch)
        if len(seen) == 4:
            break
    state = loader.state_dict()
    assert state == {"epoch": epoch, "batches_done": 4}

    resumed = loader_over(lengths, num_workers, seed=3)
    resumed.load_state_dict(state)
    resumed.batch_sampler.set_epoch(epoch)  # Lightning sets the same epoch again before iterating
    assert seen + list(resumed) == full
    assert list(resumed) == full  # the resume point applies once; the next pass is whole again


def test_loader_starts_a_new_epoch_from_its_first_batch():
    lengths = random_lengths(300)[0]
    loader = loader_over(lengths)
    list(loader)
    state = loader.state_dict()
    resumed = loader_over(lengths)
    resumed.load_state_dict(state)  # saved at the end of epoch 0
    resumed.batch_sampler.set_epoch(1)
    expected = loader_over(lengths)
    expected.batch_sampler.set_epoch(1)
    assert list(resumed) == list(expected)


def test_collator_pads_right_and_masks_labels():
    collate = TranslationCollator(pad_token_id=0, max_source_positions=4, max_target_positions=3)
    rows = [
        {"input_ids": [5, 6, 2], "labels": [7, 2], "source_text": "a", "target_text": "b", "index": 4},
        {"input_ids": [5, 6, 7, 8, 9, 2], "labels": [8, 9, 10, 2], "source_text": "c", "target_text": "d", "index": 0},
    ]
    batch = collate(rows)
    assert batch["input_ids"].tolist() == [[5, 6, 2, 0], [5, 6, 7, 2]]  # cut to 4, keeping </s>
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert batch["labels"].tolist() == [[7, 2, -100], [8, 9, 2]]
    assert all(batch[key].dtype == torch.long for key in ("input_ids", "attention_mask", "labels"))
    assert batch["source_text"] == ["a", "c"] and batch["target_text"] == ["b", "d"]
    assert batch["index"].tolist() == [4, 0]
    assert "source_text" not in collate([{"input_ids": [2], "labels": [2]}])


def test_an_epochs_plan_takes_a_few_bytes_a_pair():
    """The plan over N pairs holds N int32 indices; building it sorts one window of SORT_WINDOW pairs at a time, so
    what it takes beyond those does not grow with N (a plan of Python lists took about 100 bytes a pair)."""
    pairs = 3 * batching.SORT_WINDOW
    generator = np.random.default_rng(0)
    source = np.clip(generator.lognormal(3.2, 0.5, pairs), 1, 250).astype(np.int32)
    target = np.clip(source + generator.integers(-3, 4, pairs), 1, 250).astype(np.int32)
    tracemalloc.start()
    try:
        order, starts, _ = TokenBudgetBatchSampler(source, target, max_tokens=8192, world_size=2).plan_arrays()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert order.dtype == np.int32 and sorted(order[:: pairs // 1000]) != list(order[:: pairs // 1000])
    assert held < 5 * pairs and peak < 4 * pairs + 25 * batching.SORT_WINDOW


def test_windows_of_a_large_split_give_every_pair_once_in_batches_of_one_length_range(monkeypatch):
    monkeypatch.setattr(batching, "SORT_WINDOW", 100)
    source, target = random_lengths(count=1000)
    sampler = TokenBudgetBatchSampler(source, target, max_tokens=120, seed=3)
    order, starts, ends = sampler.plan_arrays()
    assert sorted(order.tolist()) == list(range(1000))
    for start, end in zip(starts, ends, strict=True):
        assert start // 100 == (end - 1) // 100  # a batch never crosses a window
        batch = order[start:end]
        assert len(batch) * max(source[batch].max(), target[batch].max()) <= 120
    for window in range(10):  # each window is sorted by source length
        lengths = source[order[window * 100 : (window + 1) * 100]]
        assert (np.diff(lengths) >= 0).all()


def test_the_length_order_holds_for_lengths_whose_key_outgrows_int32():
    """The sort key is source * 2 * (longest target + 1) + target: with sources of hundreds of millions of tokens it
    no longer fits in int32 even where the targets are short."""
    source = np.array([300_000_000, 5, 299_999_999, 7], dtype=np.int64)
    target = np.array([3, 1, 2, 3], dtype=np.int64)
    sampler = TokenBudgetBatchSampler(source, target, max_tokens=10**9, shuffle=False)
    order, _, _ = sampler.plan_arrays()
    assert source[order].tolist() == sorted(source.tolist())

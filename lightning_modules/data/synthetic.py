"""A translation task that needs no download: numbers written with digits -> the same numbers in English words.

"4821" -> "four thousand eight hundred twenty-one". A person can check every pair at a glance, the data is generated
deterministically from a seed, and a small Transformer learns it on a laptop CPU in a few minutes.
"""

import random

from datasets import Dataset

SOURCE_LANG = "digits"
TARGET_LANG = "words"
MAX_DIGITS = 6

_ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def number_to_words(number: int) -> str:
    """Write 0 <= number < 10**9 in English words, e.g. 4821 -> "four thousand eight hundred twenty-one"."""
    if not 0 <= number < 10**9:
        raise ValueError(f"number_to_words takes 0 <= number < 10**9, got {number}")
    if number == 0:
        return "zero"
    parts = []
    for scale, name in ((10**6, "million"), (10**3, "thousand"), (1, "")):
        group, number = divmod(number, scale)
        if group:
            parts.append(f"{_below_thousand(group)} {name}".strip())
    return " ".join(parts)


def _below_thousand(number: int) -> str:
    hundreds, rest = divmod(number, 100)
    words = [f"{_ONES[hundreds]} hundred"] if hundreds else []
    if rest >= 20:
        tens, ones = divmod(rest, 10)
        words.append(f"{_TENS[tens]}-{_ONES[ones]}" if ones else _TENS[tens])
    elif rest:
        words.append(_ONES[rest])
    return " ".join(words)


def sample_numbers(size: int, seed: int | str, exclude: frozenset[int] = frozenset()) -> list[int]:
    """Numbers whose digit count is uniform in 1..MAX_DIGITS, so short and long numbers are equally frequent.

    Numbers of four or more digits in `exclude` are redrawn: evaluation then measures numbers never seen in training
    (every shorter number occurs in any training set of a few thousand pairs, so excluding those would empty them).
    """
    rng = random.Random(seed)
    numbers = []
    while len(numbers) < size:
        digits = rng.randint(1, MAX_DIGITS)
        number = rng.randrange(0 if digits == 1 else 10 ** (digits - 1), 10**digits)
        if number < 1000 or number not in exclude:
            numbers.append(number)
    return numbers


def synthetic_splits(
    train_split: str, eval_splits: list[str], train_size: int, eval_size: int, seed: int
) -> dict[str, Dataset]:
    """The train split and each evaluation split as datasets with a `digits` and a `words` column."""
    train = sample_numbers(train_size, f"train-{seed}")
    numbers = {train_split: train}
    seen = frozenset(train)
    for split in eval_splits:
        numbers[split] = sample_numbers(eval_size, f"{split}-{seed}", exclude=seen)
    return {split: _as_dataset(values) for split, values in numbers.items()}


def _as_dataset(numbers: list[int]) -> Dataset:
    return Dataset.from_dict(
        {SOURCE_LANG: [str(n) for n in numbers], TARGET_LANG: [number_to_words(n) for n in numbers]}
    )

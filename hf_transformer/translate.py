"""Translating many sentences quickly: sort by length, batch under a token budget, restore the input order."""

from typing import Any

import torch
from transformers import GenerationMixin, PreTrainedTokenizerBase


@torch.inference_mode()
def translate(
    model: GenerationMixin,
    tokenizer: PreTrainedTokenizerBase,
    sentences: list[str],
    *,
    max_tokens: int = 8192,
    max_length_offset: int = 50,
    **generate_kwargs: Any,
) -> list[str]:
    """Translate `sentences` with `model.generate()`, returning translations in the order of the input.

    Sentences of similar length are decoded together, so little work goes into padding and no batch waits long for
    one long sentence. A batch holds at most `max_tokens` source tokens counted with padding and beams. The output is
    limited to the source length + `max_length_offset` tokens (section 6.1 of the paper uses 50) and to the model's
    `max_position_embeddings`. Other keyword
    arguments go to `generate()` (e.g. `num_beams`, `length_penalty`, `do_sample`).
    """
    if not sentences:
        return []
    ids = tokenizer(sentences, truncation=True, max_length=model.config.max_position_embeddings)["input_ids"]
    num_beams = generate_kwargs.get("num_beams") or model.generation_config.num_beams or 1
    translations = [""] * len(sentences)
    for batch in _length_sorted_batches([len(row) for row in ids], max_tokens // num_beams):
        inputs = tokenizer.pad({"input_ids": [ids[i] for i in batch]}, return_tensors="pt").to(model.device)
        max_length = min(inputs["input_ids"].shape[1] + max_length_offset + 1, model.config.max_position_embeddings)
        output_ids = model.generate(**inputs, max_length=max_length, **generate_kwargs)
        for index, text in zip(batch, tokenizer.batch_decode(output_ids, skip_special_tokens=True), strict=True):
            translations[index] = text.strip()
    return translations


def _length_sorted_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices sorted by length, cut into batches whose padded size (rows x longest) stays within `max_tokens`."""
    batches, current = [], []
    for index in sorted(range(len(lengths)), key=lengths.__getitem__):
        if current and (len(current) + 1) * lengths[index] > max_tokens:
            batches.append(current)
            current = []
        current.append(index)
    return [*batches, current]

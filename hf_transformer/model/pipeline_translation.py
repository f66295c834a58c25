"""A translation pipeline for this model.

transformers 5 removed its `translation` pipeline. This one is registered under the task "translation" and saved
with the model (`custom_pipelines` in config.json plus this file), so that anyone can run
`pipeline(model=folder_or_repo, trust_remote_code=True)(["A sentence.", ...])` without installing this package.
"""

import warnings
from typing import Any

import torch
from transformers import Pipeline


class TranslationPipeline(Pipeline):
    """Translates sentences with `model.generate()`: the generation defaults come from the saved generation config
    (beam 4, length penalty 0.6 as in the paper), the output's bound from the sentence's length as `translate()` takes
    it (section 6.1, `max_new_tokens`; with `batch_size` > 1, from the batch's longest), and any `generate` keyword
    overrides them per call."""

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def _sanitize_parameters(
        self, max_source_length: int | None = None, **generate_kwargs: Any
    ) -> tuple[dict, dict, dict]:
        preprocess_params = {} if max_source_length is None else {"max_source_length": max_source_length}
        return preprocess_params, generate_kwargs, {}

    def preprocess(self, text: str, max_source_length: int | None = None) -> dict[str, torch.Tensor]:
        if not isinstance(text, str):
            raise TypeError(f"The translation pipeline takes sentences (str), got {type(text).__name__}.")
        max_length = max_source_length or self.model.config.max_position_embeddings
        inputs = self.tokenizer(text, return_tensors="pt", truncation=True, max_length=max_length)
        if inputs.encodings and inputs.encodings[0].overflowing:  # as translate() warns (this file runs without it)
            warnings.warn(
                f"1 of 1 sentences are longer than the model's {max_length} positions and were cut to {max_length} "
                "tokens, so their translations miss the end: split them into shorter sentences",
                stacklevel=2,
            )
        return inputs

    def _forward(self, model_inputs: dict[str, torch.Tensor], **generate_kwargs: Any) -> dict[str, torch.Tensor]:
        return {"output_ids": self.model.generate(**model_inputs, **generate_kwargs)}

    def postprocess(self, model_outputs: dict[str, torch.Tensor]) -> list[dict[str, str]]:
        texts = self.tokenizer.batch_decode(model_outputs["output_ids"], skip_special_tokens=True)
        return [{"translation_text": text.strip()} for text in texts]

    def __call__(self, inputs: str | list[str], **kwargs: Any) -> list:
        """One `[{"translation_text": ...}]` per sentence; a list of sentences with one translation each gives a
        flat list of dicts, as transformers 4's translation pipeline did; an empty list gives an empty list."""
        if isinstance(inputs, list) and not inputs:
            return []  # transformers' Pipeline reads inputs[0]
        results = super().__call__(inputs, **kwargs)
        if isinstance(inputs, list) and all(len(result) == 1 for result in results):
            return [result[0] for result in results]
        return results

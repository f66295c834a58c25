"""Convert a trained model into a CTranslate2 model, and translate with it as `hf_transformer.decoding.translate` does.

The model goes through its stock Marian equivalent (`to_marian`) and a loader of CTranslate2's Transformers
converter, though not its Marian loader: that one assumes an OPUS-MT model, whose decoder starts from a zero embedding
with </s> as the start token and whose vocabulary ends with an extra <pad> row that it deletes. Ours starts from the
embedding of `decoder_start_token_id` (<s>) and every row is a real token: CTranslate2's BART loader keeps both, and
reads Marian's post-LN layout once the Marian config states it.

Needs the optional `ctranslate2` package: `pip install 'hf-transformer[ctranslate2]'`.
"""

from __future__ import annotations

import copy
import warnings
from collections import defaultdict
from pathlib import Path

from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase

from ..decoding.translate import (
    DECODING_MAX_TOKENS,
    MAX_LENGTH_OFFSET,
    check_decoding_settings,
    check_sentences,
    prepare_sources,
)
from ..model import TransformerForConditionalGeneration
from ..model.configuration_transformer import max_new_tokens
from .marian import to_marian

try:
    import ctranslate2
    from ctranslate2.converters.transformers import BartLoader
except ImportError as err:
    raise ImportError(
        "The CTranslate2 export needs the ctranslate2 package: pip install 'hf-transformer[ctranslate2]' "
        "(or pip install ctranslate2)."
    ) from err

__all__ = ["CTranslate2Translator", "to_ctranslate2"]

# What `quantization` may be: CTranslate2's weight types (`ctranslate2.converters.Converter.convert`).
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")


def to_ctranslate2(
    model: TransformerForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    folder: str | Path,
    *,
    quantization: str | None = None,
) -> Path:
    """Write a CTranslate2 model of `model` into `folder`, with the tokenizer and the generation config that
    `CTranslate2Translator` reads. `quantization` (e.g. "int8") sets the stored weight type; None keeps float32.
    Raises ValueError for models Marian cannot express (pre-LN) and for a tokenizer that does not fit the model."""
    if quantization not in (None, *QUANTIZATIONS):
        raise ValueError(f"Unknown quantization {quantization!r}: use one of {', '.join(QUANTIZATIONS)}, or none.")
    if model.config.normalize_before:  # before `to_marian`, whose message is about Marian
        raise ValueError(
            "This model is pre-LN (normalize_before=True), and the CTranslate2 export goes through a stock post-LN "
            "Marian model, so it cannot write this one. Export it without --format ctranslate2 and translate with "
            "that folder (hf-transformer translate FOLDER), or train a post-LN model for CTranslate2."
        )
    vocabulary = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    if [index for _, index in vocabulary] != list(range(model.config.vocab_size)):
        raise ValueError(
            f"The tokenizer's ids are not 0..{model.config.vocab_size - 1}, one per row of the model's "
            f"{model.config.vocab_size}-token vocabulary ({len(vocabulary)} tokens, ids {vocabulary[0][1]} to "
            f"{vocabulary[-1][1]}): pass the tokenizer the model was trained with."
        )
    marian = to_marian(model)
    # What the BART loader reads of the layout, which Marian's config does not state: post-LN, no embedding LayerNorm.
    marian.config.normalize_before = False
    marian.config.normalize_embedding = False
    spec = BartLoader()(marian, tokenizer)
    spec.validate()
    spec.optimize(quantization=quantization)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    spec.save(str(folder))
    # `translate()` cuts sources and outputs at the model's number of positions: the tokenizer carries it along.
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.model_max_length = model.config.max_position_embeddings
    tokenizer.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    return folder


class CTranslate2Translator:
    """A CTranslate2 model written by `to_ctranslate2`, translating as `hf_transformer.translate` does: beam search
    (the saved generation config's beams and length penalty by default), hypotheses scored by their summed
    log-probabilities over their length (</s> included) ** length penalty, at most the source length +
    `max_length_offset` output tokens. Greedy decoding gives the same tokens as ours. CTranslate2's beam search ends a
    sentence once it has `num_beams` finished hypotheses, which is `generate(early_stopping=True)`; `translate()` and
    `generate()` by default also wait until no running beam can beat them, so a few outputs may differ.
    `options` go to `ctranslate2.Translator` (device, compute_type such as "int8", intra_threads, ...)."""

    def __init__(self, folder: str | Path, **options) -> None:
        self.translator = ctranslate2.Translator(str(folder), **options)
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.generation_config = GenerationConfig.from_pretrained(folder)

    def __call__(
        self,
        sentences: list[str],
        *,
        num_beams: int | None = None,
        length_penalty: float | None = None,
        max_length_offset: int = MAX_LENGTH_OFFSET,
        max_tokens: int = DECODING_MAX_TOKENS,
    ) -> list[str]:
        """Translate `sentences`, returning translations in the order of the input, with `translate()`'s treatment
        of its input: a blank sentence translates to "", a source longer than the model's positions is cut to them with
        a `SourceTruncatedWarning`. Batches hold at most `max_tokens` source tokens counted with padding and beams."""
        check_sentences(sentences)
        translations = [""] * len(sentences)
        todo, ids, truncated = prepare_sources(self.tokenizer, sentences, self.tokenizer.model_max_length)
        output_ids = self.generate(
            ids,
            num_beams=num_beams,
            length_penalty=length_penalty,
            max_length_offset=max_length_offset,
            max_tokens=max_tokens,
        )
        for index, text in zip(todo, self.tokenizer.batch_decode(output_ids, skip_special_tokens=True), strict=True):
            translations[index] = text.strip()
        if truncated:
            warnings.warn(truncated, stacklevel=2)
        return translations

    def generate(
        self,
        input_ids: list[list[int]],
        *,
        num_beams: int | None = None,
        length_penalty: float | None = None,
        max_length_offset: int = MAX_LENGTH_OFFSET,
        max_tokens: int = DECODING_MAX_TOKENS,
    ) -> list[list[int]]:
        """The best hypothesis for each source (token ids, without padding), as token ids ending with </s> (or cut at
        the maximum length), without the decoder start token."""
        num_beams = check_decoding_settings(self.generation_config, num_beams)
        length_penalty = self.generation_config.length_penalty if length_penalty is None else length_penalty
        max_positions = self.tokenizer.model_max_length
        # The output limit depends on the source length, and CTranslate2 takes one per call: one call per length.
        by_length = defaultdict(list)
        for index, row in enumerate(input_ids):
            by_length[len(row)].append(index)
        outputs: list[list[int]] = [[] for _ in input_ids]
        for length, indices in sorted(by_length.items()):
            results = self.translator.translate_batch(
                [self.tokenizer.convert_ids_to_tokens(input_ids[index]) for index in indices],
                beam_size=num_beams,
                length_penalty=length_penalty,
                return_end_token=True,  # counts </s> in the length, as Hugging Face does
                min_decoding_length=0,  # CTranslate2 defaults to 1, which forbids an empty translation
                max_decoding_length=max_new_tokens(length, max_positions, max_length_offset),
                max_batch_size=max(1, max_tokens // (num_beams * length)),
            )
            for index, result in zip(indices, results, strict=True):
                outputs[index] = self.tokenizer.convert_tokens_to_ids(result.hypotheses[0])
        return outputs

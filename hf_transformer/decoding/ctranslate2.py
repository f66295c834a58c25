"""Translating with a CTranslate2 model written by `hf-transformer export --format ctranslate2`
(`hf_transformer.export.ctranslate2`): the runtime of that format, with `translate()`'s settings and its treatment of
the input.

Needs the optional `ctranslate2` package: `pip install 'hf-transformer[ctranslate2]'`.
"""

import warnings
from collections import defaultdict
from pathlib import Path

from transformers import AutoTokenizer, GenerationConfig

from ..errors import ConfigError
from ..model.configuration_transformer import MAX_LENGTH_OFFSET, max_new_tokens
from .search import DECODING_MAX_TOKENS, check_decoding_settings, check_sentences, prepare_sources

try:
    import ctranslate2
except ImportError as err:
    raise ImportError(
        "Translating with a CTranslate2 model needs the ctranslate2 package: pip install 'hf-transformer[ctranslate2]' "
        "(or pip install ctranslate2)."
    ) from err

__all__ = ["CTranslate2Translator"]


class CTranslate2Translator:
    """A CTranslate2 model written by `to_ctranslate2`, translating as `hf_transformer.translate` does: beam search
    (the saved generation config's beams and length penalty by default), hypotheses scored by their summed
    log-probabilities over their length (</s> included) ** length penalty, at most the source length +
    `max_length_offset` output tokens. Greedy decoding gives the same tokens as ours. CTranslate2's beam search ends a
    sentence once it has `num_beams` finished hypotheses, which is `generate(early_stopping=True)`; `translate()` and
    `generate()` by default also wait until no running beam can beat them, so a few outputs may differ.
    `options` go to `ctranslate2.Translator` (device, compute_type such as "int8", intra_threads, ...).
    `vocabulary_map`: decode with the folder's vocabulary map (`vmap.txt`, a `Shortlist` exported along), or not;
    None: where the folder has one."""

    def __init__(self, folder: str | Path, vocabulary_map: bool | None = None, **options) -> None:
        has_map = (Path(folder) / "vmap.txt").is_file()
        if vocabulary_map and not has_map:
            raise ConfigError(
                f"{folder} has no vocabulary map (vmap.txt): export it from a folder with a shortlist "
                "(`hf-transformer shortlist`), or leave the shortlist off"
            )
        self.vocabulary_map = has_map if vocabulary_map is None else vocabulary_map
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
                use_vmap=self.vocabulary_map,
            )
            for index, result in zip(indices, results, strict=True):
                outputs[index] = self.tokenizer.convert_tokens_to_ids(result.hypotheses[0])
        return outputs

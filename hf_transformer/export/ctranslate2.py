"""Convert a trained model into a CTranslate2 model (`hf_transformer.decoding.ctranslate2` translates with it).

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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import PreTrainedTokenizerBase

from ..model import TransformerForConditionalGeneration
from .marian import to_marian

if TYPE_CHECKING:
    from ..decoding.shortlist import Shortlist

try:
    from ctranslate2.converters.transformers import BartLoader
except ImportError as err:
    raise ImportError(
        "The CTranslate2 export needs the ctranslate2 package: pip install 'hf-transformer[ctranslate2]' "
        "(or pip install ctranslate2)."
    ) from err

__all__ = ["QUANTIZATIONS", "to_ctranslate2", "write_vocabulary_map"]

# What `quantization` may be: CTranslate2's weight types (`ctranslate2.converters.Converter.convert`).
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")


def to_ctranslate2(
    model: TransformerForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    folder: str | Path,
    *,
    quantization: str | None = None,
    shortlist: Shortlist | None = None,
) -> Path:
    """Write a CTranslate2 model of `model` into `folder`, with the tokenizer and the generation config that
    `hf_transformer.decoding.ctranslate2.CTranslate2Translator` reads. `quantization` (e.g. "int8") sets the stored
    weight type; None keeps float32. A `shortlist` goes along as CTranslate2's vocabulary map (`vmap.txt`), which its
    runtime uses with `use_vmap` (per batch: the union of its sentences' lists).
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
    if shortlist is not None:
        write_vocabulary_map(shortlist, tokenizer, folder)
    # `translate()` cuts sources and outputs at the model's number of positions: the tokenizer carries it along.
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.model_max_length = model.config.max_position_embeddings
    tokenizer.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    return folder


def write_vocabulary_map(shortlist: Shortlist, tokenizer: PreTrainedTokenizerBase, folder: str | Path) -> Path:
    """Write `shortlist` into the CTranslate2 model `folder` as its vocabulary map (`vmap.txt`, which CTranslate2's
    converter would copy there from `--vocab_mapping`)."""
    tokens = [token for token, _ in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])]
    path = Path(folder) / "vmap.txt"
    path.write_text(shortlist.vocabulary_map(tokens), encoding="utf-8")
    return path


def __getattr__(name: str) -> Any:
    # The runtime lived here until 0.4.0, and the docs showed it imported from here: it still is, with its new home.
    if name == "CTranslate2Translator":
        warnings.warn(
            "hf_transformer.export.ctranslate2.CTranslate2Translator moved: import it from "
            "hf_transformer.decoding.ctranslate2",
            FutureWarning,
            stacklevel=2,
        )
        from ..decoding.ctranslate2 import CTranslate2Translator

        return CTranslate2Translator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

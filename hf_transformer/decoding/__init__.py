"""Decoding a trained model: `translate` for many sentences (length-sorted batches under a token budget, beam search
that lets each sentence leave its batch once final, n-best lists) with one model or an `Ensemble` of several, the
attention maps of a translation, and `TranslationEngine`, one interface over our model (or an ensemble) and its
CTranslate2 export for the commands and the server; a lexical `Shortlist` of each sentence's likely target tokens for
faster beam search."""

from .attention_maps import (
    AttentionMaps,
    alignment,
    attention_maps,
    format_alignment,
    plot_attention,
    plot_attention_heads,
)
from .ensemble import Ensemble
from .search import (
    DECODING_MAX_TOKENS,
    MAX_LENGTH_OFFSET,
    Hypothesis,
    SourceTruncatedWarning,
    Translation,
    beam_search,
    translate,
    translate_hypotheses,
)
from .shortlist import Shortlist, build_shortlist

__all__ = [
    "DECODING_MAX_TOKENS",
    "MAX_LENGTH_OFFSET",
    "AttentionMaps",
    "Ensemble",
    "Hypothesis",
    "Shortlist",
    "SourceTruncatedWarning",
    "Translation",
    "alignment",
    "attention_maps",
    "beam_search",
    "build_shortlist",
    "format_alignment",
    "plot_attention",
    "plot_attention_heads",
    "translate",
    "translate_hypotheses",
]

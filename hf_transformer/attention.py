"""Moved in 0.4: the attention maps of a translation are `hf_transformer.decoding` (this module name said the
mechanism, which is `hf_transformer.model`). Importing it still works, with a warning."""

import warnings

from .decoding.attention_maps import (  # noqa: F401
    AttentionMaps,
    alignment,
    attention_maps,
    format_alignment,
    plot_attention,
    plot_attention_heads,
)

warnings.warn(
    "hf_transformer.attention moved to hf_transformer.decoding: import alignment, attention_maps and plot_attention "
    "from there",
    FutureWarning,
    stacklevel=2,
)

"""What differs between the transformers releases that saved folders run under (every release from 5.4 on).

Saved model folders carry this file with their remote code (the modeling file imports it relatively).
"""

import functools
import inspect
from collections.abc import Callable

from transformers.masking_utils import create_causal_mask
from transformers.utils.deprecation import deprecate_kwarg

# transformers 5.24 renamed the key/value cache from `past_key_values` to `cache`: in forward arguments, in the fields
# of model outputs and in the mask helpers. The model builds outputs and masks with the name the installed release
# knows.
CACHE_NAME = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"


def accepts_past_key_values(forward: Callable) -> Callable:
    """Let `forward`, which takes the cache as `cache`, take it as `past_key_values` too: releases before 5.24 pass it
    so from `generate()`. From 5.24 on the old name warns that it is deprecated, as it does for transformers' models."""
    if CACHE_NAME == "cache":
        return deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")(forward)

    @functools.wraps(forward)
    def renamed(*args, past_key_values=None, **kwargs):
        if past_key_values is not None and kwargs.get("cache") is None:
            kwargs["cache"] = past_key_values
        return forward(*args, **kwargs)

    return renamed

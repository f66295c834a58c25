"""The encoder-decoder Transformer of "Attention Is All You Need" as a Hugging Face model.

- `hf_transformer.model`: the model itself, exactly the files a saved folder carries as remote code.
- `hf_transformer.decoding`: translating many sentences (`translate`, with n-best lists), attention maps, and one engine
  over our model and a CTranslate2 export.
- `hf_transformer.export`: the model in other formats (Marian, CTranslate2, ONNX), one registry of them.
- `hf_transformer.hub`: sharing a folder on the Hugging Face Hub, with its model card.
- `hf_transformer.serving`: a web page and JSON API; `hf_transformer.scoring`: the scores papers report.

The names below are imported on first use, so that `import hf_transformer` (and the `hf-transformer` command's
`--help`) loads neither torch nor transformers. Importing the model (`hf_transformer.model`, which any of these names
imports) registers it with the Auto classes (`AutoConfig`, `AutoModel`, `AutoModelForSeq2SeqLM`) and marks its files
to be saved along with every checkpoint (`auto_map`), so that a saved folder also loads with `trust_remote_code=True`
where this package is not installed; `TranslationPipeline` registers the "translation" pipeline.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .decoding import translate
    from .model import (
        PRESETS,
        TransformerConfig,
        TransformerForConditionalGeneration,
        TransformerModel,
        TransformerPreTrainedModel,
        TranslationPipeline,
    )

__all__ = [
    "PRESETS",
    "TransformerConfig",
    "TransformerForConditionalGeneration",
    "TransformerModel",
    "TransformerPreTrainedModel",
    "TranslationPipeline",
    "translate",
]
_HOMES = {name: ".model" for name in __all__} | {"translate": ".decoding"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name], __name__), name)
        globals()[name] = value  # later lookups find it without this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

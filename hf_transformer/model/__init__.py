"""The model: exactly the files that a saved folder carries as its remote code, so that it loads with
`trust_remote_code=True` where this package is not installed. They import one another relatively, and nothing else of
this package."""

from .configuration_transformer import PRESETS, TransformerConfig
from .modeling_transformer import TransformerForConditionalGeneration, TransformerModel, TransformerPreTrainedModel
from .pipeline_translation import TranslationPipeline

__all__ = [
    "PRESETS",
    "TransformerConfig",
    "TransformerForConditionalGeneration",
    "TransformerModel",
    "TransformerPreTrainedModel",
    "TranslationPipeline",
]

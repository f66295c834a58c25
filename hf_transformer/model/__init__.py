"""The model: exactly the files that a saved folder carries as its remote code, so that it loads with
`trust_remote_code=True` where this package is not installed. They import one another relatively, and nothing else of
this package.

Importing this package (not the files of a saved folder) registers the model with the Auto classes and marks its
files to be saved with every checkpoint (`auto_map`); `TranslationPipeline`, imported on first use (transformers'
pipelines take seconds to import), registers the "translation" pipeline, which a saved pipeline names in
`custom_pipelines`."""

from typing import TYPE_CHECKING, Any

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .configuration_transformer import PRESETS, TransformerConfig
from .modeling_transformer import TransformerForConditionalGeneration, TransformerModel, TransformerPreTrainedModel

if TYPE_CHECKING:
    from .pipeline_translation import TranslationPipeline

__all__ = [
    "PRESETS",
    "TransformerConfig",
    "TransformerForConditionalGeneration",
    "TransformerModel",
    "TransformerPreTrainedModel",
    "TranslationPipeline",
]

AutoConfig.register(TransformerConfig.model_type, TransformerConfig)
AutoModel.register(TransformerConfig, TransformerModel)
AutoModelForSeq2SeqLM.register(TransformerConfig, TransformerForConditionalGeneration)
TransformerConfig.register_for_auto_class()
TransformerModel.register_for_auto_class("AutoModel")
TransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")


def __getattr__(name: str) -> Any:
    if name != "TranslationPipeline":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from transformers.pipelines import PIPELINE_REGISTRY

    from .pipeline_translation import TranslationPipeline

    PIPELINE_REGISTRY.register_pipeline(
        "translation", pipeline_class=TranslationPipeline, pt_model=AutoModelForSeq2SeqLM
    )
    globals()[name] = TranslationPipeline
    return TranslationPipeline

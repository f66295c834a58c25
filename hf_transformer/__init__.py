"""The encoder-decoder Transformer of "Attention Is All You Need" as a Hugging Face model.

Importing this package registers the model with the Auto classes (`AutoConfig`, `AutoModel`,
`AutoModelForSeq2SeqLM`) and the "translation" pipeline, and marks its files to be saved along with every
checkpoint (`auto_map`), so that a saved folder also loads with `trust_remote_code=True` where this package is not
installed.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM
from transformers.pipelines import PIPELINE_REGISTRY

from .configuration_transformer import PRESETS, TransformerConfig
from .modeling_transformer import (
    TransformerForConditionalGeneration,
    TransformerModel,
    TransformerPreTrainedModel,
)
from .pipeline_translation import TranslationPipeline
from .translate import translate

AutoConfig.register(TransformerConfig.model_type, TransformerConfig)
AutoModel.register(TransformerConfig, TransformerModel)
AutoModelForSeq2SeqLM.register(TransformerConfig, TransformerForConditionalGeneration)
TransformerConfig.register_for_auto_class()
TransformerModel.register_for_auto_class("AutoModel")
TransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
PIPELINE_REGISTRY.register_pipeline("translation", pipeline_class=TranslationPipeline, pt_model=AutoModelForSeq2SeqLM)

__all__ = [
    "PRESETS",
    "TransformerConfig",
    "TransformerForConditionalGeneration",
    "TransformerModel",
    "TransformerPreTrainedModel",
    "TranslationPipeline",
    "translate",
]

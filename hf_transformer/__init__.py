"""The encoder-decoder Transformer of "Attention Is All You Need" as a Hugging Face model.

- `hf_transformer.model`: the model itself, exactly the files a saved folder carries as remote code.
- `hf_transformer.decoding`: translating many sentences (`translate`, with n-best lists), attention maps, and one engine
  over our model and a CTranslate2 export.
- `hf_transformer.export`: the model in other formats (Marian, CTranslate2, ONNX), one registry of them.
- `hf_transformer.hub`: sharing a folder on the Hugging Face Hub, with its model card.
- `hf_transformer.serving`: a web page and JSON API; `hf_transformer.scoring`: the scores papers report.

Importing this package registers the model with the Auto classes (`AutoConfig`, `AutoModel`,
`AutoModelForSeq2SeqLM`) and the "translation" pipeline, and marks its files to be saved along with every
checkpoint (`auto_map`), so that a saved folder also loads with `trust_remote_code=True` where this package is not
installed.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM
from transformers.pipelines import PIPELINE_REGISTRY

from .decoding import translate
from .model import (
    PRESETS,
    TransformerConfig,
    TransformerForConditionalGeneration,
    TransformerModel,
    TransformerPreTrainedModel,
    TranslationPipeline,
)

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

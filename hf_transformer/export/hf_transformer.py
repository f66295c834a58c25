"""The "hf-transformer" format: this package's model with its code, which loads with `trust_remote_code=True` where the
package is not installed, and what its model card says of it."""

from pathlib import Path

from transformers import GenerationConfig, PreTrainedTokenizerFast

from ..formats import FormatCard
from ..model import TransformerForConditionalGeneration

# What the model card of an "hf-transformer" folder says of its format (`ExportFormat.card`).
HF_TRANSFORMER_CARD = FormatCard(
    # The Hub shows that loading runs the repository's code.
    tags=("custom_code",),
    requirement_note="; older releases stop with a message saying so",
    usage="""\
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

model_id = {{ model_id | tojson }}
{% if revision -%}
revision = {{ revision | tojson }}  # the commit that pushed this model: its code is the code that runs
# The model's code (modeling_transformer.py and friends) comes with the weights: trust_remote_code runs it.
tokenizer = AutoTokenizer.from_pretrained(model_id, revision=revision, trust_remote_code=True)
model = AutoModelForSeq2SeqLM.from_pretrained(model_id, revision=revision, trust_remote_code=True)
{%- else -%}
# The model's code (modeling_transformer.py and friends) comes with the weights: trust_remote_code runs it.
tokenizer = AutoTokenizer.from_pretrained(model_id, trust_remote_code=True)
model = AutoModelForSeq2SeqLM.from_pretrained(model_id, trust_remote_code=True)
{%- endif %}

inputs = tokenizer([{{ example | tojson }}], return_tensors="pt", padding=True)
output_ids = model.generate(**inputs)  # the decoding settings come from generation_config.json
print(tokenizer.batch_decode(output_ids, skip_special_tokens=True))

translator = pipeline("translation", model=model_id, {% if revision %}revision=revision, {% endif -%}
trust_remote_code=True)
print(translator([{{ example | tojson }}]))""",
    after_usage="`trust_remote_code=True` runs the Python files of this repository (`configuration_transformer.py`, "
    "`modeling_transformer.py` and the files they import): the model written in plain PyTorch, which imports only "
    "torch, transformers and each other, reads no file but the weights and opens no connection. Read them before you "
    "run them, as any code. {% if revision %}`revision` pins the commit that pushed them: a later push to this "
    "repository, of other code included, does not change what the snippet runs, and transformers does not warn of "
    "new code files.{% else %}Pinning a `revision` (a commit of the repository) makes a later push, of other code "
    "included, leave what the snippet runs unchanged.{% endif %}\n\n"
    "With the `hf_transformer` package installed, its own classes load the model without remote code: "
    "`hf_transformer.TransformerForConditionalGeneration.from_pretrained(model_id)`; importing them also registers "
    "the model with the Auto classes (`AutoModelForSeq2SeqLM.from_pretrained(model_id)` then needs no "
    '`trust_remote_code`, nor `pipeline("translation", model=model_id, '
    "pipeline_class=hf_transformer.TranslationPipeline)`). To fine-tune it with hf-transformer: `hf-transformer fit "
    "--config ... --model.init_from {{ model_id }} --data.tokenizer {{ model_id }}`.",
)


def save_model(
    model: TransformerForConditionalGeneration,
    tokenizer: PreTrainedTokenizerFast,
    folder: str | Path,
    int8: bool = False,
) -> Path:
    """The "hf-transformer" format: the model with its code (`auto_map`), the tokenizer, the generation config and
    the translation pipeline, as `save_pretrained` writes them. With `int8`, the generation config asks this package's
    `translate` and `serve` to decode with int8 weights (`decoding.int8`); the weights are saved in float32 still, so
    that any tool loads them."""
    from ..decoding.int8 import INT8_KEY
    from ..model import TranslationPipeline  # imports transformers' pipelines: seconds, only where a folder is saved

    saved = model.generation_config
    if int8:
        # A config marked as derived from the model's config loads without the fields it does not know: this one is
        # the model's own.
        settings = {name: value for name, value in saved.to_dict().items() if name != "_from_model_config"}
        model.generation_config = GenerationConfig(**settings, **{INT8_KEY: True})
    try:
        TranslationPipeline(model=model, tokenizer=tokenizer).save_pretrained(folder)
    finally:
        model.generation_config = saved
    return Path(folder)

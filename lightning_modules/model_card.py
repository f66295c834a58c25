"""The model card (`README.md`) of an exported model, written from what a training checkpoint holds.

A checkpoint of `TranslationModule` carries the module's arguments (`hyper_parameters`), the data module's
(`datamodule_hyper_parameters`: dataset, language pair, batch size), the model config (`hf_config`), the decoding
settings (`generation_config`) and the step count. Evaluation scores, the W&B run link and the compute used are not in
it: the caller passes them (the push callback takes them from the trainer, `hf-transformer push` from `--results`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from sacrebleu.metrics import BLEU, CHRF

from hf_transformer import TransformerConfig, TransformerForConditionalGeneration
from hf_transformer.configuration_transformer import MIN_TRANSFORMERS_VERSION

CARD_NAME = "README.md"
DEFAULT_LICENSE = "apache-2.0"
SYNTHETIC_DATASET = "synthetic"
# The snippet names the model on one line of this form, so that a card written for a local folder can be pointed at
# the repo it is pushed to (`retarget_model_card`).
_MODEL_ID_LINE = re.compile(r'^model_id = (?P<id>".*")$', flags=re.MULTILINE)
# Table rows of the evaluation section: metric key suffix -> column title.
_SCORES = {"bleu": "BLEU", "chrf": "chrF", "loss": "Loss (nats/token)", "perplexity": "Perplexity"}
_STAGES = {"test": "test_split", "val": "validation_split"}
_EXAMPLES = {
    "digits": "4821",
    "en": "A dog runs across the grass.",
    "de": "Ein Hund rennt über das Gras.",
    "fr": "Un chien court sur l'herbe.",
    "cs": "Pes běží po trávě.",
}


def write_model_card(
    folder: str | Path,
    checkpoint: dict[str, Any],
    *,
    repo_id: str | None = None,
    results: dict[str, float] | None = None,
    wandb_url: str | None = None,
    compute: str | None = None,
    dataset: str | None = None,
    language_pair: tuple[str, str] | None = None,
    license: str = DEFAULT_LICENSE,
    example: str | None = None,
) -> Path:
    """Write `folder/README.md` for the model exported from `checkpoint` and return its path.

    `repo_id` is the Hub repo the card's usage snippet loads (default: the folder's absolute path, so the snippet runs
    as written against the local export; `hf-transformer push` points it at the repo). `results` maps logged metric
    names (`test/bleu`, `val/chrf`, `test/loss`, ...) to values. `dataset` and `language_pair` default to the data
    module's arguments saved in the checkpoint.
    """
    folder = Path(folder)
    run = _RunFacts(checkpoint, dataset=dataset, language_pair=language_pair)
    model_id = repo_id or str(folder.resolve())
    name = _model_name(model_id)
    metadata = _metadata(run, name, results or {}, license)
    body = "\n".join(
        [
            f"# {name}",
            "",
            _summary(run),
            _architecture(run),
            _training(run, compute, wandb_url),
            _evaluation(run, results or {}),
            _usage(model_id, example or _EXAMPLES.get(run.source_lang, _EXAMPLES["en"])),
        ]
    )
    card = ModelCard(f"---\n{metadata.to_yaml()}\n---\n\n{body}")
    path = folder / CARD_NAME
    card.save(path)
    return path


def retarget_model_card(folder: str | Path, repo_id: str) -> bool:
    """Point a card written by `write_model_card` at `repo_id`: snippet, fine-tuning hint, title and model-index name.
    Returns False (and changes nothing) when `folder` has no such card."""
    path = Path(folder) / CARD_NAME
    if not path.is_file():
        return False
    card = ModelCard.load(path)
    match = _MODEL_ID_LINE.search(card.text)
    if match is None:
        return False
    old_id = json.loads(match.group("id"))
    old_name, new_name = _model_name(old_id), _model_name(repo_id)
    card.text = card.text.replace(f"# {old_name}\n", f"# {new_name}\n", 1).replace(old_id, repo_id)
    card.data.model_name = new_name
    card.save(path)
    return True


def bleu_signature() -> str:
    """The sacreBLEU signature of the BLEU that `TranslationModule` logs: torchmetrics' `SacreBLEUScore` with 13a
    tokenization, one reference and no smoothing (it scores 0 when an n-gram order has no match, as sacreBLEU's
    `smooth_method="none"` does)."""
    metric = BLEU(tokenize="13a", smooth_method="none")
    metric.num_refs = 1  # sacreBLEU only knows it after scoring; the module scores against one reference
    return metric.get_signature().format()


def chrf_signature() -> str:
    """The sacreBLEU signature of the logged chrF: torchmetrics' `CHRFScore(n_word_order=0)`, character 6-grams,
    beta 2, whitespace ignored."""
    metric = CHRF(word_order=0)
    metric.num_refs = 1
    return metric.get_signature().format()


# --- what the checkpoint says about the run -------------------------------------------------------------------


class _RunFacts:
    """The values the card needs, read once from the checkpoint with defaults for what an older or hand-made
    checkpoint lacks."""

    def __init__(self, checkpoint: dict[str, Any], dataset: str | None, language_pair: tuple[str, str] | None):
        self.hparams: dict[str, Any] = dict(checkpoint.get("hyper_parameters") or {})
        self.data: dict[str, Any] = dict(checkpoint.get("datamodule_hyper_parameters") or {})
        self.config = TransformerConfig.from_dict(checkpoint["hf_config"])
        self.generation: dict[str, Any] = dict(checkpoint.get("generation_config") or {})
        self.global_step: int | None = checkpoint.get("global_step")
        self.dataset: str | None = dataset or self.data.get("dataset")
        self.dataset_config: str | None = self.data.get("dataset_config")
        source, target = language_pair or (self.data.get("source_lang"), self.data.get("target_lang"))
        self.source_lang: str = source or "source"
        self.target_lang: str = target or "target"

    @property
    def num_parameters(self) -> int:
        # Built on the meta device: counts the parameters (tied matrices once) without allocating them.
        with torch.device("meta"):
            return TransformerForConditionalGeneration(self.config).num_parameters()

    @property
    def hub_dataset(self) -> str | None:
        """The dataset as a Hub dataset id, or None for the synthetic task and local files."""
        return self.dataset if _looks_like_hub_id(self.dataset) else None

    @property
    def base_model(self) -> str | None:
        """The Hub model this run was fine-tuned from (`init_from`), if any."""
        init_from = self.hparams.get("init_from")
        return init_from if _looks_like_hub_id(init_from) else None

    @property
    def dataset_label(self) -> str:
        if self.dataset == SYNTHETIC_DATASET:
            return "the synthetic digits-to-words task of hf-transformer"
        if self.dataset is None:
            return "an unrecorded dataset"
        config = f" ({self.dataset_config})" if self.dataset_config else ""
        return f"`{self.dataset}`{config}"


def _looks_like_hub_id(name: str | None) -> bool:
    """A Hub id is `name` or `namespace/name`; local paths (absolute, relative with ./, or deeper) are not."""
    if not name or name == SYNTHETIC_DATASET or name.startswith((".", "/", "~")) or name.count("/") > 1:
        return False
    if Path(name).exists():
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _language_code(lang: str) -> str | None:
    """Only ISO 639 codes go in the metadata (`digits`/`words` of the synthetic task are not languages)."""
    return lang if re.fullmatch(r"[a-z]{2,3}", lang) else None


# --- metadata ----------------------------------------------------------------------------------------------------


def _metadata(run: _RunFacts, name: str, results: dict[str, float], license: str) -> ModelCardData:
    languages = [code for code in map(_language_code, (run.source_lang, run.target_lang)) if code]
    return ModelCardData(
        language=languages or None,
        license=license,
        library_name="transformers",
        pipeline_tag="translation",
        tags=["translation", "transformer", "encoder-decoder", "vaswani-transformer", "hf-transformer", "custom_code"],
        datasets=[run.hub_dataset] if run.hub_dataset else None,
        base_model=run.base_model,
        metrics=["bleu", "chrf"],
        model_name=name,
        eval_results=_eval_results(run, results) or None,
    )


def _eval_results(run: _RunFacts, results: dict[str, float]) -> list[EvalResult]:
    """BLEU and chrF per evaluated split, each with its sacreBLEU signature, for the card's `model-index`."""
    signatures = {"bleu": bleu_signature(), "chrf": chrf_signature()}
    entries = []
    for stage, split_key in _STAGES.items():
        for metric, signature in signatures.items():
            value = results.get(f"{stage}/{metric}")
            if value is None:
                continue
            entries.append(
                EvalResult(
                    task_type="translation",
                    task_name=f"Translation {run.source_lang}-{run.target_lang}",
                    dataset_type=run.hub_dataset or run.dataset or "unknown",
                    dataset_name=run.dataset_label.replace("`", ""),
                    dataset_config=run.dataset_config,
                    dataset_split=run.data.get(split_key, stage),
                    metric_type=metric,
                    metric_name=_SCORES[metric],
                    metric_value=round(float(value), 2),
                    metric_args={"signature": signature},
                    verified=False,
                )
            )
    return entries


# --- body ----------------------------------------------------------------------------------------------------------


def _table(rows: list[tuple[str, Any]], header: tuple[str, str] = ("", "")) -> str:
    lines = [f"| {header[0]} | {header[1]} |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in rows]
    return "\n".join(lines) + "\n"


def _summary(run: _RunFacts) -> str:
    return (
        f"The encoder-decoder Transformer of *Attention Is All You Need* (Vaswani et al., 2017), implemented from "
        f"scratch and trained with PyTorch Lightning by hf-transformer, translating **{run.source_lang}** to "
        f"**{run.target_lang}**, trained on {run.dataset_label}.\n"
    )


def _architecture(run: _RunFacts) -> str:
    config = run.config
    norm = "pre-LN (LayerNorm before each sub-layer)" if config.normalize_before else "post-LN, as in the paper"
    tied = "shared source/target embeddings tied with the output projection" if config.tie_word_embeddings else ""
    preset = run.hparams.get("preset")
    rows = [
        ("Preset the sizes start from", f"`{preset}` (Table 3)" if preset else "-"),
        ("Layers (encoder / decoder)", f"{config.encoder_layers} / {config.decoder_layers}"),
        ("d_model", config.d_model),
        ("Attention heads (encoder / decoder)", f"{config.encoder_attention_heads} / {config.decoder_attention_heads}"),
        ("Feed-forward size d_ff", f"{config.encoder_ffn_dim} ({config.activation_function})"),
        ("Dropout P_drop", config.dropout),
        ("Layer normalisation", norm),
        ("Vocabulary", f"{config.vocab_size} BPE tokens" + (f", {tied}" if tied else "")),
        ("Positions", f"sinusoidal, up to {config.max_position_embeddings} tokens"),
        ("Parameters", _count(run.num_parameters)),
    ]
    return "## Architecture\n\n" + _table(rows, ("", "Value"))


def _training(run: _RunFacts, compute: str | None, wandb_url: str | None) -> str:
    hp, data = run.hparams, run.data
    rows = []
    if hp:
        betas, eps, decay = tuple(hp.get("betas", ())), hp.get("eps"), hp.get("weight_decay")
        rows.append(("Optimizer", f"AdamW, betas {betas}, eps {eps}, weight decay {decay}"))
        rows.append(("Learning-rate schedule", _schedule(hp)))
        rows.append(("Label smoothing", hp.get("label_smoothing")))
    if data.get("max_tokens"):
        budget = data["max_tokens"]
        rows.append(("Batch size", f"up to {budget} source and {budget} target tokens per batch and device (padded)"))
    if data.get("bpe_vocab_size") and not data.get("tokenizer"):
        rows.append(("Tokenizer", f"joint BPE trained on the training split ({data['bpe_vocab_size']} tokens asked)"))
    elif data.get("tokenizer"):
        rows.append(("Tokenizer", f"`{data['tokenizer']}`"))
    if run.base_model:
        rows.append(("Initialised from", f"[{run.base_model}](https://huggingface.co/{run.base_model})"))
    if run.global_step is not None:
        rows.append(("Training steps", f"{run.global_step} optimizer steps"))
    if compute:
        rows.append(("Compute", compute))
    rows.append(("Decoding", _decoding(run)))
    text = "## Training\n\n" + _table(rows, ("Hyperparameter", "Value"))
    if wandb_url:
        text += f"\nTraining curves and samples: [W&B run]({wandb_url}).\n"
    return text


def _schedule(hp: dict[str, Any]) -> str:
    warmup = hp.get("warmup_steps")
    if hp.get("peak_lr") is None:
        return f"the paper's (section 5.3): d_model^-0.5 x min(step^-0.5, step x warmup^-1.5), {warmup} warm-up steps"
    return f"inverse square root: peak {hp.get('peak_lr')} after {warmup} linear warm-up steps"


def _decoding(run: _RunFacts) -> str:
    generation = run.generation
    beams = generation.get("num_beams") or 1
    text = f"beam search with {beams} beams" if beams > 1 else "greedy search"
    if generation.get("length_penalty") is not None:
        text += f", length penalty {generation['length_penalty']}"
    if generation.get("max_length"):
        text += f", at most {generation['max_length']} tokens"
    return text + " (`generation_config.json`)"


def _evaluation(run: _RunFacts, results: dict[str, float]) -> str:
    text = "## Evaluation\n\n"
    splits = [stage for stage in _STAGES if any(f"{stage}/{metric}" in results for metric in _SCORES)]
    if not splits:
        return text + "No evaluation results were recorded with this export.\n"
    metrics = [metric for metric in _SCORES if any(f"{stage}/{metric}" in results for stage in splits)]
    lines = ["| Split | " + " | ".join(_SCORES[metric] for metric in metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
    for stage in splits:
        cells = [_format_score(results.get(f"{stage}/{metric}")) for metric in metrics]
        lines.append(f"| {run.data.get(_STAGES[stage], stage)} | " + " | ".join(cells) + " |")
    text += "\n".join(lines) + "\n"
    text += (
        f"\nCorpus-level scores on {run.dataset_label}: the model's beam-search translations (decoding above), "
        "detokenized, against one reference each. "
        f"BLEU signature: `{bleu_signature()}`; chrF signature: `{chrf_signature()}`.\n"
    )
    return text


def _count(number: int) -> str:
    scaled = f"{number / 1e6:.1f}M" if number >= 1e6 else f"{number / 1e3:.1f}K"
    return f"{number:,} ({scaled})"


def _format_score(value: float | None) -> str:
    return "-" if value is None else f"{float(value):.2f}"


def _model_name(model_id: str) -> str:
    return Path(model_id).name or model_id


def _model_id_line(model_id: str) -> str:
    # JSON string syntax is valid Python and always double-quoted, which `_MODEL_ID_LINE` relies on.
    return f"model_id = {json.dumps(model_id)}"


def _usage(model_id: str, example: str) -> str:
    code = f"""\
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

{_model_id_line(model_id)}
# The model's code (modeling_transformer.py and friends) comes with the weights: trust_remote_code runs it.
tokenizer = AutoTokenizer.from_pretrained(model_id, trust_remote_code=True)
model = AutoModelForSeq2SeqLM.from_pretrained(model_id, trust_remote_code=True)

inputs = tokenizer([{json.dumps(example)}], return_tensors="pt", padding=True)
output_ids = model.generate(**inputs)  # the decoding settings come from generation_config.json
print(tokenizer.batch_decode(output_ids, skip_special_tokens=True))

translator = pipeline("translation", model=model_id, trust_remote_code=True)
print(translator([{json.dumps(example)}]))
"""
    requirement = f"transformers>={MIN_TRANSFORMERS_VERSION},<6"
    return (
        "## Usage\n\n"
        f"Needs torch and `{requirement}` (`pip install -U torch '{requirement}'`); older "
        "releases stop with a message saying so.\n\n"
        f"```python\n{code}```\n\n"
        "With the `hf_transformer` package installed, `import hf_transformer` registers the model with the Auto "
        "classes: `AutoModelForSeq2SeqLM.from_pretrained(model_id)` then needs no `trust_remote_code`, and "
        '`pipeline("translation", model=model_id, pipeline_class=hf_transformer.TranslationPipeline)` neither. '
        "To fine-tune it with hf-transformer: `hf-transformer fit --config ... --model.init_from "
        f"{model_id} --data.tokenizer {model_id}`.\n"
    )

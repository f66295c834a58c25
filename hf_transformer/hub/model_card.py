"""The model card (`README.md`) of an exported model, written from what a training checkpoint holds.

A checkpoint of `TranslationModule` carries the module's arguments (`hyper_parameters`), the data module's
(`datamodule_hyper_parameters`: dataset, language pair, batch size), the model config (`hf_config`), the decoding
settings (`generation_config`), the step count, and how the module trains in words (`TRAINING_DESCRIPTION`: its
schedule's own description, and a row of each variant's), which the card shows as the module wrote it. Evaluation
scores, the W&B run link and the compute used are not in it: the caller passes them (the push callback takes them from
the trainer, `hf-transformer push` from `--results`).
The card is rendered from `model_card_template.md`, a Jinja template, by `huggingface_hub.ModelCard.from_template`.

Each score is labelled with the sacreBLEU signature of what computed it, as `hf_transformer.scoring` defines it:
validation scores (`val/*`) are torchmetrics' during training (`VALIDATION_SCORES`), test scores (`test/*`) those of
`sacrebleu_scores`, which `hf-transformer test` logs.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import jinja2
import torch
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from ..model import TransformerForConditionalGeneration
from ..model.configuration_transformer import MAX_LENGTH_OFFSET, MIN_TRANSFORMERS_VERSION, TransformerConfig
from ..scoring import LOGGED_SCORES, VALIDATION_BLEU, VALIDATION_CHRF, VALIDATION_SCORES, sacrebleu_signatures

CARD_NAME = "README.md"
DEFAULT_LICENSE = "apache-2.0"
SYNTHETIC_DATASET = "synthetic"
# The facts a card is rendered from, saved beside it so that `rewrite_model_card` renders it for a repo or format.
CARD_FACTS = "hf_transformer_card.json"
# The checkpoint key of the training module's rows about how it trains ([label, text] pairs): its schedule's own
# description and a row of each variant's (`TranslationModule.describe_training`).
TRAINING_DESCRIPTION = "training_description"
TEMPLATE = Path(__file__).with_name("model_card_template.md")
# What the card reads from a checkpoint (small values only: no weights). `averaged_steps`: the steps whose weights an
# averaged checkpoint (`lightning_modules.checkpoint.average_checkpoints`) is the mean of.
_CHECKPOINT_KEYS = (
    "hyper_parameters",
    "datamodule_hyper_parameters",
    "hf_config",
    "generation_config",
    "global_step",
    "averaged_steps",
    TRAINING_DESCRIPTION,
)
# Table rows of the evaluation section: metric key suffix -> column title.
_SCORES = {"bleu": "BLEU", "chrf": "chrF", "loss": "Loss (nats/token)", "perplexity": "Perplexity"}
_STAGES = {"test": "test_split", "val": "validation_split"}
# What computed each stage's scores, for the sentence under the evaluation table.
_SCORED_BY = {
    "test": "sacreBLEU (`hf_transformer.scoring`, as `hf-transformer test` logs them)",
    "val": "torchmetrics' `SacreBLEUScore` and `CHRFScore`, logged during training",
}
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
    format: str = "hf-transformer",
    repo_id: str | None = None,
    results: dict[str, float] | None = None,
    wandb_url: str | None = None,
    compute: str | None = None,
    dataset: str | None = None,
    language_pair: tuple[str, str] | None = None,
    license: str = DEFAULT_LICENSE,
    example: str | None = None,
) -> Path:
    """Write `folder/README.md` for the model exported from `checkpoint` in `format` (one of
    `hf_transformer.formats.FORMATS` that carries a card, whose `FormatCard` gives its tags and usage) and return its
    path; the facts it is rendered from go to `folder/hf_transformer_card.json`, from which
    `rewrite_model_card` renders it again for another repo or format.

    `repo_id` is the Hub repo the card's usage snippet loads (default: the folder's absolute path, so the snippet runs
    as written against the local export; `hf-transformer push` points it at the repo). `results` maps logged metric
    names (`test/bleu`, `val/chrf`, `test/loss`, ...) to values. `dataset` and `language_pair` default to the data
    module's arguments saved in the checkpoint.
    """
    facts = {
        "checkpoint": {key: checkpoint.get(key) for key in _CHECKPOINT_KEYS},
        "results": results or {},
        "wandb_url": wandb_url,
        "compute": compute,
        "dataset": dataset,
        "language_pair": language_pair,
        "license": license,
        "example": example,
    }
    folder = Path(folder)
    # default=list: tuples (Adam's betas) come back as lists, which the card prints the same way.
    (folder / CARD_FACTS).write_text(json.dumps(facts, indent=2, default=list) + "\n", encoding="utf-8")
    return _render(folder, facts, format, repo_id)


def rewrite_model_card(
    source: str | Path,
    folder: str | Path,
    *,
    format: str,
    repo_id: str | None = None,
    results: dict[str, float] | None = None,
    wandb_url: str | None = None,
    revision: str | None = None,
) -> bool:
    """Render the card of the export in `source` again into `folder` (which may be `source`), for `repo_id` and
    `format`, from the facts `write_model_card` saved, with `results` (logged metric name -> value, e.g.
    `test_scores.json` of `hf-transformer test`) added and `wandb_url` set where given; `revision`, a commit of
    `repo_id`, is pinned in the usage snippet. Returns False (and writes nothing) when `source` has no facts; raises
    ValueError then if there were results or a W&B link to add."""
    path = Path(source) / CARD_FACTS
    if not path.is_file():
        if results or wandb_url:
            raise ValueError(
                f"{source} has no {CARD_FACTS}, which its model card is rendered from, so the scores cannot go into "
                "its card: export it again from its checkpoint (hf-transformer export CHECKPOINT FOLDER --results JSON)"
            )
        return False
    facts = json.loads(path.read_text(encoding="utf-8"))
    facts["results"] = {**facts["results"], **(results or {})}
    facts["wandb_url"] = wandb_url or facts["wandb_url"]
    target = Path(folder) / CARD_FACTS
    if results or wandb_url or not target.exists():
        target.unlink(missing_ok=True)  # a staged copy may hard-link it: never write through the link
        target.write_text(json.dumps(facts, indent=2) + "\n", encoding="utf-8")
    _render(Path(folder), facts, format, repo_id, revision)
    return True


def _render(folder: Path, facts: dict[str, Any], format: str, repo_id: str | None, revision: str | None = None) -> Path:
    # The registry of export formats says what each format's card holds; it imports this module, so it is imported
    # here.
    from ..formats import FORMATS, card_formats

    if format not in card_formats():
        raise ValueError(f"Unknown model format {format!r}: the card knows {', '.join(card_formats())}.")
    format_card = FORMATS[format].format_card()
    language_pair = facts["language_pair"]
    run = _RunFacts(facts["checkpoint"], facts["dataset"], tuple(language_pair) if language_pair else None)
    results = facts["results"]
    model_id = repo_id or str(folder.resolve())
    name = _model_name(model_id)
    requirement = f"transformers>={MIN_TRANSFORMERS_VERSION},<6"
    example = facts["example"] or _EXAMPLES.get(run.source_lang, _EXAMPLES["en"])
    snippets = {
        part: jinja2.Template(getattr(format_card, part)).render(
            model_id=model_id, revision=revision, example=example, requirement=requirement
        )
        for part in ("usage", "about", "requirement_note", "after_usage")
    }
    card = ModelCard.from_template(
        _metadata(run, name, results, facts["license"], format_card.tags),
        template_path=str(TEMPLATE),
        **snippets,
        other_formats=[(other.name, other.summary) for other in FORMATS.values() if other.name != format],
        name=name,
        source_lang=run.source_lang,
        target_lang=run.target_lang,
        dataset_label=run.dataset_label,
        architecture=_architecture(run),
        training=_training(run, facts["compute"]),
        wandb_url=facts["wandb_url"],
        evaluation=_evaluation(run, results),
        requirement=requirement,
    )
    path = folder / CARD_NAME
    card.save(path)
    return path


def bleu_signature() -> str:
    """The sacreBLEU signature of the validation BLEU that `TranslationModule` logs (`val/bleu`), as the metric gives
    it (`hf_transformer.scoring.VALIDATION_BLEU`). The test BLEU is sacreBLEU's own: `signatures("test")`."""
    return VALIDATION_BLEU.signature()


def chrf_signature() -> str:
    """The sacreBLEU signature of the validation chrF that `TranslationModule` logs (`val/chrf`)."""
    return VALIDATION_CHRF.signature()


def signatures(stage: str) -> dict[str, str]:
    """The sacreBLEU signature of each signed score ("bleu", "chrf") that `stage` ("val" or "test") logs: the test
    scores are `hf_transformer.scoring`'s, whose own labels these are."""
    if stage == "val":
        return {name: metric.signature() for name, metric in VALIDATION_SCORES.items()}
    if stage == "test":
        scoring = sacrebleu_signatures()
        return {name: scoring[score] for name, score in LOGGED_SCORES.items()}
    raise ValueError(f"Unknown stage {stage!r}: scores are logged for {', '.join(_STAGES)}.")


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
        self.averaged_steps: list[int] = list(checkpoint.get("averaged_steps") or [])
        self.training_description: list[tuple[str, str]] = [
            (label, text) for label, text in checkpoint.get(TRAINING_DESCRIPTION) or []
        ]
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


def _metadata(
    run: _RunFacts, name: str, results: dict[str, float], license: str, format_tags: tuple[str, ...]
) -> ModelCardData:
    languages = [code for code in map(_language_code, (run.source_lang, run.target_lang)) if code]
    return ModelCardData(
        language=languages or None,
        license=license,
        library_name="transformers",
        pipeline_tag="translation",
        tags=["translation", "transformer", "encoder-decoder", "vaswani-transformer", "hf-transformer", *format_tags],
        datasets=[run.hub_dataset] if run.hub_dataset else None,
        base_model=run.base_model,
        metrics=["bleu", "chrf"],
        model_name=name,
        eval_results=_eval_results(run, results) or None,
    )


def _eval_results(run: _RunFacts, results: dict[str, float]) -> list[EvalResult]:
    """BLEU and chrF per evaluated split, each with the sacreBLEU signature of what computed it, for the card's
    `model-index`."""
    entries = []
    for stage, split_key in _STAGES.items():
        for metric, signature in signatures(stage).items():
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


def _architecture(run: _RunFacts) -> list[tuple[str, Any]]:
    config = run.config
    norm = "pre-LN (LayerNorm before each sub-layer)" if config.normalize_before else "post-LN, as in the paper"
    tied = "shared source/target embeddings tied with the output projection" if config.tie_word_embeddings else ""
    preset = run.hparams.get("preset")
    return [
        ("Preset the sizes start from", f"`{preset}` (Table 3)" if preset else "-"),
        ("Layers (encoder / decoder)", f"{config.encoder_layers} / {config.decoder_layers}"),
        ("d_model", config.d_model),
        ("Attention heads (encoder / decoder)", f"{config.encoder_attention_heads} / {config.decoder_attention_heads}"),
        ("Feed-forward size d_ff", f"{config.encoder_ffn_dim} ({config.activation_function})"),
        ("Dropout P_drop", _dropouts(config)),
        ("Layer normalisation", norm),
        ("Vocabulary", f"{config.vocab_size} BPE tokens" + (f", {tied}" if tied else "")),
        ("Positions", f"sinusoidal, up to {config.max_position_embeddings} tokens"),
        ("Parameters", _count(run.num_parameters)),
    ]


def _dropouts(config: TransformerConfig) -> str:
    """P_drop (5.4), then each further dropout the run switched on: those set to 0 stay out of the card."""
    further = (
        ("on the attention weights", config.attention_dropout),
        ("inside the feed-forward networks", config.activation_dropout),
    )
    return "; ".join([str(config.dropout)] + [f"{p} {where}" for where, p in further if p])


def _training(run: _RunFacts, compute: str | None) -> list[tuple[str, Any]]:
    hp, data = run.hparams, run.data
    rows = []
    if hp:
        betas, eps, decay = tuple(hp.get("betas", ())), hp.get("eps"), hp.get("weight_decay")
        rows.append(("Optimizer", f"AdamW, betas {betas}, eps {eps}, weight decay {decay}"))
    rows += run.training_description or _recorded_settings(hp)
    rows.append(("Label smoothing", run.config.label_smoothing))
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
    if len(run.averaged_steps) > 1:
        steps = ", ".join(map(str, run.averaged_steps))
        rows.append(("Checkpoint averaging", f"the exported weights are the mean of those at steps {steps}"))
    if compute:
        rows.append(("Compute", compute))
    rows.append(("Decoding", _decoding(run)))
    return rows


def _recorded_settings(hp: dict[str, Any]) -> list[tuple[str, str]]:
    """The training settings of a checkpoint that holds no description of them (written before the module described
    itself; `lightning_modules` describes those of 0.3 and 0.4 when it exports them): as recorded, by name."""
    shown = {"preset", "config", "init_from", "betas", "eps", "weight_decay", "generation", "compile"}
    recorded = [f"{name} {value}" for name, value in hp.items() if name not in shown and not name.startswith("_")]
    return [("Training settings (as recorded)", ", ".join(recorded))] if recorded else []


def _decoding(run: _RunFacts) -> str:
    generation = run.generation
    beams = generation.get("num_beams") or 1
    text = f"beam search with {beams} beams" if beams > 1 else "greedy search"
    if generation.get("length_penalty") is not None:
        text += f", length penalty {generation['length_penalty']}"
    # `translate()` (validation, test, `hf-transformer translate`, `serve`) reads the beams and the length penalty from
    # the generation config and bounds the output by section 6.1's rule; so does `generate()` (and the translation
    # pipeline), unless the generation config saves a bound of its own, as the models of 0.3 and 0.4 did.
    ours = "`hf_transformer.translate()` (the scores below, `hf-transformer translate` and `serve`)"
    lengths = [f"at most the source's length + {MAX_LENGTH_OFFSET} with {ours}"]
    if generation.get("max_new_tokens"):
        lengths.insert(0, f"at most {generation['max_new_tokens']} tokens with `generate()`")
    elif generation.get("max_length"):  # a model of 0.3, which saved the bound with the start token
        lengths.insert(0, f"at most {generation['max_length'] - 1} tokens with `generate()`")
    else:
        lengths = [f"at most the source's length + {MAX_LENGTH_OFFSET} with `generate()`, the pipeline and {ours}"]
    return f"{text} (`generation_config.json`); output length: {', '.join(lengths)}"


def _evaluation(run: _RunFacts, results: dict[str, float]) -> dict[str, list] | None:
    """The evaluation table: score columns and one row of cells per evaluated split, and per split what scored it
    with the signatures of its scores; None without results."""
    splits = [stage for stage in _STAGES if any(f"{stage}/{metric}" in results for metric in _SCORES)]
    if not splits:
        return None
    metrics = [metric for metric in _SCORES if any(f"{stage}/{metric}" in results for stage in splits)]
    rows = [
        (run.data.get(_STAGES[stage], stage), [_format_score(results.get(f"{stage}/{metric}")) for metric in metrics])
        for stage in splits
    ]
    scored_by = []
    for stage in splits:
        signed = [f"{_SCORES[m]} `{sig}`" for m, sig in signatures(stage).items() if f"{stage}/{m}" in results]
        if signed:  # a split with its loss alone has no signature to give
            scored_by.append((run.data.get(_STAGES[stage], stage), _SCORED_BY[stage], signed))
    return {"columns": [_SCORES[metric] for metric in metrics], "rows": rows, "scored_by": scored_by}


def _count(number: int) -> str:
    scaled = f"{number / 1e6:.1f}M" if number >= 1e6 else f"{number / 1e3:.1f}K"
    return f"{number:,} ({scaled})"


def _format_score(value: float | None) -> str:
    return "-" if value is None else f"{float(value):.2f}"


def _model_name(model_id: str) -> str:
    return Path(model_id).name or model_id


def __getattr__(name: str) -> Any:
    # `FormatCard` lived here until 0.4.0: it is still found here, with its new home.
    if name == "FormatCard":
        warnings.warn(
            "hf_transformer.hub.model_card.FormatCard moved: import it from hf_transformer.formats",
            FutureWarning,
            stacklevel=2,
        )
        from ..formats import FormatCard

        return FormatCard
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

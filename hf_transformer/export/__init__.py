"""A trained model in other formats: one file per format (`hf_transformer.py`, `marian.py`, `ctranslate2.py`,
`onnx.py`), one line per format in the registry, `hf_transformer.formats.FORMATS`.

`export_model` writes a model and its tokenizer in a format; `export_folder` converts a folder written by `export`
(its card, if it has one, rendered again for the new format). A folder is written whole or not at all
(`hf_transformer.model_folder.written_whole`) by the command that calls them."""

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..formats import (
    DEFAULT_FORMAT,
    FORMATS,
    ExportFormat,
    ExportOption,
    FormatCard,
    card_formats,
    checked_format,
    folder_format,
    runtime_formats,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

    from ..model import TransformerForConditionalGeneration


def export_model(
    model: "TransformerForConditionalGeneration",
    tokenizer: "PreTrainedTokenizerFast",
    folder: str | Path,
    format: str = DEFAULT_FORMAT,
    **options: Any,
) -> Path:
    """Write `model` and `tokenizer` into `folder` in `format` (a name in `FORMATS`) with that format's `options`.
    The model card is the caller's (`hf_transformer.hub.model_card`), which knows how the model was trained. Raises
    `ConfigError` for an unknown format or an option it does not take."""
    return checked_format(format, options).write(model, tokenizer, Path(folder), **options)


def export_folder(
    source: str | Path,
    folder: str | Path,
    format: str,
    *,
    repo_id: str | None = None,
    results: dict[str, float] | None = None,
    wandb_url: str | None = None,
    **options: Any,
) -> Path:
    """Convert the folder `source`, written by `export`, into `format` in `folder`; its model card, if it has one, is
    rendered again for that format (for `repo_id`, the repository its usage snippet loads, with `results` added and
    `wandb_url` set). Its shortlist (`hf-transformer shortlist`) goes along into a CTranslate2 folder."""
    from transformers import PreTrainedTokenizerFast

    from ..decoding.shortlist import Shortlist
    from ..hub.model_card import rewrite_model_card
    from ..model import TransformerForConditionalGeneration
    from ..model_folder import check_model_folder

    chosen = checked_format(format, options)  # before the model is loaded
    check_model_folder(source)
    model = TransformerForConditionalGeneration.from_pretrained(source)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(source)
    folder = export_model(model, tokenizer, folder, format, **options)
    if format == "ctranslate2" and (shortlist := Shortlist.from_pretrained(source, missing_ok=True)) is not None:
        from .ctranslate2 import write_vocabulary_map

        write_vocabulary_map(shortlist, tokenizer, folder)
    if chosen.has_card:
        rewrite_model_card(source, folder, format=format, repo_id=repo_id, results=results, wandb_url=wandb_url)
    return folder


__all__ = [
    "DEFAULT_FORMAT",
    "FORMATS",
    "ExportFormat",
    "ExportOption",
    "FormatCard",
    "card_formats",
    "export_folder",
    "export_model",
    "folder_format",
    "runtime_formats",
]

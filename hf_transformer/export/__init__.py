"""A trained model in other formats: one file per format, one line per format in `FORMATS`. `hf-transformer export`
(its `--format` choices, help and options), `push` and the model card iterate the registry, so a new format is a new
file and a new line here.

`export_model` writes a model and its tokenizer in a format; `export_folder` converts a folder written by `export`
(its card, if it has one, rendered again for the new format). A folder is written whole or not at all
(`folder.written_whole`) by the command that calls them."""

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..hub import CARD_FORMATS

if TYPE_CHECKING:  # imported where used: `hf-transformer export --help` lists the formats without loading torch
    from transformers import PreTrainedTokenizerFast

    from ..model import TransformerForConditionalGeneration


@dataclass(frozen=True)
class ExportFormat:
    """One export format: `writer` ("module:function") writes `(model, tokenizer, folder, **options)`; its module is
    imported only when used (CTranslate2 and ONNX are extras). `options` are the `export` options it takes."""

    name: str
    summary: str
    writer: str
    options: tuple[str, ...] = ()

    @property
    def has_card(self) -> bool:
        """Whether the format is a model folder that the Hub shows with a model card (one the card knows how to
        describe), which `push` uploads."""
        return self.name in CARD_FORMATS

    def write(
        self,
        model: "TransformerForConditionalGeneration",
        tokenizer: "PreTrainedTokenizerFast",
        folder: Path,
        **options: Any,
    ) -> Path:
        from .folder import make_shareable

        module, function = self.writer.split(":")
        writer: Callable[..., Path] = getattr(importlib.import_module(f".{module}", __name__), function)
        writer(model, tokenizer, folder, **options)
        make_shareable(folder)
        return folder


FORMATS: dict[str, ExportFormat] = {
    format.name: format
    for format in (
        ExportFormat(
            "hf-transformer",
            "this model with its code (loads with trust_remote_code=True)",
            "folder:save_model",
        ),
        ExportFormat(
            "marian",
            "the same model as a stock MarianMTModel, which loads without remote code (post-LN models only)",
            "marian:save_marian",
        ),
        ExportFormat(
            "ctranslate2",
            "a CTranslate2 model (post-LN models only; pip install 'hf-transformer[ctranslate2]')",
            "ctranslate2:to_ctranslate2",
            options=("quantization",),
        ),
        ExportFormat(
            "onnx",
            "ONNX programs of the encoder and the decoder's steps (pip install 'hf-transformer[onnx]')",
            "onnx:to_onnx",
            options=("batch_size", "source_length", "max_length"),
        ),
    )
}
DEFAULT_FORMAT = "hf-transformer"


def _checked_format(format: str, options: dict[str, Any]) -> ExportFormat:
    """The registered format `format`, once it is known to take every one of `options`; a `ConfigError` naming the
    formats or the options there are otherwise (the format's writer would fail with a bare KeyError or TypeError)."""
    if format not in FORMATS:
        raise ConfigError(f"Unknown export format {format!r}: the formats are {', '.join(FORMATS)}.")
    chosen = FORMATS[format]
    unknown = sorted(set(options) - set(chosen.options))
    if unknown:
        takes = f"takes only {', '.join(chosen.options)}" if chosen.options else "takes no options"
        raise ConfigError(f"The {format} export does not take {', '.join(unknown)}: it {takes}. Leave them out.")
    return chosen


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
    return _checked_format(format, options).write(model, tokenizer, Path(folder), **options)


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
    `wandb_url` set)."""
    from transformers import PreTrainedTokenizerFast

    from ..hub.model_card import rewrite_model_card
    from ..model import TransformerForConditionalGeneration
    from .folder import check_model_folder

    chosen = _checked_format(format, options)  # before the model is loaded
    check_model_folder(source)
    model = TransformerForConditionalGeneration.from_pretrained(source)
    folder = export_model(model, PreTrainedTokenizerFast.from_pretrained(source), folder, format, **options)
    if chosen.has_card:
        rewrite_model_card(source, folder, format=format, repo_id=repo_id, results=results, wandb_url=wandb_url)
    return folder


__all__ = ["CARD_FORMATS", "DEFAULT_FORMAT", "FORMATS", "ExportFormat", "export_folder", "export_model"]

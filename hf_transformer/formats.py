"""The registry of the formats a trained model is exported in: one line per format in `FORMATS`. Each entry owns its
facts: its writer and options (with their types and help: `hf-transformer export` makes its flags from them), its model
card (whether it carries one, its Hub tags and usage), and how a folder of it is recognised and loaded to translate.
`hf-transformer export` and `push`, the model card and the `translate`/`serve` engine ask the registry, so a new format
is a new file (in `hf_transformer/export/`) and a new line here.

The registry names writers, cards and runtimes by text ("module:attribute") and imports them only when used: it sits
below the export, decoding and Hub code that it names, and `hf-transformer export --help` reads it without loading
torch, transformers or huggingface_hub."""

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

    from .model import TransformerForConditionalGeneration


@dataclass(frozen=True)
class FormatCard:
    """What the model card says of an export format that carries one (`ExportFormat.card`): its Hub tags and its
    paragraphs, each a Jinja snippet rendered with the card's values (`model_id`, `revision`: the commit a push pinned
    or None, `example`, `requirement`)."""

    tags: tuple[str, ...]  # the Hub tags of a folder of this format, beside the card's own
    usage: str  # the Python code of the Usage section
    about: str = ""  # a paragraph after the introduction: what a folder of this format holds
    requirement_note: str = ""  # words after "Needs torch and transformers..." (without a full stop)
    after_usage: str = ""  # paragraphs after the code


def positive_int(text: str) -> int:
    """An option's type: a whole number of at least 1."""
    try:
        number = int(text)
    except ValueError:
        raise ValueError(f"expected a whole number, got {text!r}") from None
    if number < 1:
        raise ValueError(f"must be at least 1, got {number}")
    return number


@dataclass(frozen=True)
class ExportOption:
    """An option of a format's writer, `name=value`; `hf-transformer export` takes it as `--name` (dashes for
    underscores). `type` turns the command line's text into the value (a ValueError says what is wrong with it);
    `bool` makes a flag, `--name`, that sets True."""

    name: str
    help: str
    type: Callable[[str], Any] = str
    default: Any = None
    metavar: str | None = None


@dataclass(frozen=True)
class ExportFormat:
    """One export format. `writer` writes `(model, tokenizer, folder, **options)`: a callable, or "module:function"
    (absolute), imported only when used (CTranslate2 and ONNX are extras). `options` are the options it
    takes; `card` what its model card says, a `FormatCard` or "module:ATTRIBUTE" naming one, imported
    when a card is written (None: the format carries no card, and `push` does not take it).

    A folder of the format is recognised by its `files` (and, where several formats write a config.json, by its
    `model_type`, or a function that returns it, called when a folder is checked); `runtime` ("module:attribute",
    absolute) loads one to translate, `(name_or_path, device) -> TranslationEngine`; a format without one says where it
    runs instead (`runs_elsewhere`). What is named by text is imported only when used, so that the registry itself
    loads nothing heavy."""

    name: str
    summary: str
    writer: str | Callable[..., Any]
    options: tuple[ExportOption, ...] = ()
    card: "FormatCard | str | None" = None
    files: tuple[str, ...] = ()
    model_type: str | Callable[[], str] | None = None
    runtime: str | None = None
    runs_elsewhere: str = ""

    @property
    def has_card(self) -> bool:
        """Whether the format is a model folder that the Hub shows with a model card, which `push` uploads."""
        return self.card is not None

    def format_card(self) -> "FormatCard | None":
        """What the model card of a folder of this format says of it (its `card`, imported where named by text)."""
        return None if self.card is None else _resolve(self.card)

    def write(
        self,
        model: "TransformerForConditionalGeneration",
        tokenizer: "PreTrainedTokenizerFast",
        folder: Path,
        **options: Any,
    ) -> Path:
        from .model_folder import make_shareable

        _resolve(self.writer)(model, tokenizer, folder, **options)
        make_shareable(folder)
        return folder

    def holds(self, folder: Path) -> bool:
        """Whether `folder` is a folder of this format: it has the format's files, and config.json's model type is
        the format's where it names one."""
        if not self.files or not all((folder / name).is_file() for name in self.files):
            return False
        if self.model_type is None:
            return True
        return _model_type(folder) == (self.model_type() if callable(self.model_type) else self.model_type)

    def load(self, name_or_path: str | Path, device: str = "cpu", int8: bool | None = None, **options: Any) -> Any:
        """The engine that translates with the folder (or Hub repository) `name_or_path` of this format: the
        `hf_transformer.decoding.engine.TranslationEngine` its `runtime` returns (not imported here, which the
        engine imports). `int8`: with int8 weights, or not; None: as the folder asks, and a runtime that does not take
        `int8` is not given it; `options`: what the runtimes take besides (`shortlist`)."""
        if self.runtime is None:
            raise ValueError(f"the {self.name} format has no runtime in hf-transformer: {self.runs_elsewhere}")
        int8_option = {} if int8 is None else {"int8": int8}
        return _resolve(self.runtime)(name_or_path, device=device, **int8_option, **options)


def _resolve(reference: Any) -> Any:
    """`reference` itself, or the attribute that the text "module:attribute" names (dotted: an attribute of an
    attribute; the module's name absolute), its module imported now."""
    if not isinstance(reference, str):
        return reference
    module, attribute = reference.split(":")
    value: Any = importlib.import_module(module)
    for name in attribute.split("."):
        value = getattr(value, name)
    return value


def _our_model_type() -> str:
    """The model type in the config.json of an "hf-transformer" folder (importing the model loads torch)."""
    from .model import TransformerConfig

    return TransformerConfig.model_type


FORMATS: dict[str, ExportFormat] = {
    format.name: format
    for format in (
        ExportFormat(
            "hf-transformer",
            "this model with its code (loads with trust_remote_code=True)",
            "hf_transformer.export.hf_transformer:save_model",
            options=(
                ExportOption(
                    "int8",
                    "make translate and serve decode the folder with int8 weights on the CPU (weights stay float32)",
                    bool,
                    default=False,
                ),
            ),
            card="hf_transformer.export.hf_transformer:HF_TRANSFORMER_CARD",
            files=("config.json", "model.safetensors"),
            model_type=_our_model_type,
            runtime="hf_transformer.decoding.engine:TranslationEngine.from_model",
        ),
        ExportFormat(
            "marian",
            "the same model as a stock MarianMTModel, which loads without remote code (post-LN models only)",
            "hf_transformer.export.marian:save_marian",
            card="hf_transformer.export.marian:MARIAN_CARD",
            files=("config.json",),
            model_type="marian",
            runs_elsewhere="it loads with transformers' MarianMTModel",
        ),
        ExportFormat(
            "ctranslate2",
            "a CTranslate2 model (post-LN models only; pip install 'hf-transformer[ctranslate2]')",
            "hf_transformer.export.ctranslate2:to_ctranslate2",
            options=(
                ExportOption(
                    "quantization", "the stored weight type, e.g. int8 (default: float32)", metavar="QUANTIZATION"
                ),
            ),
            files=("model.bin",),
            runtime="hf_transformer.decoding.engine:TranslationEngine.from_ctranslate2",
        ),
        ExportFormat(
            "onnx",
            "ONNX programs of the encoder and the decoder's steps (pip install 'hf-transformer[onnx]')",
            "hf_transformer.export.onnx:to_onnx",
            options=(
                # The shape the programs take, fixed by the static cache.
                ExportOption(
                    "batch_size", "sources per call, fixed in the programs (default: 1)", positive_int, default=1
                ),
                ExportOption(
                    "source_length", "source tokens per row, padded (default: the model's positions)", positive_int
                ),
                ExportOption(
                    "max_length",
                    "output tokens, the start token included (default: the model's positions)",
                    positive_int,
                ),
            ),
            # What transformers' exporter writes beside the programs: it names them and their inputs.
            files=("export.json",),
            runs_elsewhere="they run on ONNX Runtime (load them with "
            "transformers.exporters.ExportedModel.from_pretrained(folder), as docs/deploying.md shows)",
        ),
    )
}
DEFAULT_FORMAT = "hf-transformer"


def card_formats() -> list[str]:
    """The formats that carry a model card, which `push` uploads."""
    return [name for name, format in FORMATS.items() if format.has_card]


def runtime_formats() -> list[str]:
    """The formats whose folders `translate`, `attention` and `serve` load."""
    return [name for name, format in FORMATS.items() if format.runtime]


def folder_format(folder: str | Path) -> ExportFormat | None:
    """The registered format of the model folder `folder`, or None (no such folder, a Hub id, another model)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    return next((format for format in FORMATS.values() if format.holds(folder)), None)


def _model_type(folder: Path) -> str | None:
    try:
        return json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def checked_format(format: str, options: dict[str, Any]) -> ExportFormat:
    """The registered format `format`, once it is known to take every one of `options`; a `ConfigError` naming the
    formats or the options there are otherwise (the format's writer would fail with a bare KeyError or TypeError)."""
    if format not in FORMATS:
        raise ConfigError(f"Unknown export format {format!r}: the formats are {', '.join(FORMATS)}.")
    chosen = FORMATS[format]
    takes = [option.name for option in chosen.options]
    unknown = sorted(set(options) - set(takes))
    if unknown:
        accepted = f"takes only {', '.join(takes)}" if takes else "takes no options"
        raise ConfigError(f"The {format} export does not take {', '.join(unknown)}: it {accepted}. Leave them out.")
    return chosen

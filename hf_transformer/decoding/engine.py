"""One interface over a trained model, ours in PyTorch (or an ensemble of several) or its CTranslate2 export, for the
`translate`, `attention` and `serve` commands: the same settings, the same treatment of empty and too-long sentences,
the same errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from transformers import GenerationConfig, PreTrainedTokenizerFast

from ..errors import MissingExtra, ModelNotFound, TranslationInputError, UserError
from ..formats import DEFAULT_FORMAT, FORMATS, folder_format, runtime_formats
from ..model import TransformerConfig, TransformerForConditionalGeneration
from ..model_folder import check_tokenizer_files
from .attention_maps import AttentionMaps, attention_maps
from .ensemble import Average, Ensemble, check_same_tokenizer
from .int8 import int8_requested, is_int8, quantize_int8
from .search import DECODING_MAX_TOKENS, Translation, check_decoding_settings, translate
from .shortlist import Shortlist

if TYPE_CHECKING:
    from .ctranslate2 import CTranslate2Translator

# The most beams a command or a request may ask for: beam search costs memory and time in proportion.
MAX_BEAMS = 16


class TranslationEngine:
    """A trained model ready to translate: `model` (ours, or an `Ensemble` of ours, decoded by `translate`; an
    ensemble gives no attention weights) or `ctranslate2` (a `CTranslate2Translator`, translations only: no scores,
    n-best lists or attention)."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerFast,
        model: TransformerForConditionalGeneration | Ensemble | None = None,
        ctranslate2: CTranslate2Translator | None = None,
        name: str = "",
        shortlist: Shortlist | None = None,
    ) -> None:
        if (model is None) == (ctranslate2 is None):
            raise ValueError("Pass exactly one of model and ctranslate2.")
        if shortlist is not None and not isinstance(model, TransformerForConditionalGeneration):
            raise UserError("a shortlist decodes one model of this package, not an ensemble: drop it")
        self.tokenizer, self.model, self.ctranslate2, self.name = tokenizer, model, ctranslate2, name
        self.shortlist = shortlist
        self.generation_config: GenerationConfig = (
            model.generation_config if model is not None else ctranslate2.generation_config
        )
        self.max_positions: int = (
            model.config.max_position_embeddings if model is not None else tokenizer.model_max_length
        )

    @property
    def engine(self) -> str:
        return "hf-transformer" if self.model is not None else "ctranslate2"

    @property
    def int8(self) -> bool:
        """Whether the model decodes with int8 weights."""
        if self.model is None:
            return "int8" in self.ctranslate2.translator.compute_type
        return all(is_int8(model) for model in getattr(self.model, "models", [self.model]))

    @classmethod
    def from_pretrained(
        cls, name_or_path: str | Path, device: str = "cpu", int8: bool | None = None, shortlist: bool | None = None
    ) -> TranslationEngine:
        """A folder written by `hf-transformer export` or a Hub repository of this package's model, loaded by the
        runtime of its format (`hf_transformer.formats.FORMATS`: the format that recognises the folder by its files;
        a Hub id is this package's model). A folder of a format without a runtime here (ONNX, Marian) is refused,
        saying where it runs. `int8`: decode with int8 weights on the CPU (our model: `quantize_int8`; CTranslate2:
        its int8 compute type), or not; None: as the folder asks (`export --int8`). `shortlist`: decode with the
        folder's (or Hub repository's) `Shortlist` (`hf-transformer shortlist`; CTranslate2: its vocabulary map), or
        not; None: where it has one."""
        folder = Path(name_or_path)
        format = folder_format(folder)
        if format is None:
            config = folder / "config.json"
            model_type = json.loads(config.read_text()).get("model_type") if config.is_file() else None
            if model_type not in (None, TransformerConfig.model_type):
                raise ModelNotFound(
                    f"{folder} holds a {model_type} model: pass a folder exported with --format "
                    f"{' or '.join(runtime_formats())} (or the checkpoint it came from)"
                )
            format = FORMATS[DEFAULT_FORMAT]
        if format.runtime is None:
            # It may have the model's config.json and tokenizer but no weights: loading would fail as if it were no
            # model.
            raise ModelNotFound(
                f"{folder} is an export of --format {format.name} ({format.summary}), which this command does not "
                f"run: {format.runs_elsewhere}. To translate here, pass a folder exported with --format "
                f"{' or '.join(runtime_formats())}, or the checkpoint it came from"
            )
        return format.load(name_or_path, device=device, int8=int8, shortlist=shortlist)

    @classmethod
    def from_model(
        cls, name_or_path: str | Path, device: str = "cpu", int8: bool | None = None, shortlist: bool | None = None
    ) -> TranslationEngine:
        """The runtime of the "hf-transformer" format: this package's model from a folder or a Hub repository, with
        int8 weights where `int8` says so (None: where its generation config asks, as `export --int8` writes, and the
        device is the CPU), and its `Shortlist` (the folder's, or the Hub repository's, downloaded) where `shortlist`
        says so (None: where it has one)."""
        if (Path(name_or_path) / "config.json").is_file():
            check_tokenizer_files(name_or_path)
        try:
            model = TransformerForConditionalGeneration.from_pretrained(name_or_path)
            tokenizer = PreTrainedTokenizerFast.from_pretrained(name_or_path)
        except (OSError, ValueError) as err:  # no such folder or repository, or a malformed repository id
            if isinstance(err, UserError):  # a folder that loads but is refused, saying why
                raise
            raise ModelNotFound(
                f"{name_or_path} is no model folder, checkpoint or Hub repository that can be read ({err}). Pass a "
                "folder written by `hf-transformer export`, a .ckpt file, or a Hub id such as alice/demo."
            ) from err
        model = model.to(device).eval()
        # A folder's request (`export --int8`) holds on the CPU only, where int8 kernels run: on a GPU the same folder
        # decodes in float32. Asked for by the caller, int8 elsewhere is refused, naming the fix (`quantize_int8`).
        if int8 or (int8 is None and int8_requested(model) and model.device.type == "cpu"):
            model = quantize_int8(model, inplace=True)
        # None: where the folder or Hub repository has one.
        lexical = None if shortlist is False else Shortlist.from_pretrained(name_or_path, missing_ok=shortlist is None)
        return cls(tokenizer, model=model, name=str(name_or_path), shortlist=lexical)

    @classmethod
    def ensemble(cls, engines: list[TranslationEngine], average: Average = "probabilities") -> TranslationEngine:
        """The `Ensemble` of the models of `engines` (`from_pretrained`'s, or one each from checkpoints), named by
        their names joined with " + ". Refuses, in one line naming the two models and what differs, models whose
        tokenizers differ, and a CTranslate2 model, which gives no log-probabilities to average."""
        first = engines[0]
        for engine in engines:
            if engine.model is None:
                raise TranslationInputError(
                    f"{engine.name} is a CTranslate2 model: an ensemble averages the log-probabilities of this "
                    "package's models at every step. Pass the folders exported with --format hf-transformer (or the "
                    "checkpoints)"
                )
            check_same_tokenizer(first.name, first.tokenizer, engine.name, engine.tokenizer)
        names = [engine.name for engine in engines]
        ensemble = Ensemble([engine.model for engine in engines], average=average, names=names)
        return cls(first.tokenizer, model=ensemble, name=" + ".join(names))

    @classmethod
    def from_ctranslate2(
        cls, folder: str | Path, device: str = "cpu", int8: bool | None = None, shortlist: bool | None = None
    ) -> TranslationEngine:
        """The runtime of the "ctranslate2" format (the optional ctranslate2 package); `int8=True` runs it with
        CTranslate2's int8 compute type, False in float32, None with the weight type it was exported in. `shortlist`:
        with the folder's vocabulary map (a shortlist exported along), or not; None: where it has one."""
        try:
            from .ctranslate2 import CTranslate2Translator
        except ImportError as err:
            raise MissingExtra(f"{folder} is a CTranslate2 model: {err}") from err
        compute_type = "default" if int8 is None else "int8" if int8 else "float32"
        translator = CTranslate2Translator(folder, vocabulary_map=shortlist, device=device, compute_type=compute_type)
        return cls(translator.tokenizer, ctranslate2=translator, name=str(folder))

    def check_settings(
        self, num_beams: int | None = None, length_penalty: float | None = None, num_return_sequences: int = 1
    ) -> None:
        """Refuse decoding settings that cannot work or that the commands and the server do not take, naming the
        setting and its range (`check_decoding_settings`, at most `MAX_BEAMS` beams), and n-best lists of a CTranslate2
        model."""
        if num_beams is not None and not 1 <= num_beams <= MAX_BEAMS:
            raise TranslationInputError(f"num_beams={num_beams} must be between 1 and {MAX_BEAMS}")
        if length_penalty is not None and not -10 <= length_penalty <= 10:
            raise TranslationInputError(f"length_penalty={length_penalty} must be between -10 and 10")
        check_decoding_settings(self.generation_config, num_beams, num_return_sequences)
        if num_return_sequences > 1:
            self.require_model("n-best lists")

    def require_model(self, what: str) -> None:
        """Refuse what only this package's model gives (`what`: "n-best lists") when this is a CTranslate2 one."""
        if self.model is None:
            raise TranslationInputError(
                f"{what} come from this package's model, not from a CTranslate2 one: pass the folder exported with "
                "--format hf-transformer (or a checkpoint)"
            )

    def require_one_model(self, what: str) -> None:
        """Refuse what one model of this package gives (`what`: "attention weights") when this is a CTranslate2 one
        or an ensemble, whose members each attend in their own way."""
        self.require_model(what)
        if isinstance(self.model, Ensemble):
            raise TranslationInputError(
                f"{what} come from one model's attention, not from an ensemble of {len(self.model)}: pass one model"
            )

    def translate(
        self,
        sentences: list[str],
        *,
        num_beams: int | None = None,
        length_penalty: float | None = None,
        max_tokens: int = DECODING_MAX_TOKENS,
        num_return_sequences: int = 1,
    ) -> list[list[Translation]]:
        """The `num_return_sequences` best translations of each sentence, best first, as `translate` gives them
        (CTranslate2: the best one, score NaN, no token ids). Empty sentences translate to empty text; sources longer
        than the model's positions are cut, with a `SourceTruncatedWarning`."""
        self.check_settings(num_beams, length_penalty, num_return_sequences)
        settings = dict(num_beams=num_beams, length_penalty=length_penalty, max_tokens=max_tokens)
        if self.model is not None:
            return translate(
                self.model,
                self.tokenizer,
                sentences,
                num_return_sequences=num_return_sequences,
                shortlist=self.shortlist,
                **settings,
            )
        return [[Translation(text, float("nan"), [])] for text in self.ctranslate2(sentences, **settings)]

    def attention(
        self, sentences: list[str], output_ids: list[list[int]] | None = None, **settings
    ) -> list[AttentionMaps]:
        """`attention_maps` of the translations of `sentences` (or of `output_ids`); one model of this package only."""
        self.require_one_model("attention weights")
        return attention_maps(self.model, self.tokenizer, sentences, output_ids, **settings)

"""The MODEL argument of `translate`, `attention` and `serve`: an exported folder, a Hub id, a training checkpoint
(or a folder of them, averaged), or a CTranslate2 folder; `translate` and `serve` take several, as an ensemble."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hf_transformer.errors import UserError

if TYPE_CHECKING:  # torch and the model are imported where used, so that `--help` answers at once
    from hf_transformer.decoding.engine import TranslationEngine

MODEL_HELP = (
    "a folder written by `hf-transformer export` (--format hf-transformer or ctranslate2), a Hub id, a .ckpt file of "
    "training, or with --average the folder of the checkpoints"
)


def add_model_arguments(parser: argparse.ArgumentParser, ensembles: str | None = None, shortlist: bool = True) -> None:
    """MODEL and the options of loading it. `ensembles`: how the command takes more models as an ensemble (its help),
    which adds --ensemble-average; None: the command takes one. `shortlist`: whether it offers --shortlist (a
    command that runs beam search)."""
    parser.add_argument("model", metavar="MODEL", help=MODEL_HELP + (f". {ensembles}" if ensembles else ""))
    parser.add_argument(
        "--average",
        type=positive_int,
        metavar="N",
        help="average the last N checkpoints of the MODEL folder" + (" (of each, with several)" if ensembles else ""),
    )
    parser.add_argument(
        "--device", default="cpu", type=torch_device, help="where to run the model: cpu (default), cuda, cuda:1, mps"
    )
    parser.add_argument(
        "--int8",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="decode with int8 weights on the CPU: faster, translations close to float32's (CTranslate2 folders: its "
        "int8 compute type). Default: as the folder was exported (export --int8); --no-int8 decodes in float32",
    )
    if shortlist:
        parser.add_argument(
            "--shortlist",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="score each sentence's likely target tokens only, from the folder's (or Hub repository's) "
            "shortlist.safetensors "
            "(written by `hf-transformer shortlist`; CTranslate2 folders: their vmap.txt): faster, translations close "
            "to the full vocabulary's. Default: where the folder has one; --no-shortlist scores the whole vocabulary",
        )
    if ensembles:
        parser.add_argument(
            "--ensemble-average",
            type=ensemble_average,
            metavar="AVERAGE",
            help="how an ensemble combines its models' next-token distributions at each step: probabilities, the mean "
            "of their probabilities (default, fairseq's), or log-probabilities, of their log-probabilities "
            "(OpenNMT-py's)",
        )


def whole_number(text: str) -> int:
    """An argparse type: a whole number."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    number = whole_number(text)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def ensemble_average(text: str) -> str:
    """An argparse type: a rule by which an ensemble averages (`hf_transformer.decoding.ensemble.AVERAGES`), checked
    once given (the rules' module imports torch, which `--help` does not load)."""
    from hf_transformer.decoding.ensemble import AVERAGES

    if text not in AVERAGES:
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(AVERAGES)})")
    return text


def torch_device(text: str) -> str:
    """An argparse type: a device that torch has on this machine (moving the model to another one is a traceback)."""
    import torch

    try:
        parsed = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r} is no device: use cpu, cuda, cuda:N or mps") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count()
        if not count:
            if torch.version.cuda is None:
                raise argparse.ArgumentTypeError(
                    f"{text}: this torch ({torch.__version__}) is built without CUDA. Use --device cpu, or install a "
                    "CUDA build of torch"
                )
            raise argparse.ArgumentTypeError(f"{text}: torch finds no CUDA GPU on this machine. Use --device cpu")
        if (parsed.index or 0) >= count:
            raise argparse.ArgumentTypeError(f"{text}: torch finds {count} CUDA GPUs, cuda:0 to cuda:{count - 1}")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"{text}: MPS (Apple GPUs) is not available here. Use --device cpu")
    elif parsed.type not in ("cpu", "cuda", "mps"):
        raise argparse.ArgumentTypeError(f"{text}: the model runs on cpu, cuda, cuda:N or mps")
    return text


def load_engine(
    source: str,
    average: int | None = None,
    device: str = "cpu",
    int8: bool | None = None,
    shortlist: bool | None = None,
) -> TranslationEngine:
    """The model that `source` names, ready on `device`, with int8 weights where `int8` says so (None: where the
    folder asks; a checkpoint does not) and the folder's shortlist where `shortlist` says so (None: where the folder
    has one; a checkpoint has none)."""
    from transformers.utils import logging as transformers_logging

    from hf_transformer.decoding.engine import TranslationEngine

    transformers_logging.disable_progress_bar()  # a bar for loading weights that takes milliseconds
    path = Path(source)
    if not (average or path.is_file()):
        if path.is_dir() and not (path / "config.json").is_file() and any(path.glob("*.ckpt")):
            raise UserError(
                f"{path} is a folder of checkpoints: name one (e.g. {path}/last.ckpt) or average with --average N"
            )
        return TranslationEngine.from_pretrained(source, device=device, int8=int8, shortlist=shortlist)
    if shortlist:
        raise UserError(
            f"{source} is a checkpoint, and a shortlist is part of an exported folder: export it, then build one with "
            "`hf-transformer shortlist FOLDER --source FILE --target FILE`"
        )
    # Imported here: Lightning takes seconds to import, and an exported model does not need it.
    from ..checkpoint import model_from_checkpoint, tokenizer_from_checkpoint
    from ..checkpoint_export import checkpoint_to_export

    checkpoint = checkpoint_to_export(path, average, report=sys.stderr)  # standard output holds the translations
    model = model_from_checkpoint(checkpoint).to(device)
    if int8:
        from hf_transformer.decoding.int8 import quantize_int8

        model = quantize_int8(model, inplace=True)
    return TranslationEngine(tokenizer_from_checkpoint(checkpoint), model=model, name=source)


def load_engines(
    sources: list[str],
    average: int | None = None,
    device: str = "cpu",
    ensemble_average: str | None = None,
    int8: bool | None = None,
    shortlist: bool | None = None,
) -> TranslationEngine:
    """The model that `sources` name (`load_engine`), or with several their ensemble (`TranslationEngine.ensemble`,
    which refuses models of other tokenizers), averaged by `ensemble_average` (None: the ensemble's default)."""
    from hf_transformer.decoding.engine import TranslationEngine

    if len(sources) > 1 and shortlist:
        raise UserError("a shortlist decodes one model, not an ensemble: drop --shortlist, or all models but one")
    # An ensemble's members ignore their folders' shortlists.
    shortlist = shortlist if len(sources) == 1 else False
    engines = [load_engine(source, average, device, int8, shortlist) for source in sources]
    if len(engines) == 1:
        return engines[0]
    return TranslationEngine.ensemble(engines, *([ensemble_average] if ensemble_average else []))

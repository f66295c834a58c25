"""The MODEL argument of `translate`, `attention` and `serve`: an exported folder, a Hub id, a training checkpoint
(or a folder of them, averaged), or a CTranslate2 folder."""

import argparse
import sys
from pathlib import Path

from transformers.utils import logging as transformers_logging

from hf_transformer.engine import TranslationEngine
from hf_transformer.errors import UserError


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        metavar="MODEL",
        help="a folder written by `hf-transformer export` (any --format but marian), a Hub id, a .ckpt file of "
        "training, or with --average the folder of the checkpoints",
    )
    parser.add_argument("--average", type=int, metavar="N", help="average the last N checkpoints of the MODEL folder")
    parser.add_argument("--device", default="cpu", help="where to run the model: cpu (default), cuda, cuda:1, mps")


def load_engine(source: str, average: int | None = None, device: str = "cpu") -> TranslationEngine:
    """The model that `source` names, ready on `device`."""
    transformers_logging.disable_progress_bar()  # a bar for loading weights that takes milliseconds
    path = Path(source)
    if not (average or path.is_file()):
        if path.is_dir() and not (path / "config.json").is_file() and any(path.glob("*.ckpt")):
            raise UserError(
                f"{path} is a folder of checkpoints: name one (e.g. {path}/last.ckpt) or average with --average N"
            )
        return TranslationEngine.from_pretrained(source, device=device)
    # Imported here: Lightning takes seconds to import, and an exported model does not need it.
    from ..checkpoint import (
        average_checkpoints,
        last_checkpoints,
        load_checkpoint,
        model_from_checkpoint,
        tokenizer_from_checkpoint,
    )

    if average:
        folder = path if path.is_dir() else path.parent
        try:
            checkpoint = average_checkpoints(last_checkpoints(folder, average))
        except ValueError as err:  # too few readable checkpoints
            if isinstance(err, UserError):
                raise
            raise UserError(str(err)) from err
        steps = checkpoint["averaged_steps"]
        print(f"Averaged {len(steps)} checkpoints of {folder}, steps {', '.join(map(str, steps))}", file=sys.stderr)
    else:
        checkpoint = load_checkpoint(path)
    model = model_from_checkpoint(checkpoint).to(device)
    return TranslationEngine(tokenizer_from_checkpoint(checkpoint), model=model, name=source)

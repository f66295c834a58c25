"""Model folders as users receive them: readable by whoever the umask allows, and in the stock Marian format."""

import os
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from ..modeling_transformer import TransformerForConditionalGeneration
from .marian import to_marian
from .model_card import rewrite_model_card


def export_marian_from_folder(source: str | Path, folder: str | Path, repo_id: str | None = None) -> Path:
    """`export_marian` for a folder written by `export`: its card, if it has one, is rendered for Marian."""
    folder = Path(folder)
    to_marian(TransformerForConditionalGeneration.from_pretrained(source)).save_pretrained(folder)
    PreTrainedTokenizerFast.from_pretrained(source).save_pretrained(folder)
    rewrite_model_card(source, folder, format="marian", repo_id=repo_id)
    make_shareable(folder)
    return folder


def make_shareable(folder: Path) -> None:
    """Give every file the permissions the user's umask gives new files: safetensors writes its files readable by
    their owner only (-rw-------), which breaks a folder shared with a team or served by another user."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(0o666 & ~umask)

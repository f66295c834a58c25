"""Model folders as users receive them: readable by whoever the umask allows, and in the stock Marian format."""

import os
from pathlib import Path

from huggingface_hub.errors import StrictDataclassError
from transformers import PreTrainedTokenizerFast

from ..configuration_transformer import TransformerConfig
from ..errors import ConfigError, DataError
from ..modeling_transformer import TransformerForConditionalGeneration
from .marian import to_marian
from .model_card import rewrite_model_card


def export_marian_from_folder(source: str | Path, folder: str | Path, repo_id: str | None = None) -> Path:
    """`export_marian` for a folder written by `export`: its card, if it has one, is rendered for Marian."""
    check_model_folder(source)
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


def saved_config(name_or_path: str | Path) -> TransformerConfig:
    """`TransformerConfig.from_pretrained`, with a field of the wrong type in config.json (`"d_model": "256"`) named as
    one line, with the file and the fix."""
    try:
        return TransformerConfig.from_pretrained(name_or_path)
    except StrictDataclassError as error:
        raise ConfigError(
            f"{name_or_path}/config.json: {error.__cause__ or error}. Fix that field in the file (or export the model "
            "again)"
        ) from error


def check_model_folder(folder: str | Path) -> None:
    """Refuse, before anything is written, a model folder that cannot be converted: a config.json field of the wrong
    type, or no tokenizer (a conversion would write a model that no one can feed)."""
    folder = Path(folder)
    saved_config(folder)
    if not (folder / "tokenizer.json").is_file():
        raise DataError(
            f"{folder} has no tokenizer.json: a model folder needs the tokenizer it was trained with. Export it again "
            "from its checkpoint (hf-transformer export CHECKPOINT FOLDER, which writes the tokenizer), or copy the "
            f"run's tokenizer files (tokenizer.json, tokenizer_config.json; the run summary names their folder) into "
            f"{folder}"
        )

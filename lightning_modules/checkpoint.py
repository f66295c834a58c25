"""From Lightning checkpoints to Hugging Face folders: reading the model and tokenizer that travel inside a
checkpoint, averaging the last checkpoints (section 6.1 averages the last 5), and exporting."""

from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from hf_transformer import TransformerConfig, TransformerForConditionalGeneration, TranslationPipeline
from hf_transformer.marian import to_marian

from .model_card import rewrite_model_card, write_model_card

MODEL_PREFIX = "model."


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint written by `TranslationModule` (plain tensors and Python values only)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No checkpoint at {path}: pass the path of a .ckpt file written during training.")
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "hf_config", "tokenizer"):
        if key not in checkpoint:
            raise ValueError(f"{path} has no {key!r}: it was not written by lightning_modules.TranslationModule.")
    return checkpoint


def tokenizer_from_checkpoint(checkpoint: dict[str, Any]) -> PreTrainedTokenizerFast:
    saved = checkpoint["tokenizer"]
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(saved["json"]), **saved["special_tokens"])


def tokenizer_state(tokenizer: PreTrainedTokenizerFast) -> dict[str, Any]:
    """What `tokenizer_from_checkpoint` needs, as plain values."""
    return {"json": tokenizer.backend_tokenizer.to_str(), "special_tokens": dict(tokenizer.special_tokens_map)}


def model_from_checkpoint(checkpoint: dict[str, Any]) -> TransformerForConditionalGeneration:
    model = TransformerForConditionalGeneration(TransformerConfig.from_dict(checkpoint["hf_config"]))
    state = {
        name.removeprefix(MODEL_PREFIX): tensor
        for name, tensor in checkpoint["state_dict"].items()
        if name.startswith(MODEL_PREFIX)
    }
    model.load_state_dict(state, strict=False)  # tied weights appear under one name only
    model.tie_weights()
    if "generation_config" in checkpoint:
        model.generation_config.update(**checkpoint["generation_config"])
    return model.eval()


def average_checkpoints(paths: list[str | Path]) -> dict[str, Any]:
    """The element-wise mean of the float weights of several checkpoints (computed in float64); everything else is
    taken from the last one."""
    if not paths:
        raise ValueError("Checkpoint averaging needs at least one checkpoint.")
    checkpoints = [load_checkpoint(path) for path in paths]
    averaged = dict(checkpoints[-1])
    averaged["state_dict"] = {}
    for name, last in checkpoints[-1]["state_dict"].items():
        if last.is_floating_point():
            total = sum(checkpoint["state_dict"][name].double() for checkpoint in checkpoints)
            averaged["state_dict"][name] = (total / len(checkpoints)).to(last.dtype)
        else:
            averaged["state_dict"][name] = last
    return averaged


def last_checkpoints(folder: str | Path, count: int) -> list[Path]:
    """The `count` most recent step checkpoints in `folder` (by global step), oldest first."""
    candidates = [path for path in Path(folder).glob("*.ckpt") if not path.stem.startswith(("last", "on_exception"))]
    # Memory-mapped: only the step is read here, the weights are read once, by the averaging.
    steps = {
        path: torch.load(path, map_location="cpu", weights_only=True, mmap=True)["global_step"] for path in candidates
    }
    chosen = sorted(candidates, key=steps.get)[-count:]
    if len(chosen) < count:
        raise ValueError(f"Asked to average {count} checkpoints but {folder} holds {len(chosen)}: {chosen}.")
    return chosen


def export(checkpoint: dict[str, Any], folder: str | Path, **card_info: Any) -> Path:
    """Write the Hugging Face folder: model weights and config with its code (`auto_map`), the translation pipeline,
    the tokenizer, the generation config and the model card (`card_info`: the keyword arguments of
    `write_model_card`, such as `repo_id` and `results`)."""
    folder = Path(folder)
    model = model_from_checkpoint(checkpoint)
    TranslationPipeline(model=model, tokenizer=tokenizer_from_checkpoint(checkpoint)).save_pretrained(folder)
    write_model_card(folder, checkpoint, **card_info)
    return folder


def export_marian(checkpoint: dict[str, Any], folder: str | Path, **card_info: Any) -> Path:
    """Write a folder that stock transformers loads as `MarianMTModel` (no remote code), with the tokenizer and the
    model card (`card_info`: the keyword arguments of `write_model_card`)."""
    folder = Path(folder)
    to_marian(model_from_checkpoint(checkpoint)).save_pretrained(folder)
    tokenizer_from_checkpoint(checkpoint).save_pretrained(folder)
    write_model_card(folder, checkpoint, format="marian", **card_info)
    return folder


def export_marian_from_folder(source: str | Path, folder: str | Path, repo_id: str | None = None) -> Path:
    """`export_marian` for a folder written by `export`: its card, if it has one, is rendered for Marian."""
    folder = Path(folder)
    to_marian(TransformerForConditionalGeneration.from_pretrained(source)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(source).save_pretrained(folder)
    rewrite_model_card(source, folder, format="marian", repo_id=repo_id)
    return folder

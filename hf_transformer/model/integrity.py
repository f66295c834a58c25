"""Checks that inputs and stored weights are usable, with errors that name the problem and the fix instead of an index
error deep inside torch. Saved model folders carry this file with their remote code (the modeling file imports it
relatively)."""

import os
from collections.abc import Iterable

import torch
from safetensors import SafetensorError
from transformers.utils import SAFE_WEIGHTS_NAME


def non_finite_tensors(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """The names of the floating-point tensors that hold a NaN or an infinity (tensors on the meta device, which hold
    no values, are skipped)."""
    named = [(name, tensor) for name, tensor in named_tensors if tensor.is_floating_point() and not tensor.is_meta]
    if not named:
        return []
    # One read from the device for all tensors: a check per tensor would wait for the GPU hundreds of times.
    finite = torch.stack([tensor.isfinite().all().to(named[0][1].device) for _, tensor in named]).tolist()
    return [name for (name, _), ok in zip(named, finite, strict=True) if not ok]


def check_token_ids(
    input_ids: torch.Tensor,
    vocab_size: int,
    ignore_index: int | None = None,
    name: str = "input_ids",
    training: bool = False,
) -> None:
    """Raise a readable error for an empty batch or ids outside [0, vocab_size) (other than `ignore_index`). Skipped
    under `torch.compile`, whose graphs cannot raise on values, and for a model `training` on a GPU: there the check
    would wait for the device at every step, and the data pipeline checks the ids once, on the CPU (this package's
    collate does). On a CPU it costs no wait, so a training loop of your own still gets this error."""
    if torch.compiler.is_compiling() or (training and input_ids.device.type != "cpu"):
        return
    if input_ids.numel() == 0:
        raise ValueError(
            f"{name} has shape {tuple(input_ids.shape)}: a batch needs at least one sequence of at least one token "
            "(the tokenizer saved with the model encodes even an empty string as '</s>')."
        )
    out_of_range = ((input_ids < 0) | (input_ids >= vocab_size)) & (input_ids != ignore_index)
    if out_of_range.any():
        bad = input_ids[out_of_range].unique()[:5].tolist()
        if bad[0] < 0 and ignore_index is not None:  # no tokenizer makes negative ids: padding marked another way
            fix = f"mark the positions that the loss ignores with {ignore_index}, not {bad[0]}"
        elif bad[0] < 0:
            fix = "token ids are never negative: pad with the tokenizer's pad_token_id, marked 0 in attention_mask"
        else:
            fix = (
                "the input was encoded with a tokenizer whose vocabulary does not match this model: use the tokenizer "
                "saved with the model, or call model.resize_token_embeddings(len(tokenizer))"
            )
        raise ValueError(f"Token ids {bad} are outside the vocabulary [0, {vocab_size}) in {name}: {fix}.")


def check_attention_mask(
    attention_mask: torch.Tensor | None, expected_shape: tuple[int | torch.Tensor, ...], name: str, masked: str
) -> None:
    """Raise a readable error when a 2-D attention mask is not [batch, length] of the tokens it masks (`masked`):
    otherwise attention fails deep inside torch, or masks the wrong positions without an error. 4-D masks, prepared by
    the caller, pass unchecked, and so does a length that is a tensor (a static cache's), whose read would make every
    decoding step wait for the device."""
    if attention_mask is None or attention_mask.dim() != 2 or torch.compiler.is_compiling():
        return
    if any(isinstance(size, torch.Tensor) for size in expected_shape):
        return
    expected = tuple(expected_shape)
    if tuple(attention_mask.shape) != expected:
        raise ValueError(
            f"{name} has shape {tuple(attention_mask.shape)}, but {masked} has shape {expected} ([batch, length]): a "
            "2-D attention mask holds one entry per token (1 = token, 0 = padding). Pass the attention mask that the "
            "tokenizer returned with these ids."
        )


def check_labels(labels: torch.Tensor, decoder_inputs: torch.Tensor) -> None:
    """Raise a readable error when the decoder input (ids or embeddings) is not of the labels' [batch, length]."""
    if decoder_inputs.shape[:2] != labels.shape:
        raise ValueError(
            f"labels has shape {tuple(labels.shape)}, but the decoder input has shape "
            f"{tuple(decoder_inputs.shape[:2])}: the loss scores the decoder output at each position against the "
            "label there. Pass decoder_input_ids of the labels' shape, or leave them out to derive them from labels."
        )


def check_positions(length: int | torch.Tensor, max_positions: int, sequence: str) -> None:
    """Raise a readable error when `sequence` ("the source" or "the target") would reach past the model's positions.
    Skipped under `torch.compile` (with a static cache the length is a tensor)."""
    if torch.compiler.is_compiling() or length <= max_positions:
        return
    fix = (
        "truncate it (tokenizer(..., truncation=True, max_length=...))"
        if sequence == "the source"
        else "when generating, lower max_new_tokens or max_length (by default generation stops in time); when "
        "training, truncate the labels"
    )
    raise ValueError(
        f"{sequence.capitalize()} reaches {int(length)} tokens, more than the model's max_position_embeddings="
        f"{max_positions}: {fix}, or train a model with more positions."
    )


class VerifiedLoading:
    """`from_pretrained` that names the source when its weights file cannot be read and refuses weights that hold a
    NaN or an infinity (a file whose bytes were overwritten loads without an error). Mixed into the model classes,
    before `PreTrainedModel`."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike | None, *args, **kwargs):
        source = pretrained_model_name_or_path
        if source is not None and os.path.isfile(os.path.join(source, SAFE_WEIGHTS_NAME)):
            source = os.path.join(source, SAFE_WEIGHTS_NAME)
        try:
            loaded = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        except SafetensorError as error:
            raise OSError(f"Cannot read the weights in {source}, a truncated or corrupt file: {error}") from error
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # (model, loading_info) when asked for both
        non_finite = non_finite_tensors(model.named_parameters())
        if non_finite:
            raise ValueError(
                f"The weights in {source or 'the state_dict'} hold NaN or infinite values ({', '.join(non_finite[:3])}"
                "...): the file is corrupt, or was saved from a run that diverged. Export it again from a good "
                "checkpoint."
            )
        return loaded

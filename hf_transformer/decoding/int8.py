"""Decoding on a CPU with int8 weights: every linear layer of the model (attention projections, feed-forward layers and
the output projection onto the vocabulary) holds its weights in int8, one scale per output row, and quantizes its
input on the fly at each call (dynamic quantization, PyTorch's `quantize_dynamic` on the fbgemm/x86 kernels).
Embeddings, LayerNorm and the attention itself stay in float32.

This is the `int8` switch of `translate()`, `TranslationEngine`, `hf-transformer translate --int8` and `serve --int8`,
and what a folder exported with `--int8` asks of whoever loads it (`INT8_KEY` in its generation_config.json; its
weights stay float32, so stock transformers loads it as it loads any other). Its translations are close to the float32
model's, not equal: the rounding of the weights moves the scores a little, which decides some near ties of the search.

`torch.ao.quantization` is public and kept in the torch this package installs, though PyTorch marks it deprecated in
favour of torchao. torchao's int8 dynamic quantization (0.18) was tried in its place for issue 96 and was slower on
the CPU, and it would be one more dependency, which prints failed loads of its GPU kernels on import.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn
from transformers import GenerationMixin

from ..errors import ConfigError
from .ensemble import Ensemble

# The generation_config.json field of a folder exported for int8 decoding (`hf-transformer export --int8`).
INT8_KEY = "int8"


def int8_requested(model: GenerationMixin | Ensemble) -> bool:
    """Whether the model's generation config asks for int8 decoding (a folder exported with `--int8`)."""
    return bool(getattr(model.generation_config, INT8_KEY, False))


def is_int8(model: nn.Module) -> bool:
    """Whether `model`'s linear layers already hold int8 weights (`quantize_int8`'s output)."""
    return any(isinstance(module, torch.ao.nn.quantized.dynamic.Linear) for module in model.modules())


def quantize_int8(model: GenerationMixin | Ensemble, inplace: bool = False) -> GenerationMixin | Ensemble:
    """`model` (or every member of an `Ensemble`) with int8 weights in its linear layers, for decoding on a CPU.
    Without `inplace`, a copy: `model` stays as it was. A model already in int8 is returned as it is. The result
    decodes only (no training) and only on the CPU: a model elsewhere is refused, naming the fix."""
    if isinstance(model, Ensemble):
        members = [quantize_int8(member, inplace) for member in model.models]
        return Ensemble(members, average=model.average, names=model.names)
    if is_int8(model):
        return model
    if model.device.type != "cpu":
        raise ConfigError(
            f"int8 decoding runs on the CPU, and this model is on {model.device}: leave int8 off there (a GPU decodes "
            "fast in float32 or bfloat16), or move the model to the CPU"
        )
    if not inplace:
        model = copy.deepcopy(model)
    with warnings.catch_warnings():
        # Both say that torch.ao.quantization will make way for torchao, which is slower on CPUs (see above): the
        # user of int8 decoding has nothing to act on.
        warnings.filterwarnings("ignore", message="torch.ao.quantization is deprecated", category=DeprecationWarning)
        warnings.filterwarnings(
            "ignore", message="torch.quantize_per_tensor, torch.quantize_per_channel", category=UserWarning
        )
        torch.ao.quantization.quantize_dynamic(
            model.eval(),
            {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig},
            dtype=torch.qint8,
            inplace=True,
        )
    model.register_forward_pre_hook(refuse_labels, with_kwargs=True)
    return model


def refuse_labels(model: nn.Module, args: tuple, kwargs: dict) -> None:
    """An int8 model's output projection has no weight tensor for the loss to read: say so rather than fail inside."""
    if kwargs.get("labels") is not None:
        raise ConfigError(
            "this model holds int8 weights for decoding (quantize_int8) and computes no loss: pass labels to the "
            "float32 model, and quantize it for decoding after"
        )


__all__ = ["INT8_KEY", "int8_requested", "is_int8", "quantize_int8"]

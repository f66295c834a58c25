"""Checks that stored weights are usable. Saved model folders carry this file with their remote code (the modeling
file imports it relatively)."""

from collections.abc import Iterable

import torch


def non_finite_tensors(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """The names of the floating-point tensors that hold a NaN or an infinity (tensors on the meta device, which hold
    no values, are skipped)."""
    return [
        name
        for name, tensor in named_tensors
        if tensor.is_floating_point() and not tensor.is_meta and not tensor.isfinite().all()
    ]

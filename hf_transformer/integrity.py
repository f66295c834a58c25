"""Checks that stored weights are usable. Saved model folders carry this file with their remote code (the modeling
file imports it relatively)."""

from collections.abc import Iterable

import torch


def non_finite_tensors(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """The names of the floating-point tensors that hold a NaN or an infinity (tensors on the meta device, which hold
    no values, are skipped)."""
    named = [(name, tensor) for name, tensor in named_tensors if tensor.is_floating_point() and not tensor.is_meta]
    if not named:
        return []
    # One read from the device for all tensors: a check per tensor would wait for the GPU hundreds of times.
    finite = torch.stack([tensor.isfinite().all().to(named[0][1].device) for _, tensor in named]).tolist()
    return [name for (name, _), ok in zip(named, finite, strict=True) if not ok]

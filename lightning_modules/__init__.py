"""Lightning components of hf-transformer: the data module, the training module and the `hf-transformer` command."""

import importlib

__all__ = ["TranslationDataModule", "TranslationModule"]
_HOMES = {"TranslationDataModule": ".data", "TranslationModule": ".module"}


def __getattr__(name: str):
    # Imported on first use, so that `hf-transformer --help` does not wait for Lightning and torch.
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Lightning components of hf-transformer."""

from .data import TranslationDataModule

__all__ = ["TranslationDataModule"]

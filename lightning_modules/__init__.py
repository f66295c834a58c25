"""Lightning components of hf-transformer: the data module, the training module and the `hf-transformer` command."""

from .data import TranslationDataModule
from .module import TranslationModule

__all__ = ["TranslationDataModule", "TranslationModule"]

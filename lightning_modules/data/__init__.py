"""The data of a run: `TranslationDataModule` (`datamodule`) reads parallel text from its sources (`sources`: Hub
datasets, local files; `synthetic`: the demo's task), trains or loads the tokenizer (`tokenization`) and batches the
pairs under a token budget (`batching`)."""

from .datamodule import TranslationDataModule

__all__ = ["TranslationDataModule"]

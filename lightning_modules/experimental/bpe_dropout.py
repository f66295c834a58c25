"""BPE-dropout (Provilkov et al., 2020, "BPE-Dropout: Simple and Effective Subword Regularization"): the training
pairs are segmented anew on each pass, each merge of the vocabulary skipped with a probability, so that the model sees
a word in several segmentations ("▁orange" also as "▁or an ge"). At the Multi30k recipe's budget its two seeds scored
highest on test_2016_flickr but lost on validation, which chooses (docs/experiments.md): `BPEDropoutDataModule` is
chosen by class path, the main data module knows nothing of it."""

import functools
from collections.abc import Callable
from typing import Any

from tokenizers import Tokenizer, models

from hf_transformer.errors import DataError

from ..data import TranslationDataModule
from ..data.tokenization import encode_ids


class BPEDropoutDataModule(TranslationDataModule):
    """`TranslationDataModule` whose streamed training pairs are segmented with BPE-dropout: each pass over the
    training split encodes it anew, skipping each merge with probability `bpe_dropout`, and plans its batches on those
    segmentations, so that `max_tokens` holds; validation and test keep all merges. It needs `streaming`, which encodes
    pairs as it reads them (a prepared split's batches are planned once, on its full merges). The draws come from the
    tokenizers library, which takes no seed: two runs differ, and a resumed run reads its pass again to the saved
    position with new segmentations.

        data:
          class_path: lightning_modules.experimental.BPEDropoutDataModule
          init_args: {bpe_dropout: 0.1, streaming: true, ...}

    Args:
        bpe_dropout: the probability of skipping each merge (0.1 in their paper).
        **kwargs: the arguments of `TranslationDataModule`.
    """

    def __init__(self, bpe_dropout: float = 0.1, **kwargs: Any) -> None:
        if not 0 < bpe_dropout < 1:
            raise DataError(
                f"data.bpe_dropout={bpe_dropout} is not a probability in (0, 1): use e.g. 0.1 (without BPE-dropout, "
                "the data module is lightning_modules.TranslationDataModule)"
            )
        if not kwargs.get("streaming"):
            raise DataError(
                f"data.bpe_dropout={bpe_dropout} segments the training pairs anew on each pass and plans the batches "
                "on those segmentations, which a stream does as it reads them: set data.streaming to true (a folder "
                "of files streams as a Hub dataset does)"
            )
        super().__init__(**kwargs)
        self.bpe_dropout = bpe_dropout
        model = self.tokenizer.backend_tokenizer.model
        if not isinstance(model, models.BPE):
            raise DataError(
                f"data.bpe_dropout={bpe_dropout} skips merges of a BPE vocabulary; the tokenizer "
                f"{self.tokenizer.name_or_path or ''} is a {type(model).__name__} model: use "
                "lightning_modules.TranslationDataModule, or let the data module train a BPE tokenizer "
                "(data.tokenizer: null)"
            )

    def training_encoder(self) -> Callable[[list[str]], list[list[int]]]:
        """The tokenizer's ids with BPE-dropout: each text drawn a segmentation of its own, at every encoding."""
        tokenizer = Tokenizer.from_str(self.tokenizer.backend_tokenizer.to_str())
        tokenizer.model.dropout = self.bpe_dropout
        return functools.partial(encode_ids, tokenizer)

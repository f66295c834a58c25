"""The tokenizer: load an existing one, or train a joint BPE vocabulary on the training pairs (as in the paper)."""

import functools
import json
import os
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from hf_transformer.errors import DataError

# Beside the tokenizer files: the data and settings a trained tokenizer was made from.
TRAINED_ON_FILE = "trained_on.json"
# Ids 0..3 in this order: the model config and the collator rely on them.
PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = {"pad_token": PAD, "bos_token": BOS, "eos_token": EOS, "unk_token": UNK}


# What `load_tokenizer` encodes to check that an encoding ends with the eos token.
_EOS_CHECK_TEXT = "A dog runs."

# Tokenizer training says how far it has read every this many sentences.
PROGRESS_SENTENCES = 1_000_000


def train_bpe_tokenizer(
    texts: Iterable[list[str]], vocab_size: int, min_frequency: int, total: int | None = None
) -> PreTrainedTokenizerFast:
    """Train one BPE vocabulary shared by source and target on batches of sentences.

    NFKC normalisation and a Metaspace pre-tokenizer make `decode(encode(s))` give back `s` for ordinary text.
    Punctuation marks are tokens of their own, as the Moses tokenization that BPE vocabularies are usually learnt on
    makes them: otherwise "Büsche." and "Büsche" share no token, and a 10,000-token Multi30k vocabulary spent 1,546
    tokens on words glued to a mark ("▁Blumen.", "▁Frau,"). Digits are split one by one so that numbers are spelled
    out digit by digit (the synthetic task needs it; real text loses little). Encoding appends `</s>` and no `<s>`:
    the model starts decoding from `<s>` itself. Every `PROGRESS_SENTENCES` sentences read it says how far it is (of
    `total`, where given).
    """
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation(), pre_tokenizers.Digits(individual_digits=True)]
    )
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[PAD, BOS, EOS, UNK], show_progress=False
    )
    sentences = 0

    def counted(batches: Iterable[list[str]]) -> Iterable[list[str]]:
        nonlocal sentences
        for batch in batches:
            if (sentences + len(batch)) // PROGRESS_SENTENCES > sentences // PROGRESS_SENTENCES:
                read = f"{sentences + len(batch):,}" + (f" of {total:,}" if total else "")
                rank_zero_info(f"BPE tokenizer: {read} sentences read, {time.monotonic() - started:.0f} s")
            sentences += len(batch)
            yield batch

    started = time.monotonic()
    tokenizer.train_from_iterator(counted(texts), trainer)
    rank_zero_info(
        f"BPE tokenizer trained: {tokenizer.get_vocab_size()} tokens from {sentences:,} sentences in "
        f"{time.monotonic() - started:.1f} s"
    )
    eos_id = tokenizer.token_to_id(EOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, eos_id)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **SPECIAL_TOKENS)


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerFast:
    """Load a fast tokenizer from a folder or the Hub; it must define a pad and an eos token, and end every encoding
    with the eos token."""
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise DataError(f"tokenizer {name_or_path!r} has no fast (Rust) version; give a folder with a tokenizer.json")
    missing = [name for name in ("pad_token", "eos_token") if getattr(tokenizer, name) is None]
    if missing:
        raise DataError(
            f"tokenizer {name_or_path!r} defines no {' and no '.join(missing)}: batches need both; "
            "add them to its tokenizer_config.json or let the data module train one (tokenizer: null)"
        )
    # Targets end where the tokenizer's post-processor appends </s>: without it the model never learns to stop.
    ids = encode_ids(tokenizer.backend_tokenizer, [_EOS_CHECK_TEXT])[0]
    if not ids or ids[-1] != tokenizer.eos_token_id:
        raise DataError(
            f"tokenizer {name_or_path!r} does not end an encoding with its eos token {tokenizer.eos_token!r} "
            f"(id {tokenizer.eos_token_id}): {_EOS_CHECK_TEXT!r} encodes as {ids}, so no target would end and the "
            "model would never learn to stop. Give its tokenizer.json a post_processor that appends the eos token "
            f'(TemplateProcessing, single: "$A {tokenizer.eos_token}"), or let the data module train one '
            "(data.tokenizer: null, and a data.tokenizer_dir that holds no tokenizer)"
        )
    return tokenizer


def model_vocabulary(tokenizer: PreTrainedTokenizerFast) -> dict[str, int]:
    """The model config fields that a model trained with `tokenizer` takes from it. Tokenizers without a bos token
    (T5, Marian) start decoding from the pad token."""
    start = tokenizer.pad_token_id if tokenizer.bos_token_id is None else tokenizer.bos_token_id
    return {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": start,
        "eos_token_id": tokenizer.eos_token_id,
        "decoder_start_token_id": start,
    }


def save_tokenizer(
    tokenizer: PreTrainedTokenizerFast, directory: str | Path, trained_on: dict[str, Any] | None = None
) -> None:
    """Save into `directory`, replacing each file atomically: ranks that write the same tokenizer at once are safe.
    `trained_on` (the data and settings it was trained from) is saved beside it, for `check_trained_on`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as staging:
        paths = list(tokenizer.save_pretrained(staging))
        if trained_on is not None:
            paths.append(Path(staging) / TRAINED_ON_FILE)
            paths[-1].write_text(json.dumps(trained_on, indent=2) + "\n")
        for path in paths:
            os.replace(path, directory / Path(path).name)


def check_trained_on(directory: str | Path, trained_on: dict[str, Any]) -> None:
    """Refuse to reuse the tokenizer saved in `directory` for data or settings other than those it was trained on:
    its vocabulary would not fit (a German corpus read with the demo's numbers tokenizer is a fifth `<unk>`)."""
    record = Path(directory) / TRAINED_ON_FILE
    if not record.is_file():
        rank_zero_warn(
            f"{directory} holds a tokenizer with no record of what it was trained on ({TRAINED_ON_FILE}, written "
            "since hf-transformer 0.2): it is used as it is; delete the folder if it belongs to other data"
        )
        return
    saved = json.loads(record.read_text())
    changed = {key: (saved.get(key), value) for key, value in trained_on.items() if saved.get(key) != value}
    if changed:
        differences = "; ".join(f"{key}: {old!r} then, {new!r} now" for key, (old, new) in changed.items())
        raise DataError(
            f"the tokenizer in {directory} was trained for other data ({differences}). Delete {directory} to train "
            "one for this data there, or set data.tokenizer_dir to another folder"
        )


def has_saved_tokenizer(directory: str | Path | None) -> bool:
    return directory is not None and (Path(directory) / "tokenizer.json").is_file()


def encode_ids(encoder: Tokenizer, texts: list[str]) -> list[list[int]]:
    """The token ids of each text, with the tokenizer's special tokens. `encode_batch_fast` leaves out the character
    offsets, which training does not use and `encode_batch` spends time on (`benchmarks/data_scale.py`)."""
    return [encoding.ids for encoding in encoder.encode_batch_fast(texts)]


@functools.lru_cache(maxsize=4)
def backend_tokenizer(state: str) -> Tokenizer:
    """The tokenizers `Tokenizer` of a JSON text (`to_str()`), built once per process and text: the data module hands
    its tokenizer to `datasets.map` processes as this text."""
    return Tokenizer.from_str(state)

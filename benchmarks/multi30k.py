"""The Multi30k data the benchmarks read: the folder named by MULTI30K_DIR and its gzipped {split}.{lang}.gz files."""

import gzip
import os
from pathlib import Path

# In a run's folder: each scored model's translations of each split (quality.py writes it, compare.py reads it).
TRANSLATIONS = "translations.json"


def multi30k_dir() -> str:
    """The folder in MULTI30K_DIR, or exit saying how to set it."""
    folder = os.environ.get("MULTI30K_DIR")
    if not folder or not Path(folder).is_dir():
        raise SystemExit("Set MULTI30K_DIR to the Multi30k folder of {split}.{lang}.gz files (shared/data/multi30k).")
    return folder


def read_split(split: str, lang: str) -> list[str]:
    """One sentence per line of {split}.{lang}.gz in the Multi30k folder."""
    with gzip.open(Path(multi30k_dir()) / f"{split}.{lang}.gz", "rt", encoding="utf-8") as lines:
        return [line.rstrip("\n") for line in lines]


def test_splits(source_lang: str, target_lang: str) -> list[str]:
    """The folder's test sets in both languages, test_2016_flickr first: Multi30k's later ones (test_2017_flickr,
    test_2017_mscoco, test_2018_flickr) are scored wherever a user's copy holds them."""
    folder = Path(multi30k_dir())
    splits = {path.name.removesuffix(f".{source_lang}.gz") for path in folder.glob(f"test_*.{source_lang}.gz")}
    return sorted(split for split in splits if (folder / f"{split}.{target_lang}.gz").exists())

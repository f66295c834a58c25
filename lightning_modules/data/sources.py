"""Read one split of parallel text from any supported source into a dataset of `source_text`/`target_text` pairs.

Sources: a folder of line-aligned text files `{split}.{lang}[.gz]` (the Multi30k layout) or of data files
`{split}.{jsonl,json,tsv,csv,parquet}[.gz]`; one data file, whose path may hold a `{split}` placeholder; anything else
goes to `datasets.load_dataset(name, config)`: a Hub dataset id, or a local folder in a layout `datasets` knows.
Table-like data holds either a `translation: {lang: text}` column or one text column per language.
"""

import codecs
import csv
import gzip
import io
import re
import shutil
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, TypeVar

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import (
    Dataset,
    DatasetDict,
    DownloadMode,
    Features,
    Translation,
    Value,
    concatenate_datasets,
    load_dataset,
)
from datasets.exceptions import DatasetGenerationError
from datasets.fingerprint import Hasher
from filelock import FileLock
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from hf_transformer.errors import DataError, DiskFull, UserError, is_disk_full

# Builder name and options per file extension. csv/tsv: every field is text ("NA", "null" and blank lines included).
_TEXT_CSV_OPTIONS = {"keep_default_na": False, "na_filter": False, "skip_blank_lines": False}
TABLE_FORMATS = {
    "jsonl": ("json", {}),
    "json": ("json", {}),
    "parquet": ("parquet", {}),
    # Without QUOTE_NONE, a line that starts with a quote swallows the lines after it.
    "tsv": ("csv", {"sep": "\t", "quoting": csv.QUOTE_NONE, **_TEXT_CSV_OPTIONS}),
    "csv": ("csv", _TEXT_CSV_OPTIONS),
}
_TEXT_FEATURES = Features({"text": Value("string")})
# The UTF-8 byte-order mark that some editors (Windows Notepad, Excel) write at the start of a file.
_BYTE_ORDER_MARK = codecs.BOM_UTF8.decode()
_LONE_CARRIAGE_RETURN = re.compile(rb"\r(?!\n)")
# The name of the temporary file that `datasets` writes a cache file into (`tempfile.NamedTemporaryFile`'s).
_LEFT_BY_A_KILLED_WRITE = re.compile(r"tmp[a-z0-9_]{8}")
# The first bytes of a file in which a NUL byte marks binary data (git reads as many).
_BINARY_CHECK_BYTES = 8000
# What reading a .gz file that is cut short, damaged or no gzip data raises.
_GZIP_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)
# Rows per record batch of the `datasets` caches written here (a split read from files) and by the data module (a
# tokenized split). A run holds about 4 KiB of Arrow metadata in memory for each record batch it maps: at `datasets`'
# default of 1,000 rows that was 86 MiB for a cache of 20 M pairs; 10,000 rows cost a tenth of that, for 10,000 rows
# buffered per process while a cache is written.
ROWS_PER_CACHE_BATCH = 10_000
# The names a local folder may give the splits that Hub datasets call `validation` and `test`: a corpus's own words,
# and Multi30k's raw release (`val`, and `test_2016_flickr`, the test set that its Hub copies call `test`).
SPLIT_SYNONYMS = {"validation": ("val", "valid", "dev"), "test": ("test_2016_flickr",)}
# What `load_dataset` does to build a dataset whose cache is damaged: generate it again from the data files (or the
# downloads of a Hub dataset) that the cache holds.
_REBUILD = DownloadMode.REUSE_CACHE_IF_EXISTS
CachedData = TypeVar("CachedData", Dataset, DatasetDict)
# The fix for a language not in the data: the data module fields that name languages.
_CHOOSE_LANGUAGES = "Choose data.source_lang and data.target_lang among them"


def load_split(dataset: str, config: str | None, split: str, source_lang: str, target_lang: str) -> Dataset:
    """The pairs of one split of `dataset`, as a dataset with the columns `source_text` and `target_text`."""
    path = Path(dataset)
    if "{split}" in dataset:
        return _load_table_file(Path(dataset.replace("{split}", split)), source_lang, target_lang)
    if path.is_file():
        return _load_single_file(path, split, source_lang, target_lang)
    if path.is_dir() and has_top_level_files(path):
        return _load_from_folder(path, split, source_lang, target_lang)
    return _load_with_datasets(dataset, config, split, source_lang, target_lang)


def check_source(dataset: str) -> None:
    """Fail at once, before any work, when `dataset` names a local path that does not exist. Hub ids ("name",
    "namespace/name") are checked when loaded."""
    path = Path(dataset).expanduser()
    looks_local = dataset.startswith((".", "/", "~")) or "{split}" in dataset or dataset.count("/") > 1
    looks_local |= path.name.removesuffix(".gz").rsplit(".", 1)[-1] in TABLE_FORMATS
    if "{split}" in dataset:
        path = path.parent  # the split's files are checked when loaded
    if looks_local and not path.exists():
        raise DataError(
            f"dataset {dataset!r}: {path} does not exist. Give a folder of {{split}}.<lang>[.gz] or "
            f"{{split}}.<{','.join(TABLE_FORMATS)}> files, a data file, 'synthetic', or a Hub dataset id "
            "(data.dataset in the config or --data.dataset)"
        )


def _load_single_file(path: Path, split: str, source_lang: str, target_lang: str) -> Dataset:
    check_single_file_split(path, split)
    return _load_table_file(path, source_lang, target_lang)


def check_single_file_split(path: Path, split: str) -> None:
    """A lone file is a split of its own name (train.jsonl); other splits need the `{split}` placeholder."""
    if path.name.split(".")[0] != split:
        raise DataError(
            f"split {split!r}: the dataset is the single file {path}, which holds only the split "
            f"{path.name.split('.')[0]!r}; give a folder of {{split}}.<ext> files or a path with a {{split}} "
            f"placeholder (e.g. {path.parent / ('{split}' + ''.join(path.suffixes))})"
        )


def has_top_level_files(folder: Path) -> bool:
    """Our flat layout puts data files at the top; a `datasets` folder has only its README.md there, data below."""
    return any(
        path.is_file() and path.name != "README.md" and not path.name.startswith(".") for path in folder.iterdir()
    )


def _split_files(folder: Path, split: str) -> dict[str, Path]:
    """The files of `split` in `folder` by what follows the split name: a language or a table format."""
    files = {}
    for path in sorted(folder.glob(f"{split}.*")):
        kind = path.name[len(split) + 1 :].removesuffix(".gz")
        if path.is_file() and kind and "." not in kind:
            files[kind] = path
    return files


def find_split_files(folder: Path, split: str) -> dict[str, Path]:
    """The files of `split` in `folder` by what follows the split name (a language or a table format), or those of
    the first of its other names (`SPLIT_SYNONYMS`) that the folder has."""
    files = _split_files(folder, split)
    for other_name in SPLIT_SYNONYMS.get(split, ()) if not files else ():
        files = _split_files(folder, other_name)
        if files:
            rank_zero_info(f"split {split!r}: reading {folder}/{other_name}.* (no {split}.* there)")
            break
    return files


def _load_from_folder(folder: Path, split: str, source_lang: str, target_lang: str) -> Dataset:
    files = split_files(folder, split, source_lang, target_lang)
    if len(files) == 1:
        return _load_table_file(files[0], source_lang, target_lang)
    return _load_text_pair(*files, source_lang, target_lang)


def split_files(folder: Path, split: str, source_lang: str, target_lang: str) -> tuple[Path, ...]:
    """The files of `split` in a folder of our flat layout, read ahead or streamed alike: its table file, or its
    source and target text files; an error naming what was looked for and what is there instead."""
    files = find_split_files(folder, split)
    if not files:
        raise DataError(
            f"split {split!r} not found: looked for {folder}/{split}.<lang>[.gz] (one text file per language) and "
            f"{folder}/{split}.<{','.join(TABLE_FORMATS)}>[.gz]; splits present: {_splits_in(folder) or 'none'}. "
            "Set train_split/validation_split/test_split to the names of the files"
        )
    tables = [path for kind, path in files.items() if kind in TABLE_FORMATS]
    if tables:
        return (tables[0],)
    for lang in (source_lang, target_lang):
        if lang not in files:
            raise DataError(
                f"language {lang!r} not in the data: looked for {folder}/{split}.{lang}[.gz]; languages present for "
                f"split {split!r}: {', '.join(files)}. {_CHOOSE_LANGUAGES}"
            )
    return files[source_lang], files[target_lang]


def _splits_in(folder: Path) -> str:
    return ", ".join(sorted({path.name.split(".")[0] for path in folder.iterdir() if "." in path.name}))


def _load_text_pair(source_path: Path, target_path: Path, source_lang: str, target_lang: str) -> Dataset:
    """Two line-aligned plain-text files as one dataset with a column per language."""
    source = _load_lines(source_path).rename_column("text", source_lang)
    target = _load_lines(target_path).rename_column("text", target_lang)
    if len(source) != len(target):
        raise DataError(
            f"{source_path} has {len(source)} lines but {target_path} has {len(target)}: the files of a split must "
            "be line-aligned (line i of one translates line i of the other); fix or re-export the shorter file"
        )
    pairs = concatenate_datasets([source, target], axis=1)
    return to_pairs(pairs, source_lang, target_lang, origin=f"{source_path} + {target_path}")


def _load_lines(path: Path) -> Dataset:
    """A plain-text file as a `text` column, one row per line (`text_lines`). `datasets`' text reader, ten times
    faster than a Python loop, reads with universal newlines, which end a line at a lone "\r" too (see `text_lines`):
    it reads the files that have none, and the others are read line by line, their cache keyed by the file's path,
    size and modification time, as `datasets` keys the caches of its readers."""
    return _read_file(path, "text", lambda: _read_lines(path))


def _read_lines(path: Path) -> Dataset:
    if not _has_lone_carriage_return(path):
        return _without_byte_order_marks(path, _load_dataset_file("text", path, features=_TEXT_FEATURES))
    status = path.stat()
    fingerprint = Hasher.hash([_text_rows, str(path.resolve()), status.st_size, status.st_mtime_ns])

    def read(rebuild: bool) -> Dataset:
        if rebuild:  # `from_generator` reuses what its cache holds: remove it (its folder is named by the fingerprint)
            for folder in Path(datasets.config.HF_DATASETS_CACHE).glob(f"generator/default-fingerprint={fingerprint}"):
                shutil.rmtree(folder)
        return Dataset.from_generator(
            _text_rows,
            features=_TEXT_FEATURES,
            gen_kwargs={"path": str(path)},
            fingerprint=fingerprint,
            writer_batch_size=ROWS_PER_CACHE_BATCH,
        )

    return rebuilt_if_damaged(read, str(path))


def _has_lone_carriage_return(path: Path) -> bool:
    """Whether the file holds a "\r" that ends no "\r\n" (read 16 MiB at a time, the search in C)."""
    carried = b""
    with _open_binary(path) as file:
        while chunk := file.read(16 * 2**20):
            chunk = carried + chunk
            carried = b"\r" if chunk.endswith(b"\r") else b""  # its "\n" may start the next chunk
            if _LONE_CARRIAGE_RETURN.search(chunk, 0, len(chunk) - len(carried)):
                return True
    return bool(carried)


def _without_byte_order_marks(path: Path, lines: Dataset) -> Dataset:
    """A byte-order mark at the start of the file (or of a line, in files concatenated from such files) is no part of
    the text: left in, it became a token of the vocabulary. The csv and json readers drop it themselves."""
    with _open_binary(path) as file:
        if file.read(len(codecs.BOM_UTF8)) != codecs.BOM_UTF8:
            return lines
    return rebuilt_if_damaged(
        lambda rebuild: lines.map(
            _without_byte_order_mark,
            batched=True,
            batch_size=ROWS_PER_CACHE_BATCH,  # a batched map writes a record batch per batch it maps
            writer_batch_size=ROWS_PER_CACHE_BATCH,
            load_from_cache_file=not rebuild,
            desc="Removing the byte-order mark",
        ),
        str(path),
    )


def _without_byte_order_mark(batch: dict[str, list[str]]) -> dict[str, list[str]]:
    return {"text": [line.removeprefix(_BYTE_ORDER_MARK) for line in batch["text"]]}


def _text_rows(path: str) -> Iterator[dict[str, str]]:
    for line in text_lines(Path(path)):
        yield {"text": line}


def text_lines(path: Path) -> Iterator[str]:
    """The lines of a UTF-8 text file, gzipped or not, split at "\n" only (the "\r" of a "\r\n" line end removed).

    Universal newlines (Python's text mode, and `datasets`' text reader) also end a line at a lone "\r": a stray one
    inside a sentence made it two lines, and every later pair of line-aligned files was shifted by one, unnoticed
    where the other file had a stray "\r" too. Here it stays part of its line. A byte-order mark at the start of a line
    (of the file, or of one of the files that were concatenated into it) is no part of the text: left in, it became a
    token of the vocabulary (the csv and json readers drop it themselves). A file that is not UTF-8 text, or a damaged
    .gz, is named with the line where it fails, as `named_read_errors` names it for the other readers."""
    try:
        with _open_binary(path) as binary, io.TextIOWrapper(binary, encoding="utf-8", newline="\n") as text:
            for line in text:
                yield line.removeprefix(_BYTE_ORDER_MARK).removesuffix("\n").removesuffix("\r")
    except UnicodeDecodeError as error:
        raise (_undecodable(path) or DataError(f"{path} is not UTF-8 text ({error})")) from error
    except _GZIP_ERRORS as error:
        raise _broken_gzip(path, error) from error


def _load_table_file(path: Path, source_lang: str, target_lang: str) -> Dataset:
    kind = path.name.removesuffix(".gz").rsplit(".", 1)[-1]
    if kind not in TABLE_FORMATS:
        raise DataError(f"{path}: unknown data file type {kind!r}; use one of {', '.join(TABLE_FORMATS)} (or .gz)")
    if not path.is_file():
        raise DataError(f"data file not found: looked for {path}")
    builder, options = TABLE_FORMATS[kind]
    # The json builder stores bytes that are not UTF-8 without complaint (the other readers refuse them): only its
    # rows are checked string by string, a scan of the whole text that would slow every later run of large data.
    data = _read_file(path, builder, lambda: _load_dataset_file(builder, path, **options))
    return to_pairs(data, source_lang, target_lang, origin=str(path), files=[path], check_utf8=builder == "json")


def _load_dataset_file(builder: str, path: Path, **options) -> Dataset:
    return rebuilt_if_damaged(
        lambda rebuild: load_dataset(
            builder,
            data_files=str(path),
            split="train",
            writer_batch_size=ROWS_PER_CACHE_BATCH,
            download_mode=_REBUILD if rebuild else None,
            **options,
        ),
        str(path),
    )


def rebuilt_if_damaged(load: Callable[[bool], CachedData], what: str) -> CachedData:
    """`load(False)`, which reads `what` from the `datasets` cache where it holds it; where a file of that cache cannot
    be read (a copy or a disk cut it short: pyarrow raised its ArrowInvalid, or its OSError, which has no errno where
    the OS's own errors have one), `load(True)`, which builds it again in its place, and a warning naming the cache. A
    data file that cannot be read fails the second time too, with its own error; a full disk is a `DiskFull` naming
    the cache."""
    with _disk_full_named(what):
        try:
            return load(False)
        except (pa.ArrowInvalid, OSError) as error:
            if isinstance(error, OSError) and (type(error) is not OSError or error.errno is not None):
                raise
            damaged = error
        rebuilt = load(True)
    data = next(iter(rebuilt.values())) if isinstance(rebuilt, DatasetDict) else rebuilt
    where = Path(data.cache_files[0]["filename"]).parent if data.cache_files else "memory"
    rank_zero_warn(f"{what}: its copy in the datasets cache was damaged ({damaged}); built it again in {where}")
    return rebuilt


@contextmanager
def _disk_full_named(what: str) -> Iterator[None]:
    """A full disk while `datasets` writes `what` into its cache, as one error naming the cache and the fix (it said
    "could not read" the data file, or ended in a traceback)."""
    try:
        yield
    except Exception as error:
        if not is_disk_full(error):
            raise
        cache = Path(datasets.config.HF_DATASETS_CACHE)
        free = shutil.disk_usage(cache if cache.is_dir() else cache.parent).free / 2**20
        raise DiskFull(
            f"no space left on the disk of the datasets cache {cache} (HF_DATASETS_CACHE) while writing {what} there "
            f"({free:,.0f} MiB free): free space there, or set HF_DATASETS_CACHE to a folder on another disk"
        ) from error


def _read_file(path: Path, builder: str, read: Callable[[], Dataset]) -> Dataset:
    """One local file read by `read` (a `datasets` builder, named `builder`), checked first and with its failures
    explained in terms of the file, as a stream of it is (`check_data_file`, `named_read_errors`)."""
    check_data_file(path)
    with named_read_errors(path, builder):
        return read()


def check_data_file(path: Path) -> None:
    """What reading a local data file checks before it starts, ahead (`load_split`) or as a stream (`stream_split`)
    alike: that the file exists, holds data, and is text (a parquet file aside) rather than binary data or UTF-16, in
    its first bytes (a NUL byte: binary data, as git and grep tell it; UTF-8 text holds none)."""
    if not path.is_file():
        raise DataError(f"data file not found: looked for {path}")
    try:
        with _open_binary(path) as file:
            head = file.read(_BINARY_CHECK_BYTES)
    except _GZIP_ERRORS as error:
        raise _broken_gzip(path, error) from error
    if not head:
        raise DataError(f"{path} is empty: a split needs at least one pair")
    if not path.name.removesuffix(".gz").endswith(".parquet") and (problem := _not_text(path, head)) is not None:
        raise problem


@contextmanager
def named_read_errors(path: Path, builder: str) -> Iterator[None]:
    """Failures of reading the local file `path` as `builder` (a `datasets` builder) inside the block, explained in
    terms of the file: a damaged .gz, bytes that are not UTF-8 (the line), a file that is not of its type. A read
    ahead raises them wrapped in a `DatasetGenerationError`, a stream as they are."""
    try:
        yield
    except UserError:
        raise
    except _GZIP_ERRORS as error:
        raise _broken_gzip(path, error) from error
    except (DatasetGenerationError, UnicodeDecodeError) as error:
        cause = error.__cause__ if isinstance(error, DatasetGenerationError) else error
        if isinstance(cause, UserError):
            raise cause from error
        if isinstance(cause, _GZIP_ERRORS):
            raise _broken_gzip(path, cause) from error
        if (problem := _undecodable(path)) is not None:  # binary or not UTF-8: a parse error would not say so
            raise problem from error
        raise DataError(f"could not read {path} as {builder}: {cause or error}") from error
    except pa.ArrowInvalid as error:  # the parquet builder reads the file's footer before it generates any rows
        if (problem := _undecodable(path)) is not None:
            raise problem from error
        raise DataError(
            f"could not read {path} as {builder} ({error}): write it again as a {builder} file, or give it the "
            "extension of its format"
        ) from error


@contextmanager
def writing_cache_of(data: Dataset) -> Iterator[None]:
    """Around `datasets` writing new cache files beside those of `data` (a map, a selection): one process of this
    package at a time (a lock in that folder), and none of the temporary files that such a write left behind when its
    process was killed or its disk was full (`tmp` and 8 characters, a `NamedTemporaryFile`, renamed into place when
    complete): while the lock is held, no other process of ours is writing one, and nothing else reads them."""
    if not data.cache_files:  # in memory: nothing is written
        yield
        return
    folder = Path(data.cache_files[0]["filename"]).parent
    with FileLock(folder / ".hf_transformer-writing.lock"):
        _remove_temporary_files(folder)
        try:
            yield
        finally:  # a write that failed (a full disk) leaves its temporary file too
            _remove_temporary_files(folder)


def _remove_temporary_files(folder: Path) -> None:
    for path in folder.iterdir():
        if _LEFT_BY_A_KILLED_WRITE.fullmatch(path.name) and path.is_file():
            path.unlink(missing_ok=True)


def _load_with_datasets(dataset: str, config: str | None, split: str, source_lang: str, target_lang: str) -> Dataset:
    """A Hub dataset (or a local folder in a layout `datasets` infers splits from)."""
    origin = f"dataset {dataset!r}" + (f" (config {config!r})" if config else "")
    try:
        splits = rebuilt_if_damaged(
            lambda rebuild: load_dataset(
                dataset, config, writer_batch_size=ROWS_PER_CACHE_BATCH, download_mode=_REBUILD if rebuild else None
            ),
            origin,
        )
    except Exception as error:  # datasets raises many types here; each means the same to the user
        raise DataError(
            f"could not load {origin}: not 'synthetic', not a file, not a folder with {split}.<lang>[.gz] or "
            f"{split}.<{','.join(TABLE_FORMATS)}> files, and `datasets.load_dataset` failed: {error}"
        ) from error
    if split not in splits:
        raise DataError(
            f"split {split!r} not in {origin}; its splits are {', '.join(splits)}. "
            "Set train_split/validation_split/test_split to them"
        )
    return to_pairs(splits[split], source_lang, target_lang, origin=f"{origin} split {split!r}")


def to_pairs(
    data: Dataset,
    source_lang: str,
    target_lang: str,
    origin: str,
    files: list[Path] | tuple[Path, ...] = (),
    check_utf8: bool = False,
) -> Dataset:
    """Select the two languages from a `translation` column or from per-language columns and check the text (with
    `check_utf8`, every string's bytes too)."""
    prefix, languages = "", list(data.column_names)
    feature = data.features.get("translation")
    if isinstance(feature, Translation | dict):
        prefix, languages = "translation.", list(feature.languages if isinstance(feature, Translation) else feature)
        data = data.flatten()
    for lang in (source_lang, target_lang):
        if lang not in languages:
            raise DataError(
                f"{origin}: language {lang!r} not in the data; languages present: {', '.join(languages)}. "
                + _CHOOSE_LANGUAGES
            )
    columns = {prefix + source_lang: "source_text", prefix + target_lang: "target_text"}
    data = data.select_columns(list(columns)).rename_columns(columns)
    if len(data) == 0:
        raise DataError(f"{origin} is empty: a split needs at least one pair")
    for column, lang in (("source_text", source_lang), ("target_text", target_lang)):
        data = _as_text(data, column, lang, origin, files, check_utf8)
    return data


def _as_text(
    data: Dataset, column: str, lang: str, origin: str, files: list[Path] | tuple[Path, ...], check_utf8: bool
) -> Dataset:
    """Numbers become text; missing values and (with `check_utf8`) bytes that are not UTF-8 are errors."""
    if data.features[column] != Value("string"):
        if not isinstance(data.features[column], Value):
            raise DataError(f"{origin}: field {lang!r} holds {data.features[column]}, not text")
        data = data.cast_column(column, Value("string"))
    values = data.data.column(column)
    if values.null_count:
        row = int(np.argmax(pc.is_null(values).to_numpy(zero_copy_only=False))) + 1
        raise DataError(
            f"{origin}: row {row} has no text for {lang!r} (null or missing field); "
            f"every row needs both languages: fix the row or remove it"
        )
    if not check_utf8:
        return data
    try:
        values.validate(full=True)
    except pa.ArrowInvalid as error:  # the json builder stores undecodable bytes without complaint
        for path in files:
            if (problem := _undecodable(path)) is not None:
                raise problem from error
        raise DataError(f"{origin}: field {lang!r} holds bytes that are not UTF-8 ({error})") from error
    return data


def _undecodable(path: Path) -> DataError | None:
    """The error naming the first line of `path` that is not UTF-8 text (binary data, UTF-16, another encoding, or a
    damaged .gz), or None if every line decodes. Parquet is binary by design: None."""
    if path.name.removesuffix(".gz").endswith(".parquet"):
        return None
    try:
        with _open_binary(path) as lines:
            if (problem := _not_text(path, lines.read(_BINARY_CHECK_BYTES))) is not None:
                return problem
            lines.seek(0)
            for number, line in enumerate(lines, start=1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as error:
                    return DataError(
                        f"{path}, line {number}: bytes {line[error.start : error.end]!r} at column {error.start + 1} "
                        "are not UTF-8; re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                    )
    except _GZIP_ERRORS as error:
        return _broken_gzip(path, error)
    return None


def _not_text(path: Path, head: bytes) -> DataError | None:
    """The error for a file whose first bytes (`head`) say that it is UTF-16 text or binary data, or None."""
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return DataError(
            f"{path} is UTF-16 text (what Windows calls Unicode); re-encode the file as UTF-8 (e.g. iconv -f utf-16 -t "
            "utf-8)"
        )
    if b"\0" in head:  # as git and grep tell binary files: text holds no NUL bytes, and re-encoding won't help
        line = head.count(b"\n", 0, head.index(b"\0")) + 1
        return DataError(
            f"{path} is binary data, not text (a NUL byte on line {line}). Give the split's text file (UTF-8, one "
            "sentence per line, or gzip-compressed text ending in .gz)"
        )
    return None


def _broken_gzip(path: Path, error: Exception) -> DataError:
    """The error for a .gz file that gzip cannot read to its end, naming the last line it could read."""
    if isinstance(error, gzip.BadGzipFile) and str(error).startswith("Not a gzipped file"):
        return DataError(
            f"{path} ends in .gz but holds no gzip data ({error}): rename it without .gz if it is plain text, or "
            "compress it with gzip"
        )
    lines = 0
    try:
        with gzip.open(path, "rb") as file:
            for _ in file:
                lines += 1
    except _GZIP_ERRORS:
        pass
    where = f"after line {lines}" if lines else "within its first line"
    return DataError(
        f"{path} is cut short or damaged {where} ({error}): copy or download it again (gzip -t {path} checks a file)"
    )


def _open_binary(path: Path) -> BinaryIO:
    return gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")

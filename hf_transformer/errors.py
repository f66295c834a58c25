"""Errors the user can fix, and the tests that tell them. The `hf-transformer` command prints their message alone,
without a traceback."""

import errno
import os
from pathlib import Path


class UserError(ValueError):
    """Input that cannot be used as given; the message names the file, line or field and the fix."""


class DataError(UserError):
    """Bad input data: a dataset, a split, a tokenizer."""


class ConfigError(UserError):
    """A setting that cannot work, found before any work starts."""


class TrainingDiverged(UserError, FloatingPointError):
    """The training loss became NaN or infinite."""


class CheckpointError(UserError):
    """A checkpoint file that cannot be used: unreadable, truncated, or not written by this package."""


class CheckpointNotFound(UserError, FileNotFoundError):
    """No checkpoint where one was named."""


class EarlierRunFound(UserError, FileExistsError):
    """A fresh run would write into a folder holding another run's checkpoints."""


class FolderInUse(UserError):
    """Another run is writing into the checkpoint folder that a run would write into."""


class DiskFull(UserError, OSError):
    """No space left on the disk that a file is written to."""


class HubError(UserError):
    """A push to the Hugging Face Hub failed; the message never contains the token."""


class TranslationInputError(UserError, TypeError):
    """Sentences to translate that are not a list of strings, or decoding settings that cannot work."""


class MissingExtra(UserError, ImportError):
    """An optional dependency is not installed; the message names the extra that installs it."""


class ModelNotFound(UserError, FileNotFoundError):
    """A model that is no folder, file or Hub repository that can be read, or one of a kind that cannot be used."""


def is_disk_full(error: BaseException | None) -> bool:
    """Whether `error`, or one it arose from, is the OS saying that the disk or the user's quota is full. torch reports
    it as a RuntimeError of its zip writer and safetensors as a SafetensorError, with the OS's error only in the chain
    or in the message ("os error 28")."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if f"os error {errno.ENOSPC})" in str(error) or f"os error {errno.EDQUOT})" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def why_unwritable(folder: str | Path) -> str | None:
    """Why files could not be created in `folder` (made where missing, with its parents), or None where they could;
    nothing is created to find out: a part of the path that is a file, a read-only file system, no permission."""
    existing = Path(folder).absolute()
    while not existing.is_dir():
        if existing.exists() or existing.is_symlink():
            return f"{existing} is not a folder"
        existing = existing.parent
    if os.access(existing, os.W_OK | os.X_OK):
        return None
    if hasattr(os, "statvfs") and os.statvfs(existing).f_flag & os.ST_RDONLY:  # not on Windows
        return f"{existing} is on a read-only file system"
    return f"no permission to write into {existing}"

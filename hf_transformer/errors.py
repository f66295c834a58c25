"""Errors the user can fix. The `hf-transformer` command prints their message alone, without a traceback."""


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

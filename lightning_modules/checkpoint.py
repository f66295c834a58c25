"""Training checkpoints: written so that a crash cannot tear them, read back with the model and the tokenizer that
travel inside, checked against the run that resumes them, and averaged (section 6.1 averages the last 5)."""

import os
import pickle
import shutil
import signal
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from hf_transformer import TransformerConfig, TransformerForConditionalGeneration
from hf_transformer.errors import CheckpointError, CheckpointNotFound, DiskFull, is_disk_full
from hf_transformer.model.configuration_transformer import SHAPE_FIELDS

MODEL_PREFIX = "model."
# The checkpoint key of the run a checkpoint belongs to (written by `ResumableCheckpoint`, kept across resumes).
RUN_ID = "run_id"


# What torch.load raises on a file that is truncated, overwritten or no checkpoint at all (a text file read as a
# pickle: a KeyError or an IndexError of its memo).
UNREADABLE = (OSError, EOFError, RuntimeError, ValueError, KeyError, IndexError, TypeError, pickle.UnpicklingError)


def every_rank(state: dict[str, Any]) -> dict[str, Any]:
    """`state` as every rank of the run holds it: a checkpoint is written by rank 0, but the ranks of a DDP run draw
    random numbers (and read a stream) at their own pace. Every rank must call it: it is a collective."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return {"ranks": [state]}
    states: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(states, state)
    return {"ranks": states}


def this_ranks(saved: dict[str, Any]) -> dict[str, Any]:
    """This rank's part of what `every_rank` saved (a run resumed on fewer ranks takes theirs in order)."""
    if "ranks" not in saved:
        return saved  # a checkpoint of 0.3, which saved rank 0's state only
    rank = (
        torch.distributed.get_rank() if torch.distributed.is_available() and torch.distributed.is_initialized() else 0
    )
    return saved["ranks"][rank % len(saved["ranks"])]


def unreadable_checkpoint(path: str | Path, error: Exception) -> CheckpointError:
    # torch's error for a pickled object other than tensors and plain values is a page on `weights_only` and how to
    # allow the object: only its one line that says what the file holds is the reason here.
    reason = str(error).split("WeightsUnpickler error: ", 1)[-1].split(". Please use", 1)[0].strip()
    reason = reason.splitlines()[0] if reason else ""
    return CheckpointError(
        f"{path} is not a readable checkpoint ({type(error).__name__}: {reason}): it is truncated, corrupt or no "
        "checkpoint at all (a crash during its write, before checkpoints were written atomically, or a copy cut short "
        "leaves such a file). Use another checkpoint of its folder."
    )


def read_checkpoint(path: str | Path, mmap: bool = False) -> dict[str, Any]:
    """`torch.load` of plain tensors and Python values, naming the file when it cannot be read. Memory-mapped (`mmap`),
    it is cheap: enough to know that the file is whole and to read its step."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except UNREADABLE as error:
        raise unreadable_checkpoint(path, error) from error


@contextmanager
def signals_deferred(signals: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """Hold `signals` until the block ends, then act on them as their handlers would have. A Ctrl-C raises
    KeyboardInterrupt wherever Python is; inside torch.save's zip writer it broke the write (torch.save's
    RuntimeError "unexpected pos") and the run ended without saving its state. Only the main thread receives signals;
    elsewhere the block runs as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {number: signal.signal(number, lambda number, _frame: received.append(number)) for number in signals}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for number in received:
            if callable(previous[number]):
                previous[number](number, None)
            elif previous[number] == signal.SIG_DFL:
                signal.raise_signal(number)


def save_atomically(checkpoint: dict[str, Any], path: str | Path) -> None:
    """`torch.save` into a temporary file beside `path`, flushed to disk, then renamed over `path`: a crash at any
    moment leaves either the previous file or the complete new one under that name, never a part of one, and a
    Ctrl-C or SIGTERM during the write is acted on once it is done."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # hidden, and no *.ckpt for the folder's readers
    with signals_deferred():
        try:
            with open(temporary, "wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)  # atomic within one filesystem, which a file beside the target guarantees
        except (OSError, RuntimeError) as error:
            if is_disk_full(error):
                raise DiskFull(
                    f"no space left on the disk of {path.parent} while writing {path.name} "
                    f"({shutil.disk_usage(path.parent).free / 2**20:,.0f} MiB free there); the checkpoints written "
                    "before are intact. Free space there, or write checkpoints to another disk (dirpath of the "
                    "checkpoint callback), then resume with --ckpt_path last"
                ) from error
            raise
        finally:
            temporary.unlink(missing_ok=True)
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)  # the rename itself survives a power cut once the folder's entry is on disk
        finally:
            os.close(folder)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer and reader, writing local files with `save_atomically` and naming the file when
    one cannot be read. Lightning's own atomic save writes a temporary file in TMPDIR and moves it, which across
    filesystems (a tmpfs /tmp, runs on a disk) is a copy without fsync, so a kill left truncated checkpoints."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        if storage_options is not None or not isinstance(get_filesystem(path), LocalFileSystem):
            super().save_checkpoint(checkpoint, path, storage_options)
        else:
            save_atomically(checkpoint, path)

    def load_checkpoint(self, path: str | Path, *args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            return super().load_checkpoint(path, *args, **kwargs)
        except FileNotFoundError:
            raise
        except UNREADABLE as error:
            raise unreadable_checkpoint(path, error) from error


def load_checkpoint(path: str | Path, mmap: bool = False) -> dict[str, Any]:
    """Load a checkpoint written by `TranslationModule` (plain tensors and Python values only); memory-mapped with
    `mmap`, its tensors are read from the file as they are used."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointNotFound(f"No checkpoint at {path}: pass the path of a .ckpt file written during training.")
    checkpoint = read_checkpoint(path, mmap=mmap)
    for key in ("state_dict", "hf_config", "tokenizer"):
        if key not in checkpoint:
            raise CheckpointError(f"{path} has no {key!r}: it was not written by lightning_modules.TranslationModule.")
    return checkpoint


def tokenizer_from_checkpoint(checkpoint: dict[str, Any]) -> PreTrainedTokenizerFast:
    saved = checkpoint["tokenizer"]
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(saved["json"]), **saved["special_tokens"])


def tokenizer_state(tokenizer: PreTrainedTokenizerFast) -> dict[str, Any]:
    """What `tokenizer_from_checkpoint` needs, as plain values."""
    return {"json": tokenizer.backend_tokenizer.to_str(), "special_tokens": dict(tokenizer.special_tokens_map)}


def check_same_model(
    checkpoint: dict[str, Any], config: TransformerConfig, tokenizer: PreTrainedTokenizerFast | None
) -> None:
    """Refuse a checkpoint of another model or tokenizer, naming what differs, before its weights are loaded (where
    the mismatch would be a dump of tensor shapes, or with equal sizes a model reading other token ids)."""
    saved = checkpoint.get("hf_config", {})
    differences = [
        f"{field} {saved[field]} in the checkpoint, {getattr(config, field)} here"
        for field in SHAPE_FIELDS
        if field in saved and saved[field] != getattr(config, field)
    ]
    other_tokens = (
        not differences
        and tokenizer is not None
        and "tokenizer" in checkpoint
        and tokenizer_from_checkpoint(checkpoint).get_vocab() != tokenizer.get_vocab()
    )
    if other_tokens:
        differences.append("a tokenizer of the same size, but with other tokens or ids")
    if differences:
        raise CheckpointError(
            f"the checkpoint (--ckpt_path) holds another model or tokenizer than this config builds: "
            f"{'; '.join(differences)}. Use the config of the run that wrote it, with its data settings (the "
            "tokenizer comes from data.tokenizer_dir or data.tokenizer), or export it (hf-transformer export) and "
            "start from that folder with --model.init_from"
        )


def model_from_checkpoint(checkpoint: dict[str, Any]) -> TransformerForConditionalGeneration:
    model = TransformerForConditionalGeneration(TransformerConfig.from_dict(checkpoint["hf_config"]))
    state = {
        name.removeprefix(MODEL_PREFIX): tensor
        for name, tensor in checkpoint["state_dict"].items()
        if name.startswith(MODEL_PREFIX)
    }
    model.load_state_dict(state, strict=False)  # tied weights appear under one name only
    model.tie_weights()
    if "generation_config" in checkpoint:
        model.generation_config.update(**checkpoint["generation_config"])
    return model.eval()


def average_checkpoints(paths: list[str | Path]) -> dict[str, Any]:
    """The element-wise mean of the float weights of several checkpoints of one run (summed in float64, in the order
    given); everything else is taken from the last one, and `averaged_steps` lists the global steps averaged.

    The checkpoints are read one at a time, memory-mapped: what is held is the float64 sum of the weights, not every
    checkpoint with its optimizer state at once (ten of the big model needed tens of GB)."""
    if not paths:
        raise ValueError("Checkpoint averaging needs at least one checkpoint.")
    # Which run each belongs to, before any weights are read: another run's may not even have the same shapes.
    run_ids, steps = [], []
    for path in paths:
        checkpoint = load_checkpoint(path, mmap=True)
        run_ids.append(checkpoint.get(RUN_ID))
        steps.append(checkpoint["global_step"])
    check_one_run(paths, run_ids)
    totals: dict[str, torch.Tensor] = {}
    for path in paths:
        checkpoint = load_checkpoint(path, mmap=True)
        weights = {name: tensor for name, tensor in checkpoint["state_dict"].items() if tensor.is_floating_point()}
        if totals and weights.keys() != totals.keys():
            raise CheckpointError(
                f"{path} holds other weights than {paths[0]} ({len(weights.keys() ^ totals.keys())} names differ): "
                "average checkpoints of one model"
            )
        for name, tensor in weights.items():
            if name in totals:
                totals[name] += tensor  # in float64, the sum's type
            else:  # a copy: a mapped float64 tensor is not to be added into
                totals[name] = tensor.to(torch.float64, copy=True)
    averaged = dict(checkpoint)  # the last one's
    averaged["averaged_steps"] = steps
    averaged["state_dict"] = {
        name: (totals[name] / len(paths)).to(tensor.dtype) if name in totals else tensor
        for name, tensor in checkpoint["state_dict"].items()
    }
    return averaged


def check_one_run(paths: list[str | Path], run_ids: list[str | None]) -> None:
    """Refuse to average checkpoints of different runs (two runs written into one folder, files copied in): the mean
    of unrelated weights is no model. Checkpoints written before run ids were recorded match any run."""
    runs: dict[str, list[str]] = {}
    for path, run_id in zip(paths, run_ids, strict=True):
        if run_id is not None:
            runs.setdefault(run_id, []).append(Path(path).name)
    if len(runs) > 1:
        groups = "; ".join(f"run {run_id[:8]}: {', '.join(names)}" for run_id, names in runs.items())
        raise CheckpointError(
            f"the checkpoints to average belong to {len(runs)} different runs ({groups}). Average checkpoints of one "
            "run: move the other run's files out of the folder, or give fewer (--average N)"
        )


def last_checkpoints(folder: str | Path, count: int) -> list[Path]:
    """The `count` most recent step checkpoints in `folder` (by global step), oldest first. An unreadable file is
    skipped with a warning that names it."""
    if count < 1:  # the last 0 would be all of them ([-0:])
        raise ValueError(f"the number of checkpoints to average must be at least 1, got {count}")
    steps = {}
    for path in Path(folder).glob("*.ckpt"):
        if path.stem.startswith(("last", "on_exception")):
            continue
        try:  # only the step is read here, the weights are read once, by the averaging
            steps[path] = read_checkpoint(path, mmap=True)["global_step"]
        except ValueError as error:
            warnings.warn(f"Not averaging {error}", stacklevel=2)
    chosen = sorted(steps, key=steps.get)[-count:]
    if not chosen:
        raise CheckpointNotFound(f"{folder} holds no readable step checkpoints (step*.ckpt) to average")
    if len(chosen) < count:
        raise CheckpointNotFound(
            f"asked to average {count} checkpoints but {folder} holds {len(chosen)} (steps "
            f"{', '.join(str(steps[path]) for path in chosen)}): average at most {len(chosen)} (--average "
            f"{len(chosen)}), or keep more in the next run (save_top_k of the checkpoint callback)"
        )
    return chosen


def averaging_span_warning(steps: list[int]) -> str | None:
    """A warning when the averaged checkpoints span most of the run (up to the last one's step). Section 6.1 averages
    the last checkpoints, written close together at the end (the last 5 of 12 hours, 10 minutes apart); averaging
    weights from early in training makes the model worse than the last checkpoint."""
    if steps[-1] - steps[0] <= steps[-1] / 2:
        return None
    return (
        f"The averaged checkpoints span steps {steps[0]}-{steps[-1]}, most of the run: the paper averages the last "
        "checkpoints, written close together near the end of training. Write checkpoints more often "
        "(every_n_train_steps of the checkpoint callback) or average fewer (--average N)."
    )

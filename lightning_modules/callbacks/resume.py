"""Training that stops and resumes as if it never stopped: the random generators' state saved with each checkpoint, and
checkpoints that belong to one run, resume only when asked and are saved when the run is interrupted."""

import os
import signal
import socket
import sys
import threading
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from filelock import FileLock, Timeout
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from hf_transformer.errors import DiskFull, EarlierRunFound, FolderInUse
from hf_transformer.model.integrity import non_finite_tensors

from ..checkpoint import RUN_ID, every_rank, read_checkpoint, this_ranks


class ExactResume(pl.Callback):
    """Saves the random number generators' state with each checkpoint and restores it at the first batch after a
    resume, so that dropout masks continue where they were and a resumed run trains exactly like one that never
    stopped. Restored at the first batch rather than on load: re-creating the data iterator draws from the global RNG
    in between. Each rank's state is saved: DDP ranks draw dropout masks for batches of their own shapes, so their
    generators part after the first step."""

    def __init__(self) -> None:
        self._pending: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        state = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return every_rank(state)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = this_ranks(state_dict)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._pending is not None:
            torch.set_rng_state(self._pending["torch"])
            if "cuda" in self._pending and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(self._pending["cuda"])
            self._pending = None


# How the user knows the signals that stop a run from outside.
INTERRUPTIONS = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


class InterruptibleTrainer(pl.Trainer):
    """`pl.Trainer` that its callbacks can ask to stop at the end of the step (or validation batch) under way, as
    Lightning stops after a SIGTERM: with `stop_requested = True`. Lightning's loops check `received_sigterm` there
    and, under DDP, broadcast rank 0's at every step, so that every rank stops after the same step; a public property,
    which this class extends. Lightning 2.6 has no public way to ask for that stop: `should_stop` runs a validation
    first and ends the epoch, which a resumed run would then skip. The CLI trains with this class."""

    stop_requested = False

    @property
    def received_sigterm(self) -> bool:
        return self.stop_requested or super().received_sigterm


class ResumableCheckpoint(ModelCheckpoint):
    """`ModelCheckpoint` whose `last.ckpt` is the one state that `--ckpt_path last` resumes, in a folder that belongs
    to one run.

    - While `fit` runs, it holds a lock on its folder (`.lock`, an OS lock through `filelock`, on Windows too, that
      ends with the process, kill -9 included; `.lock-holder` says which process holds it): a second run started
      into the same folder stops at once instead of interleaving its checkpoints.
    - Every checkpoint records the run it belongs to (`run_id`, kept across resumes), so that averaging refuses
      checkpoints of different runs.
    - A fresh run (no `ckpt_path`) into a folder that holds checkpoints stops with a message instead of mixing two
      runs' files: README's commands name this pinned folder, so a new versioned folder would leave them pointing at
      the old run.
    - A run resumed with a smaller `save_top_k` keeps its best (with `monitor: step`, its last) `save_top_k`.
    - A run folder that was moved or copied resumes as the same run: the checkpoint paths in its state are read in
      the folder where it is now (Lightning forgets them, then writes `last-v1.ckpt` beside a `last.ckpt` that stays
      at the old step).
    - Training that ends between two step checkpoints (trainer.max_steps, max_time or max_epochs reached) saves its
      final state as `last.ckpt`: Lightning saves only on the step interval, and export and resume would otherwise
      miss the steps since the last one.
    - When training stops on an exception (SIGTERM, Ctrl-C, a crash), the state is saved as `last.ckpt` (no extra step
      checkpoint, so the saved steps stay regular) unless it is there already, the weights are not finite, the
      exception is a non-finite loss (a diverging state is no place to resume from) or the disk is full; then the way
      to resume is printed.
    - A Ctrl-C while training stops the run as a SIGTERM does: Lightning ends the step under way, then the state is
      saved. Python's KeyboardInterrupt landed mid-step, where the random generators already
      held that step's dropout draws and the data was a batch ahead: the resumed run never trained on that batch. A
      validation stops at once: the step's state is saved before a validation starts, and a resumed run does not
      validate that step again (Lightning ended the validation first, minutes of beam search). A second Ctrl-C stops
      at once, without saving (the state then is no step's). The run exits 130 after a Ctrl-C and 143 after a SIGTERM
      (128 + the signal's number, as a process that the signal ended): Lightning's SIGTERM exited 0, as a finished run
      does. The trainer must be an `InterruptibleTrainer` (the CLI's); with another, a Ctrl-C is
      Python's KeyboardInterrupt, where it lands.

    Lightning's `OnExceptionCheckpoint` is not used: with it, `fit` resumes by itself and its file wins over
    `last.ckpt` even when written at step 0 or from non-finite weights.
    """

    LOCK_FILE = ".lock"
    HOLDER_FILE = ".lock-holder"  # beside the lock: a locked file cannot be read on Windows

    def __init__(self, *args: Any, save_on_exception: bool = True, **kwargs: Any):
        super().__init__(*args, save_on_exception=save_on_exception, **kwargs)
        self._saved_step: int | None = None  # the step of last.ckpt on disk, once training has started
        self._saving_step: int | None = None  # the step of the checkpoint being written
        self._lock: FileLock | None = None
        self._sigint_handler: Any = None  # the SIGINT handler to restore while Ctrl-C is held to the step's end
        self._validating = False  # in a validation of `fit` whose step's state is saved: a Ctrl-C stops at once
        self._stopped_by = signal.SIGTERM  # the signal behind Lightning's stop at the end of a step
        self._dropped: list[str] = []  # checkpoints out of a smaller save_top_k than the resumed run's
        self.run_id: str | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        with warnings.catch_warnings():
            # Lightning warns of a checkpoint folder that is not empty: the normal state of a resume, and a fresh run
            # into a folder with checkpoints is refused with a message of its own (`check_last_checkpoint`).
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
            super().setup(trainer, pl_module, stage)
        if stage != "fit" or not self.dirpath:
            return
        holder = self._take_lock() if trainer.is_global_zero else None
        holder = trainer.strategy.broadcast(holder)
        if holder is not None:
            raise FolderInUse(
                f"{relative_to_cwd(Path(self.dirpath))} belongs to a run that is still training ({holder}). Wait for "
                "it to end, or write this run elsewhere (dirpath of the checkpoint callback in your config)."
            )
        self.run_id = trainer.strategy.broadcast(uuid.uuid4().hex)  # replaced by the checkpoint's when resuming

    def _take_lock(self) -> str | None:
        """Lock the folder for this process; None, or the holder's description when another process holds it."""
        folder = Path(self.dirpath)
        folder.mkdir(parents=True, exist_ok=True)
        lock = FileLock(folder / self.LOCK_FILE, timeout=0)
        holder = folder / self.HOLDER_FILE
        try:
            lock.acquire()
        except Timeout:
            description = holder.read_text().strip() if holder.is_file() else ""
            return description or "a process that wrote no description"
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        holder.write_text(f"process {os.getpid()} on {socket.gethostname()}, started {started}\n")
        self._lock = lock
        return None

    def _release_lock(self) -> None:
        if self._lock is not None:
            (Path(self.dirpath) / self.HOLDER_FILE).unlink(missing_ok=True)
            self._lock.release()
            self._lock = None

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._release_lock()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        # Here rather than in `setup`: `trainer.ckpt_path` is known only once the checkpoint is restored.
        existing = sorted(Path(self.dirpath).glob("*.ckpt")) if trainer.is_global_zero and self.dirpath else []
        if trainer.strategy.broadcast(trainer.ckpt_path is None and bool(existing)):
            raise EarlierRunFound(
                f"{self.dirpath} holds the checkpoints of an earlier run ({', '.join(p.name for p in existing[-3:])}). "
                "Resume it with --ckpt_path last (or --ckpt_path and one of its files), or start a new run after "
                "moving that folder away, or write this run elsewhere (dirpath of the checkpoint callback in your "
                "config)."
            )
        if self._dropped:
            self._warn_of_dropped(trainer)
        for path in self._dropped:
            self._remove_checkpoint(trainer, path)
        self._dropped = []
        self._saved_step = self._saving_step = trainer.global_step
        self._stopped_by = signal.SIGTERM
        if isinstance(trainer, InterruptibleTrainer):
            trainer.stop_requested = False
            self._hold_ctrl_c(trainer)

    def _hold_ctrl_c(self, trainer: InterruptibleTrainer) -> None:
        """Until training ends, a Ctrl-C asks the trainer to stop as after a SIGTERM: the loops stop at the end of the
        step or validation batch under way (under DDP, rank 0's request reaches every rank at the next step) and
        `on_exception` saves that state."""
        handler = signal.getsignal(signal.SIGINT)
        if threading.current_thread() is not threading.main_thread() or handler in (signal.SIG_IGN, None):
            return  # signals reach the main thread only; a job started in the background ignores Ctrl-C

        def stop_after_this_step(number: int, frame: Any) -> None:
            self._release_ctrl_c()  # a second Ctrl-C stops at once
            self._stopped_by = signal.SIGINT
            # Not Lightning's SIGTERM handler: it would signal the other ranks and run a collective inside this
            # handler on every rank that Ctrl-C reaches.
            trainer.stop_requested = True
            if self._validating:
                # A validation changes nothing that training resumes from, and its step's state is saved
                # (`on_validation_start`): stop at once rather than after its batches of beam search.
                if trainer.is_global_zero:
                    os.write(sys.stderr.fileno(), b"Ctrl-C: stopping the validation, the step's state is saved\n")
                raise SIGTERMException
            if trainer.is_global_zero:  # not print(): the main thread may be inside a write to stderr
                os.write(
                    sys.stderr.fileno(),
                    b"Ctrl-C: stopping once this step is done and its state saved (Ctrl-C again stops at once, "
                    b"losing the steps since the last checkpoint)\n",
                )

        self._sigint_handler = handler
        signal.signal(signal.SIGINT, stop_after_this_step)

    def _release_ctrl_c(self) -> None:
        if self._sigint_handler is not None:
            signal.signal(signal.SIGINT, self._sigint_handler)
            self._sigint_handler = None

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        self._saving_step = checkpoint["global_step"]
        checkpoint[RUN_ID] = self.run_id

    # Each hook in which `ModelCheckpoint` saves writes the step's checkpoint, then `last.ckpt`: the state counts as
    # saved once the hook has returned (an interruption between the two writes leaves `last.ckpt` a save behind).
    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        super().on_train_batch_end(trainer, *args)
        self._saved_step = self._saving_step
        # The step that ends training (max_steps, or max_time's Timer, which runs before this callback) is saved now,
        # while its epoch is under way: saved once training has ended, the state would mark the epoch complete, and a
        # run resumed to train further would start the next epoch, skipping the rest of this one's batches.
        last_step = 0 < trainer.max_steps <= trainer.global_step or trainer.should_stop
        if self.save_last and last_step and self._saved_step != trainer.global_step:
            self._save_last_now(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        self._saved_step = self._saving_step

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A validation during training holds nothing that a resume needs (the step's state is the one before it,
        and a resumed run does not validate that step again): with that state on disk, written now where no step
        checkpoint was, a Ctrl-C stops at once instead of after the validation's batches (minutes of beam search)."""
        super().on_validation_start(trainer, pl_module)
        if self._sigint_handler is None or trainer.sanity_checking:  # Ctrl-C not held: `validate`, or no terminal
            return
        if self.save_last and self._saved_step != trainer.global_step:
            self._save_last_now(trainer)
        self._validating = self._saved_step == trainer.global_step

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._validating = False
        super().on_validation_end(trainer, pl_module)
        self._saved_step = self._saving_step

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._release_ctrl_c()
        super().on_train_end(trainer, pl_module)
        if self.save_last and self._saved_step is not None and self._saved_step != trainer.global_step:
            self._save_last_now(trainer)

    def _save_last_now(self, trainer: pl.Trainer) -> None:
        """The state at this step as `last.ckpt`, without a step checkpoint (the saved steps stay regular)."""
        path = self.format_checkpoint_name({"step": trainer.global_step}, self.CHECKPOINT_NAME_LAST)
        trainer.save_checkpoint(path, weights_only=False)
        self.last_model_path = path
        self._saved_step = trainer.global_step

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        self.run_id = checkpoint.get(RUN_ID, self.run_id)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved_in = state_dict.get("dirpath")
        if self.dirpath and saved_in and saved_in != self.dirpath:  # the folder was moved or copied
            state_dict = _moved_state(state_dict, self.dirpath)
        super().load_state_dict(state_dict)
        self._keep_top_k()

    def _keep_top_k(self) -> None:
        """A run resumed with a smaller save_top_k keeps its best save_top_k checkpoints; the others' files are
        removed at the start of training, as Lightning removes those that drop out of the top k. Lightning kept the
        saved ones: it then looked up a k-th best it never had (KeyError ''), or, past the old k, never removed one."""
        if self.save_top_k < 1 or len(self.best_k_models) <= self.save_top_k:
            return
        ranked = sorted(self.best_k_models, key=self.best_k_models.get, reverse=self.mode == "max")  # best first
        self._dropped = ranked[self.save_top_k :]
        self.best_k_models = {path: self.best_k_models[path] for path in ranked[: self.save_top_k]}
        self.kth_best_model_path = ranked[self.save_top_k - 1]
        self.kth_value = self.best_k_models[self.kth_best_model_path]

    def _warn_of_dropped(self, trainer: pl.Trainer) -> None:
        """Say which checkpoints a smaller save_top_k deletes: `export --average N` needs N of them."""
        kept, names = self.save_top_k + len(self._dropped), sorted(Path(path).name for path in self._dropped)
        rank_zero_warn(
            f"checkpoint.save_top_k={self.save_top_k}: deleting {', '.join(names)} "
            f"of the {kept} checkpoints this run kept in {relative_to_cwd(Path(self.dirpath))}; from now on it keeps "
            f"{self.save_top_k}, and `hf-transformer export --average` averages at most {self.save_top_k}. Resume with "
            f"--checkpoint.save_top_k={kept} to keep them"
        )

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._release_ctrl_c()
        self._validating = False
        pressed_twice = isinstance(exception, KeyboardInterrupt) and self._stopped_by == signal.SIGINT
        if isinstance(exception, SIGTERMException):
            exception.code = 128 + self._stopped_by
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut this save short
        try:
            if (
                not self.save_on_exception
                or self._saved_step is None
                or isinstance(exception, FloatingPointError | DiskFull)
            ):
                return
            if trainer.world_size > 1 and not isinstance(exception, SIGTERMException | KeyboardInterrupt):
                # Saving is collective (state gathered from every rank, a barrier at the end), and an error such as
                # out-of-memory may have stopped this rank alone: the others would never join, and all would hang
                # until the process group's timeout. A signal reaches every rank. Resume from the last step checkpoint.
                return
            if pressed_twice:
                self._report_unsaved(trainer)
                return
            if self._saved_step != trainer.global_step:
                if non_finite_tensors(pl_module.named_parameters()):
                    return
                self._save_last_now(trainer)
            if trainer.is_global_zero and self.last_model_path:
                print(
                    f"Stopped at step {trainer.global_step} ({self._cause(exception)}); its state is saved in "
                    f"{relative_to_cwd(Path(self.last_model_path))}. Resume: the same command with --ckpt_path last",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            self._release_lock()

    def _cause(self, exception: BaseException) -> str:
        if isinstance(exception, SIGTERMException):
            return INTERRUPTIONS[self._stopped_by]
        return INTERRUPTIONS[signal.SIGINT] if isinstance(exception, KeyboardInterrupt) else type(exception).__name__

    def _report_unsaved(self, trainer: pl.Trainer) -> None:
        """After a second Ctrl-C, which lands mid-step: which state a resume starts from."""
        if not trainer.is_global_zero:
            return
        if self.last_model_path:
            step = read_checkpoint(self.last_model_path, mmap=True)["global_step"]
            saved = (
                f"{relative_to_cwd(Path(self.last_model_path))} holds step {step}. Resume: the same command with "
                "--ckpt_path last"
            )
        else:
            saved = "no checkpoint was written yet"
        print(
            f"Stopped during step {trainer.global_step + 1} (Ctrl-C twice), whose state is not saved; {saved}",
            file=sys.stderr,
            flush=True,
        )


def _moved_state(state_dict: dict[str, Any], dirpath: str) -> dict[str, Any]:
    """`ModelCheckpoint`'s state with each checkpoint path moved into `dirpath`."""

    def moved(path: str) -> str:
        return os.path.join(dirpath, os.path.basename(path)) if path else path

    state_dict = dict(state_dict, dirpath=dirpath)
    for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
        if key in state_dict:
            state_dict[key] = moved(state_dict[key])
    if "best_k_models" in state_dict:
        state_dict["best_k_models"] = {moved(path): score for path, score in state_dict["best_k_models"].items()}
    return state_dict


def relative_to_cwd(path: Path) -> Path:
    """`path` as the user wrote it in a config: relative to the working directory where it lies below it (Lightning
    makes checkpoint folders absolute)."""
    return path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path

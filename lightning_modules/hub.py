"""Push models to the Hugging Face Hub: `push_folder` (an exported folder), `hf-transformer push` (`push_main`, a
checkpoint or an exported folder) and `PushToHubCallback` (from training)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from huggingface_hub import CommitInfo, HfApi, get_token
from huggingface_hub.errors import HfHubHTTPError, HFValidationError, OfflineModeIsEnabled

# Connection errors come out of huggingface_hub as raw errors of its HTTP client (httpx, httpx2 since version 2);
# `errors.HTTPError` re-exports that client's base error class, whichever it is.
from huggingface_hub.errors import HTTPError as TransportError
from huggingface_hub.utils import validate_repo_id
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from .checkpoint import export, export_marian, export_marian_from_folder, load_checkpoint
from .model_card import CARD_FORMATS, CARD_NAME, rewrite_model_card

logger = logging.getLogger(__name__)

WEIGHTS_INDEX = "model.safetensors.index.json"


class HubError(RuntimeError):
    """A push failed; the message says what went wrong and how to fix it, and never contains the token."""


def push_folder(
    folder: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    create_pr: bool = False,
    token: str | None = None,
) -> CommitInfo:
    """Upload an exported model folder to `repo_id` as one commit and return its `CommitInfo`.

    `CommitInfo` is a `str` (the commit URL) with `.oid` (the commit sha) and `.pr_url`. The repo is created if
    needed (`private` only applies then). `revision` names a branch, created from `main` if missing, or an open
    pull request (`refs/pr/N`) to add a commit to; `create_pr` opens a pull request against `main` instead of
    committing to it. The token defaults to `HF_TOKEN` or the one saved by `hf auth login`. The folder is only read.
    """
    folder = Path(folder)
    check_repo_id(repo_id)
    check_export_folder(folder)
    if create_pr and revision not in (None, "main"):
        raise HubError(f"create_pr=True opens a pull request against 'main': drop revision={revision!r}.")
    api = HfApi(token=token or _find_token())
    message = commit_message or f"Upload {folder.name} with hf-transformer"
    logger.info("Pushing %s to %s/%s", folder, api.endpoint, repo_id)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision not in (None, "main") and not revision.startswith("refs/pr/"):
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        commit = api.upload_folder(
            folder_path=folder, repo_id=repo_id, revision=revision, commit_message=message, create_pr=create_pr
        )
    except HfHubHTTPError as err:
        raise HubError(_explain_http_error(err, api, repo_id)) from err
    except OfflineModeIsEnabled as err:
        raise HubError(f"Cannot push {repo_id}: HF_HUB_OFFLINE is set. Unset it and re-run the push.") from err
    except TransportError as err:
        raise HubError(
            f"Could not reach the Hub at {api.endpoint} while pushing {folder} to {repo_id} "
            f"({type(err).__name__}: {err}). The local folder is intact; re-run the push when the Hub is reachable "
            "(files already on the Hub are skipped)."
        ) from err
    logger.info("Pushed %s as %s", folder, commit.pr_url or commit)
    return commit


def check_repo_id(repo_id: str) -> None:
    """Refuse anything but `namespace/name`, before any network call."""
    problem = None if repo_id.count("/") == 1 else "it must have exactly one '/'"
    if problem is None:
        try:
            validate_repo_id(repo_id)
        except HFValidationError as err:
            problem = str(err)
    if problem:
        raise HubError(
            f"Invalid repo id {repo_id!r}: expected 'namespace/name' (for example 'alice/transformer-de-en'), "
            f"made of letters, digits, '-', '_' and '.'; {problem}"
        )


def check_export_folder(folder: Path) -> None:
    """Refuse a folder that does not look like `save_pretrained` output: `config.json` plus safetensors weights."""
    if not folder.is_dir():
        raise HubError(f"Cannot push {folder}: it is not a folder. Pass the folder written by the model export.")
    missing = []
    config = folder / "config.json"
    if not config.is_file():
        missing.append("config.json")
    else:
        try:
            json.loads(config.read_text(encoding="utf-8"))
        except ValueError as err:
            raise HubError(f"Cannot push {folder}: config.json is not valid JSON ({err}).") from err
    missing += _missing_weights(folder)
    if missing:
        raise HubError(
            f"Cannot push {folder}: it does not look like an exported model, missing {', '.join(missing)}. "
            "Export the model with save_pretrained first."
        )


def _missing_weights(folder: Path) -> list[str]:
    index = folder / WEIGHTS_INDEX
    if index.is_file():
        shards = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values())
        return sorted(shard for shard in shards if not (folder / shard).is_file())
    if any(folder.glob("*.safetensors")):
        return []
    return ["weights (model.safetensors or a sharded model-*.safetensors set with its index)"]


def _find_token() -> str:
    token = get_token()
    if token is None:
        raise HubError("No Hugging Face token found: set HF_TOKEN or run `hf auth login`, then re-run the push.")
    return token


def _explain_http_error(err: HfHubHTTPError, api: HfApi, repo_id: str) -> str:
    status = err.response.status_code if err.response is not None else None
    if status == 401:
        return (
            f"The Hub at {api.endpoint} rejected the token (401). Set HF_TOKEN to a valid write token "
            "or run `hf auth login`, then re-run the push."
        )
    if status == 403:
        namespace, name = repo_id.split("/")
        user = _user_name(api)
        return (
            f"User {user!r} may not write to {repo_id!r} (403): it belongs to {namespace!r}. "
            f"Push to your own namespace (e.g. '{user}/{name}') or ask {namespace!r} for write access."
        )
    return f"Pushing to {repo_id!r} on {api.endpoint} failed: {err.server_message or err}"


def _user_name(api: HfApi) -> str:
    """The token's user, for error messages; '<your user>' when the Hub cannot say."""
    try:
        return api.whoami()["name"]
    except (HfHubHTTPError, TransportError, KeyError):
        return "<your user>"


# --- `hf-transformer push`: a checkpoint or an exported folder -------------------------------------------------


def push_source(
    source: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    create_pr: bool = False,
    results: dict[str, float] | None = None,
    wandb_url: str | None = None,
    format: str = "hf-transformer",
) -> CommitInfo:
    """Push a training checkpoint (exported with its model card into a temporary folder first) or a folder written by
    `hf-transformer export` (pushed through a temporary view whose card names `repo_id`; the folder is only read).

    `format` "marian" pushes the model as a stock `MarianMTModel` (converted from a checkpoint or an hf-transformer
    folder; a Marian folder is pushed as it is). `results` (logged metric name -> value, e.g. `test_scores.json` of
    `hf-transformer test`) and `wandb_url` go into the card of a checkpoint. Every failure is a `HubError`.
    """
    source = Path(source)
    check_repo_id(repo_id)
    token = _find_token()  # before exporting, which takes a while for a big model
    if not source.exists():
        raise HubError(
            f"Cannot push {source}: no such file or folder. Pass a .ckpt file written by training or a folder written "
            "by `hf-transformer export`."
        )
    if format not in CARD_FORMATS:
        raise HubError(f"Unknown format {format!r}: push one of {', '.join(CARD_FORMATS)}.")
    if source.is_dir() and (results or wandb_url):
        raise HubError(
            f"{source} is an exported folder with its model card already written: --results and --wandb-url only "
            "apply to a checkpoint. Push the checkpoint instead, or edit the folder's README.md."
        )
    with tempfile.TemporaryDirectory(prefix="hf-transformer-push-") as tmp:
        staged = Path(tmp) / (source.name if source.is_dir() else source.stem)
        card_info = dict(repo_id=repo_id, results=results, wandb_url=wandb_url)
        try:
            if source.is_dir():
                _stage_export_folder(source, staged, repo_id, format)
            elif format == "marian":
                export_marian(_read_checkpoint(source), staged, **card_info)
            else:
                export(_read_checkpoint(source), staged, **card_info)
        except ValueError as err:  # a model Marian cannot express
            raise HubError(f"Cannot push {source} as {format}: {err}") from err
        try:
            return push_folder(
                staged,
                repo_id,
                private=private,
                revision=revision,
                commit_message=commit_message or f"Upload {source.name} with hf-transformer",
                create_pr=create_pr,
                token=token,
            )
        except HubError as err:
            # The temporary folder is gone when the user reads this: name what they passed instead.
            raise HubError(str(err).replace(str(staged), str(source))) from err


def push_main(argv: list[str]) -> None:
    """`hf-transformer push SOURCE REPO_ID [...]`: errors print one message and exit with status 1, no traceback."""
    args = _push_parser().parse_args(argv)
    try:
        results = _read_results(Path(args.results)) if args.results else None
        commit = push_source(
            args.source,
            args.repo_id,
            private=args.private,
            revision=args.revision,
            commit_message=args.commit_message,
            create_pr=args.create_pr,
            results=results,
            wandb_url=args.wandb_url,
            format=args.format,
        )
    except HubError as err:
        print(f"hf-transformer push: error: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    where = f"pull request {commit.pr_url}" if commit.pr_url else f"commit {commit}"
    print(f"Pushed {args.source} to {args.repo_id}: {where}")


def _push_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-transformer push",
        description="Push a model to the Hugging Face Hub: a training checkpoint (exported first, with its model card) "
        "or a folder written by `hf-transformer export`. The token comes from HF_TOKEN or `hf auth login`.",
    )
    parser.add_argument("source", help="a .ckpt file written by training, or an exported model folder")
    parser.add_argument("repo_id", help="the Hub repo, 'namespace/name' (created if missing)")
    parser.add_argument("--private", action="store_true", help="create the repo private (an existing one is kept)")
    parser.add_argument("--revision", "--branch", help="push to this branch (created from main) or to refs/pr/N")
    parser.add_argument("--commit-message", help="the commit message (default: 'Upload <source> with hf-transformer')")
    parser.add_argument("--create-pr", action="store_true", help="open a pull request against main instead")
    parser.add_argument(
        "--results", metavar="JSON", help="scores for the model card, e.g. test_scores.json of `hf-transformer test`"
    )
    parser.add_argument("--wandb-url", help="link of the training run's W&B page, for the model card")
    parser.add_argument(
        "--format",
        choices=CARD_FORMATS,
        default="hf-transformer",
        help="hf-transformer: the model with its code (loads with trust_remote_code=True); marian: a stock "
        "MarianMTModel, which loads without remote code (post-LN models only)",
    )
    return parser


def _read_checkpoint(path: Path) -> dict[str, Any]:
    try:
        return load_checkpoint(path)
    except (OSError, ValueError, RuntimeError, pickle.UnpicklingError) as err:
        raise HubError(f"Cannot push {path}: not a checkpoint written by TranslationModule ({err}).") from err


def _read_results(path: Path) -> dict[str, float]:
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
        return {str(name): float(value) for name, value in results.items()}
    except (OSError, ValueError, TypeError, AttributeError) as err:
        raise HubError(f"--results {path}: expected a JSON object of metric name -> number ({err}).") from err


def _stage_export_folder(source: Path, staged: Path, repo_id: str, format: str) -> None:
    """The folder to push for an exported `source`: a view of it, or its Marian conversion, with the card (if it has
    one) rendered for `repo_id`."""
    check_export_folder(source)
    source_format = "marian" if _model_type(source) == "marian" else "hf-transformer"
    if format == "marian" and source_format == "hf-transformer":
        export_marian_from_folder(source, staged, repo_id=repo_id)
        return
    if format != source_format:
        raise HubError(f"{source} holds a stock Marian model: push it with --format marian.")
    _stage_folder(source, staged)
    rewrite_model_card(source, staged, format=format, repo_id=repo_id)


def _model_type(folder: Path) -> str | None:
    return json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")


def _stage_folder(folder: Path, staged: Path) -> None:
    """A copy of `folder` to push: files hard-linked where possible (weights can be large), the card copied so that
    pointing it at the repo never edits the original."""

    def link_or_copy(src: str, dst: str) -> str:
        if Path(src).name != CARD_NAME:
            try:
                os.link(src, dst)
                return dst
            except OSError:  # another file system, or links not allowed
                pass
        return shutil.copy2(src, dst)

    shutil.copytree(folder, staged, copy_function=link_or_copy)


# --- pushing from training ---------------------------------------------------------------------------------------


class PushToHubCallback(pl.Callback):
    """Pushes the model to `repo_id` when training ends and, with `push_on_best` (a logged metric, higher is better,
    e.g. `val/bleu`), after each validation that improves it.

    Each push exports the current weights with the model card (validation/test scores, W&B link, compute) into
    `export_dir` (default `<log dir>/hub_export`), replaced as a whole so an interrupted export never looks complete,
    then uploads it as one commit. A failed push is logged with how to retry (`hf-transformer push <export_dir>
    <repo_id>`); training goes on. Needs `TranslationModule` with `TranslationDataModule` (the tokenizer travels in
    the checkpoint). The token comes from HF_TOKEN or `hf auth login` when pushing and is never stored: it is no
    argument of this callback, so it is in no config, checkpoint or card.
    """

    def __init__(
        self,
        repo_id: str,
        private: bool = False,
        push_on_best: str | None = None,
        export_dir: str | None = None,
    ) -> None:
        super().__init__()
        check_repo_id(repo_id)  # a typo fails now, not after hours of training
        self.repo_id, self.private, self.push_on_best, self.export_dir = repo_id, private, push_on_best, export_dir
        self.best: float | None = None
        self.pushes: list[CommitInfo] = []
        self._started = time.perf_counter()
        self._warned_missing_metric = False

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and trainer.is_global_zero:
            _find_token()  # no token: say so before training, not after it

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._started = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Only validations inside `fit`: `trainer.validate()` evaluates a model without training it further.
        if self.push_on_best is None or trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        value = trainer.callback_metrics.get(self.push_on_best)
        if value is None:
            if not self._warned_missing_metric:
                rank_zero_warn(f"PushToHubCallback: {self.push_on_best!r} was not logged; no push on best.")
                self._warned_missing_metric = True
            return
        value = float(value)
        if self.best is None or value > self.best:
            self.best = value
            self._push(trainer, f"New best {self.push_on_best} = {value:.2f} at step {trainer.global_step}")

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._push(trainer, f"Model after {trainer.global_step} training steps")

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best = state_dict.get("best")

    def _push(self, trainer: pl.Trainer, message: str) -> None:
        folder = Path(self.export_dir or Path(trainer.log_dir or trainer.default_root_dir) / "hub_export")
        # Every rank takes part in saving (sharded strategies gather the weights collectively); rank zero pushes. The
        # file sits beside the export, a path every rank knows without talking to the others.
        saved = folder.parent / f".{folder.name}.ckpt"
        trainer.save_checkpoint(saved, weights_only=True)
        if not trainer.is_global_zero:
            return
        try:
            checkpoint = load_checkpoint(saved)
        except ValueError as err:  # no tokenizer in it: trained without TranslationDataModule
            logger.error("Not pushing to %s: %s Train with TranslationDataModule.", self.repo_id, err)
            return
        finally:
            saved.unlink(missing_ok=True)
        export_replacing(checkpoint, folder, **self._card_info(trainer))
        try:
            commit = push_folder(folder, self.repo_id, private=self.private, commit_message=message)
        except HubError as err:
            logger.error(
                "%s The export is in %s: push it with `hf-transformer push %s %s`.", err, folder, folder, self.repo_id
            )
            return
        self.pushes.append(commit)
        rank_zero_info(f"Pushed {folder} to {self.repo_id}: {commit}")

    def _card_info(self, trainer: pl.Trainer) -> dict[str, Any]:
        results = {
            name: float(value)
            for name, value in trainer.callback_metrics.items()
            if name.startswith(("val/", "test/")) and value.numel() == 1
        }
        return {
            "repo_id": self.repo_id,
            "results": results,
            "wandb_url": _wandb_url(trainer),
            "compute": _compute(trainer, time.perf_counter() - self._started),
        }


def export_replacing(checkpoint: dict[str, Any], folder: Path, **card_info: Any) -> Path:
    """`export` into a fresh sibling folder, then put it in the place of `folder`: a crash mid-export leaves the
    previous export or none, never a half-written folder under the final name."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    staging.chmod(0o755)  # mkdtemp makes it private to the user; an export folder is not
    try:
        export(checkpoint, staging, **card_info)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if folder.exists():
        shutil.rmtree(folder)
    staging.rename(folder)
    return folder


def _wandb_url(trainer: pl.Trainer) -> str | None:
    """The run page of an online W&B logger; offline runs have none yet."""
    for run_logger in trainer.loggers:
        if isinstance(run_logger, WandbLogger) and not run_logger.experiment.offline:
            return run_logger.experiment.url
    return None


def _compute(trainer: pl.Trainer, seconds: float) -> str:
    accelerator = type(trainer.accelerator).__name__.removesuffix("Accelerator")
    if accelerator == "CUDA" and torch.cuda.is_available():
        accelerator = torch.cuda.get_device_name()
    hours, minutes = divmod(round(seconds / 60), 60)
    return (
        f"{trainer.num_nodes * trainer.num_devices} x {accelerator}, precision {trainer.precision}, "
        f"{hours} h {minutes:02d} min of training"
    )

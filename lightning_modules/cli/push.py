"""`hf-transformer push SOURCE REPO_ID`: a training checkpoint (exported first, with its model card) or an exported
folder, to the Hugging Face Hub."""

from __future__ import annotations

import argparse
import pickle
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf_transformer.errors import HubError
from hf_transformer.export import DEFAULT_FORMAT, FORMATS, card_formats, folder_format

from .arguments import positive_int

if TYPE_CHECKING:  # the rest is imported where used, so that `--help` answers at once
    from huggingface_hub import CommitInfo


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
    format: str = DEFAULT_FORMAT,
    average: int | None = None,
) -> CommitInfo:
    """Push a training checkpoint (exported with its model card into a temporary folder first), the average of the
    last `average` checkpoints of a checkpoint folder, or a folder written by `hf-transformer export` (pushed through a
    temporary view whose card names `repo_id`; the folder is only read).

    `format` is one of the formats that carry a model card (`hf_transformer.export.card_formats()`): "marian" pushes
    the model as a stock `MarianMTModel` (converted from a checkpoint or an hf-transformer folder; a folder of that
    format is pushed as it is). `results` (logged metric name -> value, e.g. `test_scores.json` of
    `hf-transformer test`) and `wandb_url` go into the model card. Every failure is a `HubError`.
    """
    from hf_transformer.hub.push import check_repo_id, find_token, push_folder

    from ..checkpoint_export import export_checkpoint, kept_test_scores
    from ..upgrade import described

    source = Path(source)
    check_repo_id(repo_id)
    token = find_token()  # before exporting, which takes a while for a big model
    if not source.exists():
        raise HubError(
            f"Cannot push {source}: no such file or folder. Pass a .ckpt file written by training or a folder written "
            "by `hf-transformer export`."
        )
    if format not in card_formats():
        raise HubError(f"Unknown format {format!r}: push one of {', '.join(card_formats())}.")
    exported_folder = source.is_dir() and not average
    with tempfile.TemporaryDirectory(prefix="hf-transformer-push-") as tmp:
        staged = Path(tmp) / (source.name if source.is_dir() else source.stem)
        card_info = dict(repo_id=repo_id, results=results, wandb_url=wandb_url)
        try:
            if exported_folder:
                _stage_export_folder(source, staged, format, **card_info)
            else:
                checkpoint = _read_checkpoint(source, average)
                kept = None if results else kept_test_scores(source, checkpoint)
                if kept is not None:  # what `hf-transformer test` gave these weights
                    card_info["results"] = kept[0]
                    print(f"Test scores on the model card: {kept[1]}")
                export_checkpoint(described(checkpoint), staged, format, **card_info)
        except ValueError as err:  # a model Marian cannot express, a folder without the facts of its card
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


def main(argv: list[str]) -> None:
    """`hf-transformer push SOURCE REPO_ID [...]`."""
    args = _push_parser().parse_args(argv)
    from ..checkpoint_export import read_results  # once --help has answered: it loads torch and Lightning

    results = read_results(args.results) if args.results else None
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
        average=args.average,
    )
    where = f"pull request {commit.pr_url}" if commit.pr_url else f"commit {commit}"
    print(f"Pushed {args.source} to {args.repo_id}: {where}")


def _push_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-transformer push",
        description="Push a model to the Hugging Face Hub: a training checkpoint (exported first, with its model card) "
        "or a folder written by `hf-transformer export`. The token comes from HF_TOKEN or `hf auth login`.",
    )
    parser.add_argument(
        "source",
        help="a .ckpt file written by training, with --average the folder of the checkpoints, or an exported folder",
    )
    parser.add_argument(
        "--average", type=positive_int, metavar="N", help="push the average of the last N step checkpoints"
    )
    parser.add_argument("repo_id", help="the Hub repo, 'namespace/name' (created if missing)")
    parser.add_argument("--private", action="store_true", help="create the repo private (an existing one is kept)")
    parser.add_argument("--revision", "--branch", help="push to this branch (created from main) or to refs/pr/N")
    parser.add_argument("--commit-message", help="the commit message (default: 'Upload <source> with hf-transformer')")
    parser.add_argument("--create-pr", action="store_true", help="open a pull request against main instead")
    parser.add_argument(
        "--results",
        metavar="JSON",
        help="scores for the model card's model-index: the test_scores.json that `hf-transformer test` writes "
        "(default: for one checkpoint, the scores `hf-transformer test` gave it, kept beside it)",
    )
    parser.add_argument("--wandb-url", help="link of the training run's W&B page, for the model card")
    parser.add_argument(
        "--format",
        choices=card_formats(),
        default=DEFAULT_FORMAT,
        help="; ".join(f"{name}: {FORMATS[name].summary}" for name in card_formats()),
    )
    return parser


def _read_checkpoint(path: Path, average: int | None) -> dict[str, Any]:
    from ..checkpoint_export import checkpoint_to_export

    try:
        return checkpoint_to_export(path, average)
    except (OSError, ValueError, RuntimeError, pickle.UnpicklingError) as err:
        raise HubError(f"Cannot push {path}: not a checkpoint written by TranslationModule ({err}).") from err


def _stage_export_folder(source: Path, staged: Path, format: str, **card_info: Any) -> None:
    """The folder to push for an exported `source`: a view of it, or its Marian conversion, with the card (if it has
    one) rendered for `card_info` (`repo_id`, `results`, `wandb_url`)."""
    from hf_transformer.export import export_folder
    from hf_transformer.hub.model_card import rewrite_model_card
    from hf_transformer.hub.push import check_export_folder

    check_export_folder(source, tokenizer=True)
    source_format = (folder_format(source) or FORMATS[DEFAULT_FORMAT]).name
    if format != source_format and source_format == DEFAULT_FORMAT:  # converted from this package's model
        export_folder(source, staged, format, **card_info)
        return
    if format != source_format:
        raise HubError(f"{source} is an export of --format {source_format}: push it with --format {source_format}.")
    _stage_folder(source, staged)
    rewrite_model_card(source, staged, format=format, **card_info)


def _stage_folder(folder: Path, staged: Path) -> None:
    """A copy of `folder` to push: files hard-linked where possible (weights can be large), the card copied so that
    pointing it at the repo never edits the original."""
    from hf_transformer.hub.model_card import CARD_NAME
    from hf_transformer.model_folder import link_or_copy

    def link_or_copy_card(src: str, dst: str) -> str:
        return shutil.copy2(src, dst) if Path(src).name == CARD_NAME else link_or_copy(src, dst)

    shutil.copytree(folder, staged, copy_function=link_or_copy_card)

"""`hf-transformer export SOURCE FOLDER`: a model folder in any registered format (`hf_transformer.export.FORMATS`:
its `--format` choices and each format's flags come from the registry) from a training checkpoint, several averaged,
or an exported folder."""

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hf_transformer.errors import UserError
from hf_transformer.export import DEFAULT_FORMAT, FORMATS, ExportOption, card_formats

from .arguments import positive_int


def main(argv: list[str]) -> None:
    """`hf-transformer export SOURCE FOLDER [...]`."""
    parser = _parser()
    args = parser.parse_args(argv)
    # Imported once --help has answered: they load torch and Lightning.
    from hf_transformer.export import export_folder
    from hf_transformer.model_folder import written_whole

    from ..checkpoint_export import checkpoint_to_export, export_checkpoint, kept_test_scores, read_results
    from ..upgrade import described

    format = FORMATS[args.format]
    takes = _names(format.options)
    for name in sorted(set().union(*(_names(other.options) for other in FORMATS.values())) - takes):
        if getattr(args, name) != parser.get_default(name):
            takers = " or ".join(other.name for other in FORMATS.values() if name in _names(other.options))
            parser.error(f"--{name.replace('_', '-')} applies to --format {takers} only")
    options = {name: getattr(args, name) for name in takes}
    target = Path(args.folder)
    check_output_folder(target, args.overwrite)
    source = Path(args.checkpoint)
    from_folder = source.is_dir() and (source / "config.json").exists()
    if from_folder and format.name == DEFAULT_FORMAT:
        parser.error(f"{source} is an exported folder already: give a checkpoint, or another --format to convert it")
    if args.results and not format.has_card:
        parser.error(f"--results goes into a model card, which --format {format.name} has none of")
    # The card's snippet loads the folder by its final path, not by the hidden one written first.
    card = dict(repo_id=str(target.resolve()), results=read_results(args.results) if args.results else None)
    try:
        with written_whole(target, keep_other_files=args.overwrite) as folder:
            if from_folder:
                export_folder(source, folder, format.name, **card, **options)
            else:
                checkpoint = checkpoint_to_export(source, args.average)
                kept = None if args.results or not format.has_card else kept_test_scores(source, checkpoint)
                if kept is not None:  # what `hf-transformer test` gave these weights
                    card["results"] = kept[0]
                    print(f"Test scores on the model card: {kept[1]}")
                export_checkpoint(described(checkpoint), folder, format.name, **card, **options)
    except (ImportError, ValueError) as err:  # an extra missing, a pre-LN model, an unknown quantization, a length
        if isinstance(err, UserError):
            raise
        raise UserError(str(err)) from err
    print(f"Exported to {target}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-transformer export",
        description="Write a model folder from a training checkpoint, optionally averaging the last N checkpoints of "
        "its folder, in one of the formats below; a folder written by export converts into the other formats.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "checkpoint", help="a .ckpt file (best, last), with --average the checkpoint folder, or an exported folder"
    )
    parser.add_argument("folder", help="where to write the model folder")
    parser.add_argument(
        "--average", type=positive_int, default=None, metavar="N", help="average the last N step checkpoints"
    )
    parser.add_argument(
        "--format",
        choices=list(FORMATS),
        default=DEFAULT_FORMAT,
        help="; ".join(f"{name}: {format.summary}" for name, format in FORMATS.items()),
    )
    parser.add_argument(
        "--results",
        metavar="JSON",
        help=f"scores for the model card's model-index ({', '.join(card_formats())}): the test_scores.json that "
        "`hf-transformer test` writes (default: for one checkpoint, the scores `hf-transformer test` gave it, kept "
        "beside it)",
    )
    added: set[str] = set()
    for format in FORMATS.values():  # each format's options, as it declares them
        group = parser.add_argument_group(f"with --format {format.name}") if format.options else None
        for option in format.options:
            if option.name not in added and option.type is bool:
                added.add(option.name)
                group.add_argument(f"--{option.name.replace('_', '-')}", action="store_true", help=option.help)
            elif option.name not in added:  # an option that two formats take is one flag
                added.add(option.name)
                group.add_argument(
                    f"--{option.name.replace('_', '-')}",
                    type=_argument_type(option),
                    default=option.default,
                    metavar=option.metavar or option.name.upper(),
                    help=option.help,
                )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a folder that is not empty (files of the same names are replaced)",
    )
    return parser


def _names(options: tuple[ExportOption, ...]) -> set[str]:
    return {option.name for option in options}


def _argument_type(option: ExportOption) -> Callable[[str], Any]:
    """`option.type` for argparse, whose message for a ValueError names the function rather than the problem."""

    def parse(text: str) -> Any:
        try:
            return option.type(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    parse.__name__ = option.type.__name__
    return parse


def check_output_folder(folder: Path, overwrite: bool) -> None:
    """Refuse, before any work, a path that is a file, and a folder whose files the export would replace (a model
    card edited by hand, another model) unless `overwrite`."""
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{folder} is a file: give the path of a new or empty folder to export into")
    if overwrite or not folder.is_dir():
        return
    names = sorted(path.name for path in folder.iterdir())
    if names:
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        raise UserError(
            f"{folder} is not empty ({shown}): export into a new or empty folder, or add --overwrite to replace its "
            "files"
        )

"""`hf-transformer export SOURCE FOLDER`: a Hugging Face folder (or a Marian or CTranslate2 model) from a training
checkpoint, several averaged, or an exported folder."""

import argparse
import sys
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from hf_transformer import TransformerForConditionalGeneration
from hf_transformer.errors import UserError
from hf_transformer.export.folder import check_model_folder, export_marian_from_folder, written_whole

from ..checkpoint import (
    average_checkpoints,
    averaging_span_warning,
    export,
    export_marian,
    last_checkpoints,
    load_checkpoint,
    model_from_checkpoint,
    tokenizer_from_checkpoint,
)
from .models import positive_int


def main(argv: list[str]) -> None:
    """`hf-transformer export SOURCE FOLDER [...]`."""
    parser = argparse.ArgumentParser(
        prog="hf-transformer export",
        description="Write a Hugging Face folder (model with its code, tokenizer, generation config, pipeline) from a "
        "training checkpoint, optionally averaging the last N checkpoints of its folder.",
        allow_abbrev=False,
    )
    parser.add_argument("checkpoint", help="a .ckpt file (best, last), or with --average the checkpoint folder")
    parser.add_argument("folder", help="where to write the Hugging Face model folder")
    parser.add_argument(
        "--average", type=positive_int, default=None, metavar="N", help="average the last N step checkpoints"
    )
    parser.add_argument(
        "--format",
        choices=["hf-transformer", "marian", "ctranslate2", "onnx"],
        default="hf-transformer",
        help="hf-transformer: this model with its code (loads with trust_remote_code=True); marian: the same model as "
        "a stock MarianMTModel, which loads without remote code (post-LN models only); ctranslate2: a CTranslate2 "
        "model (post-LN models only; needs pip install 'hf-transformer[ctranslate2]'); onnx: ONNX programs of the "
        "encoder and the decoder's steps for ONNX Runtime (needs pip install 'hf-transformer[onnx]'). With marian, "
        "ctranslate2 and onnx, the source may also be an exported folder.",
    )
    parser.add_argument(
        "--quantization", help="with --format ctranslate2: the stored weight type, e.g. int8 (default: float32)"
    )
    onnx = parser.add_argument_group("with --format onnx: the shape the programs take (fixed by the static cache)")
    onnx.add_argument("--batch-size", type=positive_int, default=1, help="sources per call (default: 1)")
    onnx.add_argument(
        "--source-length", type=positive_int, help="source tokens per row, padded (default: the model's positions)"
    )
    onnx.add_argument(
        "--max-length",
        type=positive_int,
        help="output tokens, the start token included (default: the model's positions)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a folder that is not empty (files of the same names are replaced)",
    )
    args = parser.parse_args(argv)
    if args.quantization and args.format != "ctranslate2":
        parser.error("--quantization applies to --format ctranslate2 only")
    given = [f"--{name.replace('_', '-')}" for name in ("source_length", "max_length") if getattr(args, name)]
    if args.format != "onnx" and (given or args.batch_size != 1):
        parser.error(f"{', '.join(given) or '--batch-size'} applies to --format onnx only")
    target = Path(args.folder)
    check_output_folder(target, args.overwrite)
    source = Path(args.checkpoint)
    from_folder = args.format != "hf-transformer" and source.is_dir() and (source / "config.json").exists()
    # The card's snippet loads the folder by its final path, not by the hidden one written first.
    card_info = dict(repo_id=str(target.resolve()))
    try:
        with written_whole(target, keep_other_files=args.overwrite) as folder:
            if from_folder:
                checkpoint = None
            elif args.average:
                checkpoints = source if source.is_dir() else source.parent
                checkpoint = average_checkpoints(last_checkpoints(checkpoints, args.average))
                steps = checkpoint["averaged_steps"]
                print(f"Averaged {len(steps)} checkpoints of {checkpoints}, steps {', '.join(map(str, steps))}")
                if warning := averaging_span_warning(steps):
                    print(f"Warning: {warning}", file=sys.stderr)
            else:
                checkpoint = load_checkpoint(source)
            if args.format == "hf-transformer":
                export(checkpoint, folder, **card_info)
            elif args.format == "marian":
                if from_folder:
                    export_marian_from_folder(source, folder, **card_info)
                else:
                    export_marian(checkpoint, folder, **card_info)
            elif from_folder:
                check_model_folder(source)
                model = TransformerForConditionalGeneration.from_pretrained(source)
                tokenizer = PreTrainedTokenizerFast.from_pretrained(source)
                convert(model, tokenizer, folder, args)
            else:
                convert(model_from_checkpoint(checkpoint), tokenizer_from_checkpoint(checkpoint), folder, args)
    except (ImportError, ValueError) as err:  # an extra missing, a pre-LN model, an unknown quantization, a length
        if isinstance(err, UserError):
            raise
        raise UserError(str(err)) from err
    print(f"Exported to {target}")


def convert(
    model: TransformerForConditionalGeneration,
    tokenizer: PreTrainedTokenizerFast,
    folder: Path,
    args: argparse.Namespace,
) -> Path:
    """Write `model` into `folder` in the runtime format `args.format` (ctranslate2, onnx); the converters import
    their extras."""
    if args.format == "ctranslate2":
        from hf_transformer.export.ctranslate2 import to_ctranslate2

        return to_ctranslate2(model, tokenizer, folder, quantization=args.quantization)
    from hf_transformer.export.onnx import to_onnx

    return to_onnx(
        model,
        tokenizer,
        folder,
        batch_size=args.batch_size,
        source_length=args.source_length,
        max_length=args.max_length,
    )


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

"""`hf-transformer`: LightningCLI's fit/validate/test/predict plus `export` and `push`.

hf-transformer fit --config configs/demo.yaml
hf-transformer test --config configs/demo.yaml --ckpt_path runs/demo/checkpoints/last.ckpt
hf-transformer export runs/demo/checkpoints/last.ckpt exports/demo [--average 5]

Lightning, torch and transformers are imported only by the command that needs them, so that `hf-transformer --help`
answers at once.
"""

import argparse
import os
import sys
from pathlib import Path

from .errors import UserError

USAGE = """\
usage: hf-transformer COMMAND [OPTIONS]

Train the Transformer of "Attention Is All You Need", evaluate it, and share it on the Hugging Face Hub.

commands:
  fit        train a model:                hf-transformer fit --config configs/demo.yaml
  validate   loss and BLEU on the validation split of a checkpoint
  test       loss, BLEU and chrF on the test split, with the hypotheses written to a file
  predict    translate the test split of a checkpoint
  export     write a Hugging Face model folder from a checkpoint (or several, averaged)
  push       upload a checkpoint or an exported folder to the Hugging Face Hub

`hf-transformer COMMAND --help` lists a command's options. Errors print one message; add --traceback (or set
HF_TRANSFORMER_TRACEBACK=1) to see where one came from."""

TRAINER_COMMANDS = ("fit", "validate", "test", "predict")


def export_main(argv: list[str]) -> None:
    from transformers import PreTrainedTokenizerFast

    from hf_transformer import TransformerForConditionalGeneration

    from .checkpoint import (
        average_checkpoints,
        averaging_span_warning,
        export,
        export_marian,
        export_marian_from_folder,
        last_checkpoints,
        load_checkpoint,
        model_from_checkpoint,
        tokenizer_from_checkpoint,
    )

    parser = argparse.ArgumentParser(
        prog="hf-transformer export",
        description="Write a Hugging Face folder (model with its code, tokenizer, generation config, pipeline) from a "
        "training checkpoint, optionally averaging the last N checkpoints of its folder.",
        allow_abbrev=False,
    )
    parser.add_argument("checkpoint", help="a .ckpt file (best, last), or with --average the checkpoint folder")
    parser.add_argument("folder", help="where to write the Hugging Face model folder")
    parser.add_argument("--average", type=int, default=None, metavar="N", help="average the last N step checkpoints")
    parser.add_argument(
        "--format",
        choices=["hf-transformer", "marian", "ctranslate2"],
        default="hf-transformer",
        help="hf-transformer: this model with its code (loads with trust_remote_code=True); marian: the same model as "
        "a stock MarianMTModel, which loads without remote code (post-LN models only); ctranslate2: a CTranslate2 "
        "model (post-LN models only; needs pip install 'hf-transformer[ctranslate2]'). With marian and ctranslate2, "
        "the source may also be an exported folder.",
    )
    parser.add_argument(
        "--quantization", help="with --format ctranslate2: the stored weight type, e.g. int8 (default: float32)"
    )
    args = parser.parse_args(argv)
    if args.quantization and args.format != "ctranslate2":
        parser.error("--quantization applies to --format ctranslate2 only")
    source = Path(args.checkpoint)
    from_folder = args.format != "hf-transformer" and source.is_dir() and (source / "config.json").exists()
    if from_folder:
        checkpoint = None
    elif args.average:
        folder = source if source.is_dir() else source.parent
        checkpoint = average_checkpoints(last_checkpoints(folder, args.average))
        steps = checkpoint["averaged_steps"]
        print(f"Averaged {len(steps)} checkpoints of {folder}, steps {', '.join(map(str, steps))}")
        if warning := averaging_span_warning(steps):
            print(f"Warning: {warning}", file=sys.stderr)
    else:
        checkpoint = load_checkpoint(source)
    try:
        if args.format == "hf-transformer":
            folder = export(checkpoint, args.folder)
        elif args.format == "marian":
            folder = (
                export_marian_from_folder(source, args.folder)
                if from_folder
                else export_marian(checkpoint, args.folder)
            )
        else:
            from hf_transformer.ctranslate2 import to_ctranslate2

            if from_folder:
                model = TransformerForConditionalGeneration.from_pretrained(source)
                tokenizer = PreTrainedTokenizerFast.from_pretrained(source)
            else:
                model, tokenizer = model_from_checkpoint(checkpoint), tokenizer_from_checkpoint(checkpoint)
            folder = to_ctranslate2(model, tokenizer, args.folder, quantization=args.quantization)
    except (ImportError, ValueError) as err:  # ctranslate2 missing, a pre-LN model, an unknown quantization
        if isinstance(err, UserError):
            raise
        raise UserError(str(err)) from err
    print(f"Exported to {folder}")


def push_main(argv: list[str]) -> None:
    from .hub import push_main

    push_main(argv)


def run(argv: list[str]) -> None:
    """Run one `hf-transformer` command line (without the program name); errors propagate."""
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    command, *rest = argv
    if command == "export":
        export_main(rest)
    elif command == "push":
        push_main(rest)
    elif command in TRAINER_COMMANDS or command.startswith("-"):
        from .training_cli import TranslationCLI

        # LightningCLI reads sys.argv itself when given None: it warns when both are set.
        TranslationCLI(args=None if argv == sys.argv[1:] else argv)
    else:
        raise UserError(f"unknown command {command!r}: choose one of fit, validate, test, predict, export, push")


def main(argv: list[str] | None = None) -> None:
    """Entry point of `hf-transformer`; `argv` replaces the command line (for calls from Python). A `UserError`
    prints its message alone and exits with status 1; --traceback shows the traceback too."""
    words = sys.argv[1:] if argv is None else argv
    show_traceback = "--traceback" in words or os.environ.get("HF_TRANSFORMER_TRACEBACK", "") not in ("", "0")
    words = [word for word in words if word != "--traceback"]
    try:
        run(words)
    except UserError as err:
        if show_traceback:
            raise
        command = f"hf-transformer {words[0]}" if words else "hf-transformer"
        print(f"{command}: error: {err}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()

"""`hf-transformer`: LightningCLI's fit/validate/test/predict plus `export` and `average`.

hf-transformer fit --config configs/demo.yaml
hf-transformer test --config configs/demo.yaml --ckpt_path runs/demo/checkpoints/last.ckpt
hf-transformer export runs/demo/checkpoints/last.ckpt exports/demo [--average 5]
"""

import argparse
import json
import sys
from pathlib import Path

from lightning.pytorch.cli import LightningCLI
from transformers import AutoTokenizer

from hf_transformer import TransformerForConditionalGeneration

from .checkpoint import (
    average_checkpoints,
    export,
    export_marian,
    export_marian_from_folder,
    last_checkpoints,
    load_checkpoint,
    model_from_checkpoint,
    tokenizer_from_checkpoint,
)
from .data import TranslationDataModule
from .hub import push_main
from .module import TranslationModule


class TranslationCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        # The tokenizer decides the vocabulary and special ids: the model takes them from the data module.
        for name in ("vocab_size", "pad_token_id", "bos_token_id", "eos_token_id"):
            parser.link_arguments(f"data.{name}", f"model.{name}", apply_on="instantiate")

    def after_test(self) -> None:
        """Write the test hypotheses, one per line in test-set order, next to the scores."""
        hypotheses = self.model.gathered_test_hypotheses()
        if self.trainer.is_global_zero:
            folder = Path(self.trainer.log_dir or self.trainer.default_root_dir)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "test_hypotheses.txt").write_text("".join(f"{line}\n" for line in hypotheses))
            scores = {
                name: float(value) for name, value in self.trainer.callback_metrics.items() if name.startswith("test/")
            }
            (folder / "test_scores.json").write_text(json.dumps(scores, indent=2) + "\n")
            print(f"Test hypotheses and scores written to {folder}")


def export_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="hf-transformer export",
        description="Write a Hugging Face folder (model with its code, tokenizer, generation config, pipeline) from a "
        "training checkpoint, optionally averaging the last N checkpoints of its folder.",
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
        paths = last_checkpoints(folder, args.average)
        print(f"Averaging {len(paths)} checkpoints: {', '.join(path.name for path in paths)}")
        checkpoint = average_checkpoints(paths)
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
                model, tokenizer = (
                    TransformerForConditionalGeneration.from_pretrained(source),
                    AutoTokenizer.from_pretrained(source),
                )
            else:
                model, tokenizer = model_from_checkpoint(checkpoint), tokenizer_from_checkpoint(checkpoint)
            folder = to_ctranslate2(model, tokenizer, args.folder, quantization=args.quantization)
    except (ImportError, ValueError) as err:  # ctranslate2 missing, a pre-LN model, an unknown quantization
        parser.error(str(err))
    print(f"Exported to {folder}")


COMMANDS = {"export": export_main, "push": push_main}


def main(argv: list[str] | None = None) -> None:
    """Entry point of `hf-transformer`; `argv` replaces the command line (for calls from Python)."""
    words = sys.argv[1:] if argv is None else argv
    if words and words[0] in COMMANDS:
        COMMANDS[words[0]](words[1:])
        return
    TranslationCLI(
        TranslationModule,
        TranslationDataModule,
        args=argv,
        trainer_defaults={"use_distributed_sampler": False},  # the data module shards its token-budget batches
        save_config_kwargs={"overwrite": True},
    )


if __name__ == "__main__":
    main()

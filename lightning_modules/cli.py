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

from hf_transformer import TransformerForConditionalGeneration

from .checkpoint import (
    average_checkpoints,
    averaging_span_warning,
    export,
    export_marian,
    last_checkpoints,
    load_checkpoint,
    model_from_checkpoint,
    read_checkpoint,
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

    def parse_arguments(self, parser, args) -> None:
        super().parse_arguments(parser, args)
        # LightningCLI reads the hyperparameters of a --ckpt_path file next, and names no file when it cannot.
        ckpt_path = self.config.get(f"{self.config.get('subcommand')}.ckpt_path")
        if ckpt_path and Path(ckpt_path).is_file():
            read_checkpoint(ckpt_path, mmap=True)

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
        choices=["hf-transformer", "marian"],
        default="hf-transformer",
        help="hf-transformer: this model with its code (loads with trust_remote_code=True); marian: the same model as "
        "a stock MarianMTModel, which loads without remote code (post-LN models only). With marian, the source may "
        "also be an exported folder.",
    )
    args = parser.parse_args(argv)
    if args.format == "marian" and Path(args.checkpoint).is_dir() and (Path(args.checkpoint) / "config.json").exists():
        from transformers import AutoTokenizer

        model = TransformerForConditionalGeneration.from_pretrained(args.checkpoint)
        print(f"Exported to {export_marian(model, AutoTokenizer.from_pretrained(args.checkpoint), args.folder)}")
        return
    if args.average:
        folder = Path(args.checkpoint)
        folder = folder if folder.is_dir() else folder.parent
        checkpoint = average_checkpoints(last_checkpoints(folder, args.average))
        steps = checkpoint["averaged_steps"]
        print(f"Averaged {len(steps)} checkpoints of {folder}, steps {', '.join(map(str, steps))}")
        if warning := averaging_span_warning(steps):
            print(f"Warning: {warning}", file=sys.stderr)
    else:
        checkpoint = load_checkpoint(args.checkpoint)
    if args.format == "marian":
        model, tokenizer = model_from_checkpoint(checkpoint), tokenizer_from_checkpoint(checkpoint)
        print(f"Exported to {export_marian(model, tokenizer, args.folder)}")
    else:
        print(f"Exported to {export(checkpoint, args.folder)}")


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

"""A config's training step on this machine (its CUDA GPU, else its CPU) in each precision and attention backend.

    python benchmarks/precision.py --config configs/multi30k.yaml [--data.dataset $MULTI30K_DIR]
    python benchmarks/precision.py --config configs/demo.yaml --rounds 2 --steps 2      # a quick look

Which settings train fastest depends on the processor, not only on its instructions (the results page shows two CPUs
with the same instructions that disagree). This times the config's own model on its
own first training batches (forward, loss, backward, gradient clipping and the AdamW step, as training runs them)
for every combination of `trainer.precision` (32-true, bf16-mixed) and `model.config.attn_implementation` (sdpa,
eager), each from the same initial weights, the settings taking turns in every round. It reports the median target
tokens/s of each and its ratio to 32-true with sdpa (the defaults), and writes them as JSON.
"""

import argparse
import copy
import itertools
import json
import statistics
import time
from pathlib import Path

import torch
from machine import device_name

from lightning_modules.cli.training import TranslationCLI

RESULTS = Path(__file__).resolve().parent / "results"
PRECISIONS = ("32-true", "bf16-mixed")
ATTENTIONS = ("sdpa", "eager")


def training_step(module, optimizers: dict, batch: dict, bf16: bool, clip: float | None) -> None:
    """One update as Lightning runs it: the module's loss under autocast for bf16-mixed, backward, clipping, the
    module's AdamW step and learning-rate schedule."""
    with torch.autocast(module.device.type, dtype=torch.bfloat16, enabled=bf16):
        loss = module.training_loss(batch)
    loss.backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
    optimizers["optimizer"].step()
    optimizers["optimizer"].zero_grad(set_to_none=True)
    optimizers["lr_scheduler"]["scheduler"].step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", action="append", required=True, help="a training config (repeatable)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds in which every setting takes its turn")
    parser.add_argument("--steps", type=int, default=10, help="training steps timed per setting and round")
    parser.add_argument("--out", default=str(RESULTS / "precision.json"))
    args, overrides = parser.parse_known_args()  # the rest go to the training CLI, e.g. --data.dataset PATH
    configs = [word for path in args.config for word in ("--config", path)]
    cli = TranslationCLI(args=[*configs, *overrides, "--trainer.logger", "false"], run=False)
    data = cli.datamodule
    data.setup("fit")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    batches = [
        {name: value.to(device) for name, value in batch.items()}
        for batch in itertools.islice(data.train_dataloader(), args.steps * (args.rounds + 1))
    ]
    clip = cli.trainer.gradient_clip_val
    settings = {}
    for precision, attention in itertools.product(PRECISIONS, ATTENTIONS):
        module = copy.deepcopy(cli.model).to(device).train()  # the same initial weights for every setting
        module.model.set_attn_implementation(attention)
        settings[f"{precision}, {attention}"] = (module, module.configure_optimizers(), precision == "bf16-mixed")
    rates = {name: [] for name in settings}
    for round_index in range(args.rounds + 1):  # round 0 warms up (allocator, kernels): not counted
        chunk = batches[round_index * args.steps : (round_index + 1) * args.steps]
        tokens = sum(int((batch["labels"] != -100).sum()) for batch in chunk)
        for name in settings if round_index % 2 == 0 else reversed(settings):
            module, optimizers, bf16 = settings[name]
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for batch in chunk:
                training_step(module, optimizers, batch, bf16, clip)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if round_index:
                rates[name].append(tokens / (time.perf_counter() - start))
    baseline = statistics.median(rates["32-true, sdpa"])
    report = {
        "config": args.config,
        "device": device_name(device),
        "threads": torch.get_num_threads(),
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "target_tokens_per_sec": {name: statistics.median(values) for name, values in rates.items()},
    }
    report["ratio_to_fp32_sdpa"] = {name: rate / baseline for name, rate in report["target_tokens_per_sec"].items()}
    where = f"{', '.join(args.config)} on {report['device']}"
    print(f"Training step of {where}: target tokens/s, median of {args.rounds} rounds")
    for name, rate in report["target_tokens_per_sec"].items():
        print(f"  {name:<20} {rate:8,.0f}  {report['ratio_to_fp32_sdpa'][name]:.2f}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"Written to {args.out}")


if __name__ == "__main__":
    main()

"""Speed side by side: our model vs MarianMTModel vs nn.Transformer, identical sizes and inputs, alternating runs.

    python benchmarks/speed.py                       # training throughput and peak memory, small and base sizes
    python benchmarks/speed.py --generation          # + generation on Multi30k test_2016_flickr (needs MULTI30K_DIR)
    python benchmarks/speed.py --sizes small --repeats 3 --steps 2 --out /tmp/speed.json   # a quick look

On a CUDA GPU it adds the bf16-mixed section: ours and Marian at the base and big sizes, with 16k- and 64k-token
batches and a 32k vocabulary, eager and under `torch.compile`, with MFU (model FLOPs from `training_flops`, peak
FLOP/s of the GPU from Lightning's table).

Reports medians over `--repeats` alternating rounds and the ratio ours / peer (above 1 means we are faster, or for
memory, that we use more). Results are printed as tables and written as JSON.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from lightning.fabric.utilities.throughput import get_available_flops
from transformers import CompileConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import device_name  # noqa: E402
from multi30k import read_split  # noqa: E402
from peers import PEERS, SIZES, build_marian, build_ours, random_batch  # noqa: E402

from hf_transformer import translate  # noqa: E402
from lightning_modules.callbacks.throughput import training_flops  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def train_throughput(
    size_name: str,
    args: argparse.Namespace,
    peers: list[str],
    max_tokens: int,
    vocab_size: int,
    bf16: bool = False,
    compiled: bool = False,
) -> dict:
    """Target tokens per second of forward + backward + Adam step, median over alternating rounds, and MFU where the
    device's peak FLOP/s is known (our model's `training_flops` of the batch, the same useful work for every model).
    bf16: forward under bf16 autocast, as Lightning's bf16-mixed; compiled: each model's loss also under
    `torch.compile` with dynamic shapes, as the training module compiles ours (`compile_training_loss`). Adam is fused
    on CUDA and multi-tensor elsewhere, as in training. A run that does not fit in GPU memory is reported as None."""
    device = torch.device(args.device)
    size = SIZES[size_name]
    batch = {k: v.to(device) for k, v in random_batch(vocab_size, max_tokens, 20, seed=0).items()}
    target_lengths = (batch["labels"] != -100).sum(-1)
    target_tokens = int(target_lengths.sum())
    runs = {}  # label -> (loss function, model, optimizer)
    for name, compile_loss in [(name, False) for name in peers] + [(name, True) for name in peers if compiled]:
        torch.manual_seed(0)
        model = PEERS[name].build(size, vocab_size).to(device).train()
        fused = device.type == "cuda"
        optimizer = torch.optim.Adam(
            model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=fused, foreach=not fused
        )
        loss = torch.compile(PEERS[name].loss, dynamic=True) if compile_loss else PEERS[name].loss
        runs[f"{name} compiled" if compile_loss else name] = (loss, model, optimizer)
    flops = int(training_flops(runs["ours"][1].config, batch["attention_mask"].sum(-1), target_lengths))
    peak_flops = get_available_flops(device, torch.bfloat16 if bf16 else torch.float32)
    rates = {label: [] for label in runs}
    for round_index in range(args.repeats + 1):  # round 0 warms up (allocator, kernels, compilation): not counted
        for label in runs if round_index % 2 == 0 else reversed(runs):
            if rates[label] is None:
                continue
            loss_function, model, optimizer = runs[label]
            synchronize(device)
            start = time.perf_counter()
            try:
                for _ in range(args.steps):
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                        loss = loss_function(model, batch)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                synchronize(device)
            except torch.OutOfMemoryError:
                # Dropped from the comparison; its model and optimizer state are freed as the loop moves on.
                rates[label] = runs[label] = None
                optimizer.zero_grad(set_to_none=True)
                continue
            if round_index:
                rates[label].append(args.steps * target_tokens / (time.perf_counter() - start))
    medians = {label: statistics.median(values) if values else None for label, values in rates.items()}
    mfu = (
        {label: rate and rate / target_tokens * flops / peak_flops for label, rate in medians.items()}
        if peak_flops
        else None
    )
    return {
        "size": size_name,
        "precision": "bf16-mixed" if bf16 else "32-true",
        "vocab_size": vocab_size,
        "target_tokens_per_batch": target_tokens,
        "tokens_per_sec": medians,
        "ratio_ours_over": {
            label: medians["ours"] and rate and medians["ours"] / rate
            for label, rate in medians.items()
            if label != "ours"
        },
        "model_flops_per_step": flops,
        "peak_flops": peak_flops,
        "mfu": mfu,
    }


def peak_memory_child(name: str, size_name: str, vocab_size: int, max_tokens: int, device: str) -> None:
    """Run in a fresh process: the memory one training step adds on top of the model (activations, gradients,
    Adam state). On CPU the peak resident set size, on CUDA the peak allocated bytes."""
    torch.manual_seed(0)
    model = PEERS[name].build(SIZES[size_name], vocab_size).to(device).train()
    optimizer = torch.optim.Adam(model.parameters())
    batch = {k: v.to(device) for k, v in random_batch(vocab_size, max_tokens, 20, seed=0).items()}
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = resident_bytes("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # Linux: restart the peak (VmHWM) from the current size
    for _ in range(2):
        PEERS[name].loss(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else resident_bytes("VmHWM")
    print(json.dumps({"peak_step_bytes": peak - before}))


def resident_bytes(field: str) -> int:
    """VmRSS (now) or VmHWM (peak since the last reset) of this process, from /proc/self/status."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status: peak memory on CPU needs Linux")


def peak_memory(size_name: str, args: argparse.Namespace) -> dict:
    measured = {}
    for name in args.peers:
        result = subprocess.run(
            [
                sys.executable,
                __file__,
                "--memory-child",
                name,
                size_name,
                "--vocab-size",
                str(args.vocab_size),
                "--max-tokens",
                str(args.max_tokens),
                "--device",
                args.device,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        measured[name] = json.loads(result.stdout.strip().splitlines()[-1])["peak_step_bytes"] / 2**20
    return {
        "size": size_name,
        "peak_step_mib": measured,
        "ratio_ours_over": {name: measured["ours"] / measured[name] for name in measured if name != "ours"},
    }


def generation_speed(args: argparse.Namespace) -> dict:
    """Sentences/s of greedy and beam-4 decoding, ours vs Marian with identical sizes and identical work: both get the
    same length-sorted batches, taking turns batch by batch, and decode exactly `--decode-length` tokens (min = max
    length), since untrained models would otherwise stop at different points. Each model decodes eagerly (the default
    dynamic cache) and compiled (`--decoding compiled`: a static cache and the decoding step compiled by `generate()`,
    see `compiled_decoding`; `forward_compiled` says whether `generate()` did compile it: not in beam search). Then
    our `translate()` (length-sorted token-budget batches, finished sentences leaving the batch) against a naive loop
    of `generate()` over unsorted fixed-size batches, with natural lengths, on a trained model if one is given
    (`--trained`)."""
    from lightning_modules.data.tokenization import train_bpe_tokenizer

    device = torch.device(args.device)
    sentences = [line.strip() for line in read_split("test_2016_flickr", "en")][: args.limit]
    tokenizer = train_bpe_tokenizer([sentences], args.vocab_size, 1)
    size = SIZES[args.generation_size]
    models = {
        name: build(size, len(tokenizer)).to(device).eval()
        for name, build in (("ours", build_ours), ("marian", build_marian))
    }
    encoded = tokenizer(sentences)["input_ids"]
    order = sorted(range(len(sentences)), key=lambda i: len(encoded[i]))
    batches = [
        tokenizer.pad(
            {"input_ids": [encoded[i] for i in order[start : start + args.batch_size]]}, return_tensors="pt"
        ).to(device)
        for start in range(0, len(order), args.batch_size)
    ]
    results = {}
    # Decoder lengths count the start token. Fixed lengths as max/min_length: max_new_tokens would clash with the
    # generation config's max_length.
    decode = dict(do_sample=False, max_length=args.decode_length + 1, min_length=args.decode_length + 1)
    runs = [(name, setting) for setting in args.decoding for name in models]  # ours, marian; eager, compiled
    for mode, options in (("greedy", dict(num_beams=1)), ("beam4", dict(num_beams=4, length_penalty=0.6))):
        for model in models.values():  # whether this mode's generate() compiles the forward, read after its runs
            model.__dict__.pop("_compiled_call", None)
        rates = {run: [] for run in runs}
        for round_index in range(args.repeats + 1):  # round 0 warms up (and compiles) and is not counted
            seconds = dict.fromkeys(runs, 0.0)
            for batch_index, inputs in enumerate(batches):
                # The runs take turns on every batch: the load of a shared machine drifts within a pass over the
                # test set, and this way every run decodes under the same drift.
                for name, setting in runs if (round_index + batch_index) % 2 == 0 else reversed(runs):
                    settings = compiled_decoding() if setting == "compiled" else {}
                    start = time.perf_counter()
                    with torch.inference_mode():
                        models[name].generate(**inputs, **options, **decode, **settings)
                    synchronize(device)
                    seconds[name, setting] += time.perf_counter() - start
            if round_index:
                for run in runs:
                    rates[run].append(len(sentences) / seconds[run])
        medians = {f"{name} {setting}": statistics.median(values) for (name, setting), values in rates.items()}
        best = {name: max(medians[f"{name} {setting}"] for setting in args.decoding) for name in models}
        results[mode] = {
            "sentences_per_sec": medians,
            "ratio_ours_over_marian": {
                setting: medians[f"ours {setting}"] / medians[f"marian {setting}"] for setting in args.decoding
            },
            "ratio_ours_over_marian_each_at_its_best": best["ours"] / best["marian"],
            # transformers compiles the forward of greedy search and sampling, never of beam search: there "compiled"
            # is the static cache alone.
            "forward_compiled": {name: hasattr(model, "_compiled_call") for name, model in models.items()},
        }

    if args.trained:
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        model = AutoModelForSeq2SeqLM.from_pretrained(args.trained).to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(args.trained)
    else:
        model = models["ours"]
    timings = {"translate": [], "naive_loop": []}
    for round_index in range(args.repeats):
        for name in timings if round_index % 2 == 0 else reversed(list(timings)):
            start = time.perf_counter()
            if name == "translate":
                translate(model, tokenizer, sentences, num_beams=4, length_penalty=0.6)
            else:
                naive_loop(model, tokenizer, sentences, args.batch_size)
            timings[name].append(len(sentences) / (time.perf_counter() - start))
    medians = {name: statistics.median(values) for name, values in timings.items()}
    results["batched_translate"] = {
        "model": args.trained or "untrained ours",
        "sentences_per_sec": medians,
        "ratio_translate_over_naive": medians["translate"] / medians["naive_loop"],
    }
    return results


def compiled_decoding() -> dict:
    """The `generate()` arguments of compiled decoding: a static key/value cache, and the decoding step compiled in
    one graph. `generate()` compiles only on GPUs unless told otherwise: `_compile_all_devices` is how transformers'
    own tests compile on a CPU."""
    compile_config = CompileConfig(fullgraph=True)
    compile_config._compile_all_devices = True
    return dict(cache_implementation="static", compile_config=compile_config)


def naive_loop(model, tokenizer, sentences: list[str], batch_size: int) -> list[str]:
    """What one writes first: fixed-size batches in file order, padded to the longest, beam 4 and length penalty 0.6
    (the paper's, whatever the model saved)."""
    outputs = []
    with torch.inference_mode():
        for start in range(0, len(sentences), batch_size):
            inputs = tokenizer(sentences[start : start + batch_size], return_tensors="pt", padding=True).to(
                model.device
            )
            generated = model.generate(
                **inputs, num_beams=4, length_penalty=0.6, max_length=inputs["input_ids"].shape[1] + 51
            )
            outputs += tokenizer.batch_decode(generated, skip_special_tokens=True)
    return outputs


def format_rate(rate: float | None) -> str:
    """A median rate, or why there is none (`train_throughput` drops a model that does not fit in GPU memory)."""
    return f"{rate:.0f}" if rate else "out of memory"


def print_table(title: str, rows: list[list[str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print(f"\n{title}")
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["small", "base"], choices=sorted(SIZES))
    parser.add_argument("--peers", nargs="+", default=list(PEERS), choices=list(PEERS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="training steps timed per round")
    parser.add_argument("--max-tokens", type=int, default=4096, help="token budget of the training batch")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument(
        "--compile", action="store_true", help="also time each model's loss under torch.compile in the first section"
    )
    parser.add_argument(
        "--bf16-section",
        action="store_true",
        help="run the bf16-mixed section (ours and Marian, MFU, torch.compile) on a non-CUDA device too: a smoke test",
    )
    parser.add_argument("--bf16-sizes", nargs="+", default=["base", "big"], choices=sorted(SIZES))
    parser.add_argument(
        "--bf16-max-tokens", type=int, nargs="+", default=[16384, 65536], help="token budgets of the bf16 section"
    )
    parser.add_argument("--bf16-vocab-size", type=int, default=32000, help="vocabulary of the bf16 section")
    parser.add_argument(
        "--no-compile", action="store_true", help="leave out the torch.compile runs of the bf16 section"
    )
    parser.add_argument("--generation", action="store_true")
    parser.add_argument("--generation-size", default="small", choices=sorted(SIZES))
    parser.add_argument(
        "--decoding", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"], help="decoding settings"
    )
    parser.add_argument("--decode-length", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--limit", type=int, default=None, help="use only the first N test sentences")
    parser.add_argument("--trained", default=None, help="an exported model folder for the translate() comparison")
    parser.add_argument("--out", default=str(RESULTS / "speed.json"))
    parser.add_argument("--memory-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        peak_memory_child(*args.memory_child, args.vocab_size, args.max_tokens, args.device)
        return
    if "ours" not in args.peers:
        parser.error("--peers must include ours")

    report = {
        "device": args.device,
        "processor": device_name(args.device),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "training": [
            train_throughput(size, args, args.peers, args.max_tokens, args.vocab_size, compiled=args.compile)
            for size in args.sizes
        ],
    }
    labels = list(report["training"][0]["tokens_per_sec"])
    rows = [["size", *(f"{label} tok/s" for label in labels), *(f"ours/{label}" for label in labels[1:])]]
    for entry in report["training"]:
        rows.append(
            [
                entry["size"],
                *(format_rate(entry["tokens_per_sec"][label]) for label in labels),
                *(f"{ratio:.2f}" if (ratio := entry["ratio_ours_over"][label]) else "" for label in labels[1:]),
            ]
        )
    print_table(f"Training step throughput, target tokens/s (median of {args.repeats}, {args.device})", rows)

    if args.device == "cuda" or args.bf16_section:
        peers = [name for name in args.peers if name in ("ours", "marian")]
        report["bf16_training"] = [
            train_throughput(
                size, args, peers, max_tokens, args.bf16_vocab_size, bf16=True, compiled=not args.no_compile
            )
            for size in args.bf16_sizes
            for max_tokens in args.bf16_max_tokens
        ]
        rows = [["size", "tokens", "model", "tok/s", "MFU", "ours/model"]]
        for entry in report["bf16_training"]:
            for label, rate in entry["tokens_per_sec"].items():
                mfu = entry["mfu"] and entry["mfu"][label]
                ratio = entry["ratio_ours_over"].get(label)
                rows.append(
                    [
                        entry["size"],
                        str(entry["target_tokens_per_batch"]),
                        label,
                        format_rate(rate),
                        f"{mfu:.1%}" if mfu else "n/a",
                        f"{ratio:.2f}" if ratio else "",
                    ]
                )
        print_table(
            f"bf16-mixed training step, target tokens/s and MFU (median of {args.repeats}, {args.device})", rows
        )
    else:
        report["bf16_training"] = "skipped: no CUDA GPU"
        print("\nbf16-mixed training and MFU: skipped, no CUDA GPU (--bf16-section runs it here anyway)")

    if not args.no_memory:
        report["memory"] = [peak_memory(size, args) for size in args.sizes]
        rows = [["size", *(f"{name} MiB" for name in args.peers), *(f"ours/{n}" for n in args.peers[1:])]]
        for entry in report["memory"]:
            rows.append(
                [
                    entry["size"],
                    *(f"{entry['peak_step_mib'][n]:.0f}" for n in args.peers),
                    *(f"{entry['ratio_ours_over'][n]:.2f}" for n in args.peers[1:]),
                ]
            )
        print_table("Peak memory added by a training step", rows)

    if args.generation:
        report["generation"] = generation_speed(args)
        rows = [["decoding", "setting", "ours sent/s", "marian sent/s", "ours/marian"]]
        for mode in ("greedy", "beam4"):
            entry = report["generation"][mode]
            for setting in args.decoding:
                uncompiled = setting == "compiled" and not any(entry["forward_compiled"].values())
                rows.append(
                    [
                        mode,
                        "static cache, forward not compiled" if uncompiled else setting,
                        f"{entry['sentences_per_sec'][f'ours {setting}']:.1f}",
                        f"{entry['sentences_per_sec'][f'marian {setting}']:.1f}",
                        f"{entry['ratio_ours_over_marian'][setting]:.2f}",
                    ]
                )
            rows.append([mode, "each at its best", "", "", f"{entry['ratio_ours_over_marian_each_at_its_best']:.2f}"])
        print_table(
            f"Generation, {args.generation_size} size, Multi30k test (median of {args.repeats}, {args.device})", rows
        )
        entry = report["generation"]["batched_translate"]
        print_table(
            f"translate() vs naive generate() loop, beam 4 ({entry['model']})",
            [
                ["translate sent/s", "naive sent/s", "ratio"],
                [
                    f"{entry['sentences_per_sec']['translate']:.1f}",
                    f"{entry['sentences_per_sec']['naive_loop']:.1f}",
                    f"{entry['ratio_translate_over_naive']:.2f}",
                ],
            ],
        )

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nWritten to {args.out}")


if __name__ == "__main__":
    main()

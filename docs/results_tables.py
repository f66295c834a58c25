"""The tables of the results pages and of README's headline table, generated from what the benchmarks wrote in
`benchmarks/results/*.json`: a number on those pages changes when its JSON does, never by hand.

    python docs/results_tables.py headline      # print one table as Markdown (headline, quality, speed, ...)

The documentation build (`docs/conf.py`) calls `table(name)` for each `<!-- generated: table NAME -->` marker, and a
test checks that README.md holds `table("headline")` as generated.
"""

import argparse
import json
import re
import statistics
import textwrap
from collections import Counter
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
# What the recipe is measured against: the tiny fairseq baseline of Revisit-MMT (github.com/LividWo/Revisit-MMT), the
# same layout as configs/multi30k.yaml, on test_2016_flickr, in the tokenized, lowercased BLEU that Multi30k papers
# report (docs/experiments.md says how it was trained).
ANCHOR = {"name": "Revisit-MMT's tiny fairseq baseline", "tokenized BLEU, lowercased": 41.02}
HEADLINE_TEST = "test_2016_flickr"


@cache
def result(name: str) -> dict | list:
    """`benchmarks/results/<name>.json`."""
    return json.loads((RESULTS / f"{name}.json").read_text(encoding="utf-8"))


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _x(ratio: float) -> str:
    return f"{ratio:.2f}x"


def recipes() -> dict[str, list[dict]]:
    """The Multi30k runs that `benchmarks/quality.py` scored, by recipe (its seeds together), in the order each
    recipe was first scored."""
    grouped: dict[str, list[dict]] = {}
    for run in result("multi30k")["runs"]:
        grouped.setdefault(run["recipe"], []).append(run)
    return grouped


def headline_recipe(runs: list[dict]) -> str:
    """The recipe of `runs` (scored entries) scored on the most seeds, of those the one scored last: README's headline
    and the learning-curve plot, which one seed of a setting tried beside it does not displace."""
    seeds = Counter(run["recipe"] for run in runs)
    scored_last = {run["recipe"]: index for index, run in enumerate(runs)}
    return max(seeds, key=lambda recipe: (seeds[recipe], scored_last[recipe]))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _items(recipe: str) -> list[str]:
    """The settings a recipe's description lists after its version ("hf-transformer 0.4.0: dropout 0.3, ..."),
    commas inside parentheses kept."""
    return [item.strip() for item in re.split(r",\s*(?![^()]*\))", recipe.split(": ", 1)[-1]) if item.strip()]


def setting_label(recipe: str, reference: str) -> str:
    """A short name of `recipe` beside `reference` (the headline's): "the recipe", or the recipe with what this one
    adds or changes; a recipe that shares less than half of the reference's settings keeps its own description."""
    if recipe == reference:
        return "the recipe"
    ours, theirs = _items(recipe), _items(reference)
    if len(set(ours) & set(theirs)) * 2 < len(theirs):
        return recipe.split(": ", 1)[-1]
    added = [item.removeprefix("and ") for item in ours if item not in theirs]
    return "the recipe + " + ", ".join(added) if added else "the recipe"


def _spread(values: list[float]) -> str:
    """Mean ± the standard deviation over seeds; one value alone."""
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{_mean(values):.2f} ± {statistics.stdev(values):.2f}"


def _test_scores(runs: list[dict], split: str, score: str) -> list[float]:
    return [run["average"][split]["scores"][score] for run in runs if split in run["average"]]


def anchor() -> str:
    """The headline: the recipe scored on the most seeds against the anchor, mean ± spread over its seeds."""
    recipe = headline_recipe(result("multi30k")["runs"])
    runs = recipes()[recipe]
    tokenized = _test_scores(runs, HEADLINE_TEST, "tokenized BLEU, lowercased")
    sacrebleu = _test_scores(runs, HEADLINE_TEST, "sacreBLEU")
    rows = [
        [
            f"the recipe (`configs/multi30k.yaml`), {len(runs)} seeds",
            f"**{_spread(tokenized)}**",
            f"{_mean(tokenized) - ANCHOR['tokenized BLEU, lowercased']:+.2f}",
            _spread(sacrebleu),
        ],
        [ANCHOR["name"], f"{ANCHOR['tokenized BLEU, lowercased']:.2f}", "", "not reported"],
    ]
    header = [f"{HEADLINE_TEST}", "tokenized, lowercased BLEU", "against the anchor", "sacreBLEU"]
    return markdown(header, rows)


def settings() -> str:
    """One row per setting tried at the recipe's budget: its seeds, the mean ± spread of its test and val scores."""
    reference = headline_recipe(result("multi30k")["runs"])
    rows = []
    for recipe, runs in recipes().items():
        tokenized = _test_scores(runs, HEADLINE_TEST, "tokenized BLEU, lowercased")
        rows.append(
            [
                setting_label(recipe, reference),
                str(len(runs)),
                _spread(tokenized),
                _spread(_test_scores(runs, HEADLINE_TEST, "sacreBLEU")),
                _spread([run["average"]["val"]["scores"]["sacreBLEU"] for run in runs]),
            ]
        )
    header = ["setting", "seeds", f"{HEADLINE_TEST}: tokenized, lowercased", "sacreBLEU", "val sacreBLEU"]
    return markdown(header, rows)


def later_test_sets() -> str:
    """Each setting's mean sacreBLEU on the later Multi30k test sets, where its seeds were scored on them."""
    reference = headline_recipe(result("multi30k")["runs"])
    grouped = recipes()
    splits = sorted({split for runs in grouped.values() for run in runs for split in run["average"]} - {HEADLINE_TEST})
    splits = [split for split in splits if split.startswith("test")]
    rows = []
    for recipe, runs in grouped.items():
        cells = [
            _spread(scores) if (scores := _test_scores(runs, split, "sacreBLEU")) else "not scored" for split in splits
        ]
        if any(cell != "not scored" for cell in cells):
            rows.append([setting_label(recipe, reference), str(len(runs)), *cells])
    return markdown(["setting", "seeds", *splits], rows)


def runs_detail() -> str:
    """Every scored run, a section per setting: each seed's scores on each test set (decoding chosen on val, the 95%
    interval of the test sacreBLEU where measured, the val -> test gap) and what it trained, where and how long."""
    reference = headline_recipe(result("multi30k")["runs"])
    sections = []
    for recipe, runs in recipes().items():
        scores, times = [], []
        for run in runs:
            average, decoding = run["average"], run["average"]["decoding"]
            for split in (split for split in average if split.startswith("test")):
                test = average[split]
                sacrebleu = f"{test['scores']['sacreBLEU']:.2f}"
                if "sacrebleu_interval_95" in test:  # runs scored before quality.py measured it have none
                    sacrebleu += f" ± {test['sacrebleu_interval_95']:.2f}"
                scores.append(
                    [
                        str(run["seed"]),
                        split,
                        f"{average['val']['scores']['sacreBLEU']:.2f}",
                        sacrebleu,
                        f"{test['scores']['tokenized BLEU, lowercased']:.2f}",
                        f"{average['val_to_test_gap'][split]:+.2f}",
                        f"{len(run['averaged_checkpoints'])} / {decoding['num_beams']} / {decoding['length_penalty']}",
                    ]
                )
            tokens, rate = run["target_tokens"], run["target_tokens_per_sec"]
            times.append(
                [
                    str(run["seed"]),
                    run["device"] or "not recorded",
                    f"{run['steps']:,}",
                    f"{tokens / 1e6:.1f} M" if tokens else "not recorded",
                    f"{run['training_minutes']:.0f}",
                    f"{rate:,.0f}" if rate else "not recorded",
                ]
            )
        header = ["seed", "test set", "val sacreBLEU", "test sacreBLEU", "tokenized, lowercased", "gap"]
        header += ["averaged / beam / length penalty"]
        time_header = ["seed", "trained on", "steps", "target tokens", "minutes", "target tokens/s (median)"]
        label = setting_label(recipe, reference)
        sections.append(
            f"### {label[:1].upper() + label[1:]}\n\n{recipe}.\n\n{markdown(header, scores)}\n\n"
            f"{markdown(time_header, times)}"
        )
    return "\n\n".join(sections)


def quality_signatures() -> str:
    """How each score of `quality` was computed."""
    how = result("multi30k")["runs"][-1]["average"]["test_2016_flickr"]["how"]
    rows = [[name, "`" + text.replace("|", "\\|") + "`"] for name, text in how.items()]
    return markdown(["score", "how it was computed"], rows)


def training_speed() -> str:
    """Training throughput against Marian's and `nn.Transformer`'s on the same batches (`benchmarks/speed.py`)."""
    speed = result("speed")
    rows = []
    for entry in speed["training"]:
        rates = entry["tokens_per_sec"]
        rows.append(
            [
                f"{entry['size']}, {entry['precision']}, {entry['target_tokens_per_batch']:,}-token batches",
                *(f"{rates[peer]:,.0f}" for peer in ("ours", "marian", "nn.Transformer")),
                *(_x(entry["ratio_ours_over"][peer]) for peer in ("marian", "nn.Transformer")),
            ]
        )
    header = ["model", "ours, tok/s", "Marian", "nn.Transformer", "ours / Marian", "ours / nn.Transformer"]
    return markdown(header, rows)


def training_memory() -> str:
    """Peak memory of a training step (`benchmarks/speed.py`)."""
    rows = [
        [entry["size"], *(f"{entry['peak_step_mib'][peer]:,.0f}" for peer in ("ours", "marian", "nn.Transformer"))]
        for entry in result("speed")["memory"]
    ]
    return markdown(["model", "ours, MiB", "Marian, MiB", "nn.Transformer, MiB"], rows)


def decoding_speed() -> str:
    """Decoding against Marian's `generate()`, and `translate()` against a loop of `generate()` (`speed.py`)."""
    generation = result("speed")["generation"]
    rows = []
    for search in ("greedy", "beam4"):
        rates = generation[search]["sentences_per_sec"]
        for mode in ("eager", "compiled"):
            rows.append(
                [
                    f"`generate()`, {search.replace('beam4', 'beam 4')}, {mode}",
                    f"{rates[f'ours {mode}']:,.1f}",
                    f"{rates[f'marian {mode}']:,.1f} (Marian)",
                    _x(generation[search]["ratio_ours_over_marian"][mode]),
                ]
            )
    batched = generation["batched_translate"]
    rows.append(
        [
            "`translate()` (length-sorted, token budget, shrinking beam search)",
            f"{batched['sentences_per_sec']['translate']:,.1f}",
            f"{batched['sentences_per_sec']['naive_loop']:,.1f} (a loop of `generate()`)",
            _x(batched["ratio_translate_over_naive"]),
        ]
    )
    return markdown(["decoding", "ours, sentences/s", "peer, sentences/s", "ratio"], rows)


def deployment() -> str:
    """Translating the test sentences with each engine, at each size and number of threads (`benchmarks/deploy.py`)."""
    rows = []
    for size, measured in result("deploy")["sizes"].items():
        for threads, engines in measured["threads"].items():
            peer = engines["ctranslate2 int8"]["sentences_per_sec"]
            for engine, numbers in engines.items():
                rows.append(
                    [
                        f"{size}, {threads} thread{'s' if threads != '1' else ''}",
                        f"`{engine}`",
                        f"{numbers['sentences_per_sec']:,.1f}",
                        f"{numbers['target_tokens_per_sec']:,.0f}",
                        _x(numbers["sentences_per_sec"] / peer),
                        f"{numbers['bleu']:.2f}" if "bleu" in numbers else "-",
                        f"{numbers['same_as_translate_float32']:,} of {measured['sentences']:,}",
                        f"{numbers['memory_loaded_mib']:,.0f} / {numbers['memory_peak_mib']:,.0f}",
                    ]
                )
    header = [
        "model, threads",
        "engine",
        "sentences/s",
        "target tokens/s",
        "against CTranslate2 int8",
        "sacreBLEU",
        "same output as translate() float32",
        "memory, MiB: loaded / peak",
    ]
    return markdown(header, rows)


def _int8_against_ctranslate2(size: str, shortlist: bool = False, threads: str = "1") -> float:
    """`translate()` int8 against CTranslate2 int8, both without or both with the shortlist."""
    engines = result("deploy")["sizes"][size]["threads"][threads]
    suffix = " + shortlist" if shortlist else ""
    ours, theirs = engines[f"translate() int8{suffix}"], engines[f"ctranslate2 int8{suffix}"]
    return ours["sentences_per_sec"] / theirs["sentences_per_sec"]


def serving() -> str:
    """The server against a plain loop and two other serving stacks (`benchmarks/serve.py`)."""
    settings = result("serve")["settings"]
    rows = [
        [name, f"{numbers['sentences_per_sec']:,.1f}", f"{numbers['p50_ms']:,.0f}", f"{numbers['p99_ms']:,.0f}"]
        for name, numbers in settings.items()
    ]
    return markdown(["setting", "sentences/s", "p50, ms", "p99, ms"], rows)


def padding() -> str:
    """Real tokens over padded tokens of the training batches (`benchmarks/padding.py`)."""
    rows = [
        [
            f"{entry['max_tokens']:,}",
            f"{entry['pairs_per_batch']:,.0f}",
            f"{entry['token_budget']:.3f}",
            f"{entry['random']:.3f}",
        ]
        for entry in result("padding")
    ]
    return markdown(["max_tokens", "pairs per batch", "token-budget batches", "random batches"], rows)


def precision() -> str:
    """The training step in each precision and attention, as a ratio to fp32 with sdpa (`benchmarks/precision.py`),
    on each device it ran on."""
    settings = list(result("precision")["ratio_to_fp32_sdpa"])
    rows = []
    for name in sorted(path.stem for path in RESULTS.glob("precision*.json")):
        run = result(name)
        where = f"{run.get('device', 'CPU')}, {run['threads']} threads (`{name}.json`)"
        rows.append([where, *(_x(run["ratio_to_fp32_sdpa"][setting]) for setting in settings)])
    return markdown(["device", *settings], rows)


def data_scale() -> str:
    """Preparing a corpus, by size (`benchmarks/data_scale.py`): the time of each phase of a first run, and the second
    run's time to its first batch."""
    rows = []
    for entry in result("data_scale")["sizes"]:
        phases = entry["first_run"]["phases_s"]
        rows.append(
            [
                f"{entry['pairs']:,}",
                *(f"{phases[phase]:,.1f}" for phase in ("read", "tokenizer", "tokenize", "plan", "first_batch")),
                f"{entry['second_run']['to_first_batch_s']:,.1f}",
            ]
        )
    header = ["pairs", "read, s", "tokenizer, s", "tokenize, s", "plan, s", "first batch, s", "second run, s"]
    return markdown(header, rows)


def data_scale_memory() -> str:
    """The same runs' peak memory, tokenization rate against `encode_batch`, cache size and two DDP processes."""
    rows = []
    for entry in result("data_scale")["sizes"]:
        first, phases = entry["first_run"], entry["first_run"]["phases_s"]
        ddp, tokenization = entry.get("ddp_2_processes"), entry.get("tokenization")
        rows.append(
            [
                f"{entry['pairs']:,}",
                f"{first['peak_anonymous_memory_mib']:,.0f} / {first['peak_memory_mib']:,.0f}",
                f"{entry['second_run']['peak_anonymous_memory_mib']:,.0f}",
                f"{entry['pairs'] / phases['tokenize']:,.0f}",
                " / ".join(_x(tokenization[f"ratio_to_{name}"]) for name in ("encode_batch", "encode_batch_fast"))
                if tokenization
                else "not run",
                f"{entry['cache_mib']:,.0f}",
                " / ".join(f"{rank['peak_memory_mib']:,.0f}" for rank in ddp["ranks"]) if ddp else "not run",
            ]
        )
    header = ["pairs", "first run: peak anonymous / resident MiB", "second run: peak anonymous MiB"]
    header += ["first run: pairs/s tokenized", "tokenization: x encode_batch / x encode_batch_fast", "cache MiB"]
    header += ["DDP: peak resident MiB per rank"]
    return markdown(header, rows)


def data_scale_streaming() -> str:
    """The streamed loader (`data.streaming`) of the same corpora: the tokenizer learnt from the stream, the time to
    the first batch (first run, and second with the tokenizer cached), its steady rate and peak memory."""
    rows = []
    for entry in result("data_scale")["sizes"]:
        if "streaming" not in entry:
            continue
        first, second = entry["streaming"]["first_run"], entry["streaming"]["second_run"]
        rows.append(
            [
                f"{entry['pairs']:,}",
                f"{first['phases_s']['tokenizer']:,.1f}",
                f"{first['to_first_batch_s']:,.1f}",
                f"{second['to_first_batch_s']:,.1f}",
                f"{second['batches_per_s']:,.2f}",
                f"{second['target_tokens_per_s']:,.0f}",
                f"{max(first['peak_anonymous_memory_mib'], second['peak_anonymous_memory_mib']):,.0f}",
            ]
        )
    header = ["pairs", "tokenizer, s", "first run: first batch, s", "second run: first batch, s", "batches/s"]
    header += ["target tokens/s", "peak anonymous MiB"]
    return markdown(header, rows)


def ensemble() -> str:
    """Each seed of the demo trained briefly and their ensembles, on the demo's test split (`benchmarks/ensemble.py`),
    each ensemble against the mean of its seeds."""
    report = result("ensemble")
    members = {member["seed"]: member for member in report["members"]}
    rows = [
        [f"seed {seed}", f"{member['sacrebleu']:.2f}", f"{member['exact_match']:.1%}", ""]
        for seed, member in members.items()
    ]
    for entry in report["ensembles"]:
        mean = _mean([members[seed]["sacrebleu"] for seed in entry["seeds"]])
        rows.append(
            [
                f"ensemble of seeds {', '.join(map(str, entry['seeds']))}, mean of the {entry['average']}",
                f"{entry['sacrebleu']:.2f}",
                f"{entry['exact_match']:.1%}",
                f"{entry['sacrebleu'] - mean:+.2f}",
            ]
        )
    return markdown(["model", "sacreBLEU", "numbers exactly right", "against the mean of its seeds"], rows)


def ensemble_cost() -> str:
    """Seconds per sentence of one model and of the ensemble of all seeds, taking turns (`benchmarks/ensemble.py`)."""
    report = result("ensemble")
    cost = report["cost"]
    seconds = cost["seconds_per_sentence"]
    row = [
        f"{report['device']}, {report['threads']} threads, {cost['sentences']} test sentences",
        f"{seconds['one_model'] * 1000:,.1f}",
        f"{seconds['ensemble'] * 1000:,.1f}",
        _x(cost["ratio_ensemble_over_one_model"]),
    ]
    header = ["device", "one model, ms/sentence", f"ensemble of {len(report['seeds'])}, ms/sentence", "ratio"]
    return markdown(header, [row])


def headline() -> str:
    """README's one table: quality and speed, each row with the command that reproduces it."""
    recipe = headline_recipe(result("multi30k")["runs"])
    runs = recipes()[recipe]
    tests = [run["average"]["test_2016_flickr"]["scores"] for run in runs]
    sacrebleu = _mean([test["sacreBLEU"] for test in tests])
    tokenized = _mean([test["tokenized BLEU, lowercased"] for test in tests])
    seeds = f"mean of {len(runs)} seeds" if len(runs) > 1 else f"seed {runs[0]['seed']}"
    counts = sorted({len(run["averaged_checkpoints"]) for run in runs})  # several where each seed's val chose
    averaged = f"average of the last {' or '.join(map(str, counts))}"
    speed = result("speed")
    small = next(entry for entry in speed["training"] if entry["size"] == "small")
    batched = speed["generation"]["batched_translate"]
    rows = [
        [
            f"Multi30k en-de test_2016_flickr, sacreBLEU / tokenized lowercased BLEU: {recipe}, "
            f"{runs[0]['steps']:,} steps, {seeds}, {averaged}",
            f"{sacrebleu:.2f} / {tokenized:.2f}",
            "`hf-transformer fit --config configs/multi30k.yaml` with the precision and attention the row names "
            "(`--trainer.precision`, `--model.config.attn_implementation`), then `python benchmarks/quality.py "
            "--run-dir runs/multi30k`",
        ],
        [
            "training throughput against Marian / `nn.Transformer` (small model, CPU)",
            f"{_x(small['ratio_ours_over']['marian'])} / {_x(small['ratio_ours_over']['nn.Transformer'])}",
            "`python benchmarks/speed.py`",
        ],
        [
            "`translate()` against a loop of `generate()` (sentences/s)",
            _x(batched["ratio_translate_over_naive"]),
            "`python benchmarks/speed.py`",
        ],
        [
            "`translate(int8=True)` against CTranslate2 int8 (sentences/s, CPU, 1 thread), both without / both with a "
            "shortlist: Multi30k model; base size",
            "; ".join(
                f"{_x(_int8_against_ctranslate2(size))} / {_x(_int8_against_ctranslate2(size, shortlist=True))}"
                for size in ("multi30k", "base")
            ),
            "`python benchmarks/deploy.py multi30k --model exports/multi30k`, `python benchmarks/deploy.py base`",
        ],
    ]
    return markdown(["result", "value", "reproduce"], rows)


# --- plots -------------------------------------------------------------------------------------------------------


def _figure(width: float, height: float):
    """A matplotlib figure drawn without pyplot (no window, no global state)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def quality_by_setting_plot(out: Path) -> "Figure":
    """Each setting's test_2016_flickr tokenized, lowercased BLEU: a dot per seed, the mean ± spread over its seeds,
    the anchor as a line."""
    reference = headline_recipe(result("multi30k")["runs"])
    grouped = list(reversed(recipes().items()))  # the first scored on top
    figure = _figure(8, 0.5 * len(grouped) + 1.5)
    axes = figure.add_subplot()
    scores = []
    for row, (recipe, runs) in enumerate(grouped):
        values = _test_scores(runs, HEADLINE_TEST, "tokenized BLEU, lowercased")
        scores += values
        colour = "C0" if recipe == reference else "C7"
        axes.scatter(values, [row] * len(values), color=colour, alpha=0.5, s=18, zorder=2)
        spread = statistics.stdev(values) if len(values) > 1 else 0
        axes.errorbar(_mean(values), row, xerr=spread, fmt="D", color=colour, capsize=4, markersize=6, zorder=3)
    labels = [textwrap.fill(f"{setting_label(recipe, reference)} ({len(runs)})", 45) for recipe, runs in grouped]
    axes.set_yticks(range(len(grouped)), labels, fontsize=8)
    target = ANCHOR["tokenized BLEU, lowercased"]
    axes.axvline(target, color="C3", linestyle="--", linewidth=1.2)
    axes.text(target, len(grouped) - 0.4, f" anchor {target:.2f}", color="C3", fontsize=8, ha="left", va="center")
    axes.set_xlim(min(scores) - 0.3, max(target, max(scores)) + 0.6)
    axes.set_ylim(-0.6, len(grouped) - 0.1)
    axes.set_xlabel(f"{HEADLINE_TEST}, tokenized lowercased BLEU")
    axes.set_title("Each setting (seeds): a dot per seed, their mean ± standard deviation", fontsize=10)
    axes.grid(axis="x", alpha=0.3)
    figure.savefig(out, dpi=110)
    return figure


def learning_curves_plot(out: Path, runs: list[dict] | None = None) -> "Figure":
    """Training loss, validation loss and validation BLEU over the steps of each seed of a recipe (by default the
    headline's), one colour a seed. The seeds train on the same batches in the same order (the data's own seed), so
    their training losses all but coincide: the panel shows their mean and their range. A seed whose validation ran on
    another sample of val than the first seed's is drawn dashed, its sample named in the legend: its validation
    scores compare with the others' only in shape."""
    if runs is None:
        scored = result("multi30k")["runs"]
        runs = [run for run in recipes()[headline_recipe(scored)] if run.get("learning_curve", {}).get("train_loss")]
    figure = _figure(13, 4.2)
    losses, validation, bleu = figure.subplots(1, 3)
    steps = [step for step, _ in runs[0]["learning_curve"]["train_loss"]]
    by_step = [dict(map(tuple, run["learning_curve"]["train_loss"])) for run in runs]
    steps = [step for step in steps if all(step in logged for logged in by_step)]
    values = [[logged[step] for logged in by_step] for step in steps]
    losses.fill_between(steps, [min(v) for v in values], [max(v) for v in values], color="C0", alpha=0.3, lw=0)
    losses.plot(steps, [_mean(v) for v in values], color="C0", linewidth=1, label=f"mean of {len(runs)} seeds")
    losses.set(xlabel="step", ylabel="cross-entropy per target token", title="Training loss (label-smoothed)")
    losses.set_ylim(top=min(6, losses.get_ylim()[1]))
    losses.legend(fontsize=8, title="shaded: lowest to highest seed", title_fontsize=8)
    first_sample = runs[0].get("validation_sample")
    for colour, run in enumerate(runs):
        logged, sample = run["learning_curve"], run.get("validation_sample")
        style = dict(linestyle="-" if sample == first_sample else "--", marker="o", markersize=3, color=f"C{colour}")
        label = f"seed {run['seed']}" + (f": {sample}" if sample != first_sample else "")
        if logged["val_loss"]:
            validation.plot(*zip(*logged["val_loss"], strict=True), **style, label=label)
        if logged["val_bleu"]:
            bleu.plot(*zip(*logged["val_bleu"], strict=True), **style, label=label)
    title = "Validation loss" + (f" on {first_sample}" if first_sample else "")
    validation.set(xlabel="step", title=title)
    validation.legend(fontsize=8)
    bleu.set(xlabel="step", ylabel="sacreBLEU", title="Validation BLEU (beam 4), same samples")
    bleu.legend(fontsize=8)
    for axes in (losses, validation, bleu):
        axes.grid(alpha=0.3)
    figure.suptitle(f"Multi30k en-de, {runs[-1]['steps']:,} updates, {len(runs)} seeds", fontsize=10)
    figure.savefig(out, dpi=110)
    return figure


def speed_plot(out: Path) -> "Figure":
    """Training throughput of ours, Marian and `nn.Transformer` on the same batches, and decoding speed against
    Marian's `generate()` and a loop of `generate()` (`benchmarks/speed.py`), ours labelled with its ratio."""
    speed = result("speed")
    figure = _figure(11, 3.8)
    training, decoding = figure.subplots(1, 2)
    width = 0.26
    for index, peer in enumerate(("ours", "marian", "nn.Transformer")):
        rates = [entry["tokens_per_sec"][peer] for entry in speed["training"]]
        positions = [row + (index - 1) * width for row in range(len(rates))]
        training.barh(positions, rates, height=width, color=f"C{index}", label=peer.replace("marian", "Marian"))
    for row, entry in enumerate(speed["training"]):
        ratios = entry["ratio_ours_over"]
        text = f" {_x(ratios['marian'])} Marian, {_x(ratios['nn.Transformer'])} nn.Transformer"
        training.text(entry["tokens_per_sec"]["ours"], row - width, text, va="center", fontsize=8)
    training.set_yticks(range(len(speed["training"])), [f"{entry['size']} model" for entry in speed["training"]])
    training.invert_yaxis()
    training.set_xlim(right=training.get_xlim()[1] * 1.6)
    training.set(xlabel="target tokens/s", title="Training, one CPU process")
    training.legend(fontsize=8, loc="lower right")
    generation = speed["generation"]
    rows = []
    for search in ("greedy", "beam4"):
        rates = generation[search]["sentences_per_sec"]
        rows.append((f"generate(), {search.replace('beam4', 'beam 4')}", rates["ours eager"], rates["marian eager"]))
    batched = generation["batched_translate"]["sentences_per_sec"]
    rows.append(("translate() against a loop of generate()", batched["translate"], batched["naive_loop"]))
    for row, (_, ours, theirs) in enumerate(rows):
        decoding.barh(row - width / 2, ours, height=width, color="C0", label="ours" if row == 0 else None)
        decoding.barh(row + width / 2, theirs, height=width, color="C1", label="peer" if row == 0 else None)
        decoding.text(ours, row - width / 2, f" {_x(ours / theirs)}", va="center", fontsize=8)
    decoding.set_yticks(range(len(rows)), [name for name, _, _ in rows], fontsize=8)
    decoding.invert_yaxis()
    decoding.set_xlim(right=decoding.get_xlim()[1] * 1.15)
    decoding.set(xlabel="sentences/s", title="Decoding the test set (eager)")
    decoding.legend(fontsize=8, loc="lower right")
    for axes in (training, decoding):
        axes.grid(axis="x", alpha=0.3)
    figure.savefig(out, dpi=110)
    return figure


PLOTS: dict[str, Callable[[Path], "Figure"]] = {
    "quality_by_setting": quality_by_setting_plot,
    "learning_curves": learning_curves_plot,
    "speed": speed_plot,
}


def plot(name: str, out: Path) -> Path:
    """Draw the plot `name` (a key of `PLOTS`) into the PNG `out`."""
    if name not in PLOTS:
        raise KeyError(f"no plot {name!r}: choose one of {', '.join(PLOTS)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    PLOTS[name](out)
    return out


TABLES: dict[str, Callable[[], str]] = {
    function.__name__: function
    for function in (
        headline,
        anchor,
        settings,
        later_test_sets,
        runs_detail,
        quality_signatures,
        training_speed,
        training_memory,
        decoding_speed,
        deployment,
        serving,
        padding,
        precision,
        data_scale,
        data_scale_memory,
        data_scale_streaming,
        ensemble,
        ensemble_cost,
    )
}


def table(name: str) -> str:
    """The Markdown table `name` (a key of `TABLES`)."""
    if name not in TABLES:
        raise KeyError(f"no table {name!r}: choose one of {', '.join(TABLES)}")
    return TABLES[name]()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Print a results table as Markdown, or draw a plot (--plot PNG).")
    parser.add_argument("name", choices=[*TABLES, *PLOTS])
    parser.add_argument("--plot", metavar="PNG", help="draw the plot NAME into this file")
    args = parser.parse_args()
    if args.name in PLOTS:
        print(plot(args.name, Path(args.plot or f"{args.name}.png")))
    else:
        print(table(args.name))

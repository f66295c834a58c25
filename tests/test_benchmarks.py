"""Every benchmark script runs end to end at a tiny size, so the scripts never rot, and its results hold what the
results pages rest on (ratios of its own rates, agreement counts, a comparison's sign); these runs take tens of
seconds each and are marked slow (`pytest -m slow`, the second command CI runs). No timing is asserted: speed is
reported by running the scripts by hand (see README.md). The scripts' helpers are tested directly."""

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import DEMO, multi30k_dir, tiny_module

from lightning_modules.cli import main

# The demo at the tiny size of `run_dir`'s tiny.yaml: the short runs the benchmarks are tried on.
TINY_FIT = ("fit", "--config", str(DEMO), "--config", "tiny.yaml")

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
# speed.py at the smallest size that still runs every model: one round of one step on a 256-token batch, on every
# device (on a CUDA GPU the bf16 section runs too, as tiny).
TINY_SPEED = ("--sizes", "small", "--repeats", "1", "--steps", "1", "--max-tokens", "256", "--vocab-size", "300")
TINY_BF16 = ("--bf16-sizes", "small", "--bf16-max-tokens", "256", "--bf16-vocab-size", "300", "--no-compile")


def run(*args: str, cwd: Path | None = None) -> str:
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600, cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_speed_benchmark_runs(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from peers import random_batch

    out = tmp_path / "speed.json"
    stdout = run(str(BENCHMARKS / "speed.py"), *TINY_SPEED, *TINY_BF16, "--out", str(out))
    report = json.loads(out.read_text())
    (training,) = report["training"]
    rates = training["tokens_per_sec"]
    assert set(rates) == {"ours", "marian", "nn.Transformer"} and all(rate > 0 for rate in rates.values())
    # Every model trains on the same batch, whose target tokens the rates count; ratios are ours over the peer's.
    batch = random_batch(300, 256, 20, seed=0)
    assert training["target_tokens_per_batch"] == int((batch["labels"] != -100).sum())
    assert training["ratio_ours_over"] == {
        peer: pytest.approx(rates["ours"] / rate) for peer, rate in rates.items() if peer != "ours"
    }
    (memory,) = report["memory"]
    assert set(memory["peak_step_mib"]) == {"ours", "marian", "nn.Transformer"}
    assert memory["ratio_ours_over"] == {
        peer: pytest.approx(memory["peak_step_mib"]["ours"] / mib)
        for peer, mib in memory["peak_step_mib"].items()
        if peer != "ours"
    }
    assert "Training step throughput" in stdout
    assert report["processor"] not in ("", "cpu", "cuda")
    if torch.cuda.is_available():
        assert [entry["size"] for entry in report["bf16_training"]] == ["small"]
    else:
        assert report["bf16_training"] == "skipped: no CUDA GPU"


@pytest.mark.slow
def test_bf16_section_of_the_speed_benchmark_runs(tmp_path):
    """The GPU section (bf16-mixed, MFU), forced onto the CPU; torch.compile is left out for time (see
    test_training_step.py). On a CPU Lightning knows no peak FLOP/s, so there is no MFU."""
    out = tmp_path / "speed.json"
    speed = (str(BENCHMARKS / "speed.py"), *TINY_SPEED, "--peers", "ours", "marian", "--no-memory", "--device", "cpu")
    run(*speed, "--bf16-section", *TINY_BF16, "--out", str(out))
    (entry,) = json.loads(out.read_text())["bf16_training"]
    assert entry["precision"] == "bf16-mixed" and set(entry["tokens_per_sec"]) == {"ours", "marian"}
    assert all(entry["tokens_per_sec"].values()) and entry["vocab_size"] == 300
    assert entry["model_flops_per_step"] > 0 and entry["mfu"] is None


@pytest.mark.slow
def test_generation_benchmark_runs(tmp_path):
    multi30k_dir()
    out = tmp_path / "speed.json"
    run(
        str(BENCHMARKS / "speed.py"),
        *TINY_SPEED,
        "--peers",
        "ours",
        "--no-memory",
        "--generation",
        "--limit",
        "16",
        "--decode-length",
        "3",
        "--batch-size",
        "8",
        "--out",
        str(out),
    )
    generation = json.loads(out.read_text())["generation"]
    assert set(generation) == {"greedy", "beam4", "batched_translate"}
    # generate() compiles the forward of greedy search, for both models, and never of beam search.
    assert generation["greedy"]["forward_compiled"] == {"ours": True, "marian": True}
    assert generation["beam4"]["forward_compiled"] == {"ours": False, "marian": False}


@pytest.mark.slow
def test_precision_benchmark_times_every_precision_and_attention(tmp_path):
    out = tmp_path / "precision.json"
    quick = ("--rounds", "1", "--steps", "1", "--out", str(out))
    stdout = run(str(BENCHMARKS / "precision.py"), "--config", str(DEMO), *quick, cwd=tmp_path)
    report = json.loads(out.read_text())
    settings = {f"{p}, {a}" for p in ("32-true", "bf16-mixed") for a in ("sdpa", "eager")}
    rates = report["target_tokens_per_sec"]
    assert set(rates) == settings and all(rate > 0 for rate in rates.values())
    assert report["ratio_to_fp32_sdpa"] == {
        name: pytest.approx(rate / rates["32-true, sdpa"]) for name, rate in rates.items()
    }
    assert report["device"] not in ("", "cpu")  # the processor by name: which one is fastest depends on it
    assert "bf16-mixed, eager" in stdout


def test_the_precision_benchmarks_bf16_step_multiplies_in_bf16_and_its_32_bit_step_in_float32(monkeypatch):
    """What the benchmark times as bf16-mixed is a step whose linear layers compute in bfloat16 (autocast), and what
    it times as 32-true one in float32: a setting whose precision were ignored would time the same step twice."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from precision import training_step

    module = tiny_module()
    batch = {
        "input_ids": torch.tensor([[5, 6, 7, 2]]),
        "attention_mask": torch.ones(1, 4, dtype=torch.long),
        "labels": torch.tensor([[8, 9, 2]]),
    }
    seen = []
    for layer in module.modules():
        if isinstance(layer, torch.nn.Linear):
            layer.register_forward_hook(lambda _, __, output: seen.append(output.dtype))
    for bf16, expected in ((True, torch.bfloat16), (False, torch.float32)):
        seen.clear()
        training_step(module, module.configure_optimizers(), batch, bf16, clip=1.0)
        assert seen and set(seen) == {expected}, (bf16, set(seen))


def test_learning_curve_of_a_resumed_run_joins_its_logs(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from quality import read_metrics

    header = "epoch,step,train/loss,val/bleu\n"
    first, second = tmp_path / "version_0.csv", tmp_path / "version_1.csv"
    first.write_text(header + "0,0,,\n0,50,4.0,\n0,100,3.0,\n0,100,,20.0\n0,150,2.5,\n")  # died after step 150
    second.write_text(header + "0,0,,\n0,150,2.4,\n0,200,2.0,\n")  # resumed from the checkpoint at step 125
    losses = [(row["step"], row["train/loss"]) for row in read_metrics([first, second]) if row["train/loss"]]
    assert losses == [("50", "4.0"), ("100", "3.0"), ("150", "2.4"), ("200", "2.0")]
    assert [row["val/bleu"] for row in read_metrics([first, second]) if row["val/bleu"]] == ["20.0"]


def test_the_pace_of_a_run_is_the_median_of_its_throughput_lines(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from quality import median_rate, read_metrics

    header = "epoch,step,train/loss,throughput/target_tokens_per_sec\n"
    first, second = tmp_path / "version_0.csv", tmp_path / "version_1.csv"
    first.write_text(header + "0,10,4.0,100.0\n0,20,3.0,3000.0\n")  # paused during step 20, then died
    second.write_text(header + "0,20,2.9,110.0\n0,30,2.8,120.0\n")  # resumed from step 10: step 20 again
    assert median_rate(read_metrics([first, second])) == 110.0
    assert median_rate([]) is None


def test_a_seed_scored_again_replaces_its_entry_and_others_are_kept(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from quality import add_run

    runs = add_run(add_run([], {"recipe": "a", "seed": 0, "bleu": 1}), {"recipe": "a", "seed": 1, "bleu": 2})
    runs = add_run(add_run(runs, {"recipe": "b", "seed": 0, "bleu": 3}), {"recipe": "a", "seed": 0, "bleu": 4})
    assert [(run["recipe"], run["seed"], run["bleu"]) for run in runs] == [("a", 1, 2), ("b", 0, 3), ("a", 0, 4)]


def test_quality_settings_lists_are_checked_naming_the_value(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from quality import comma_separated

    from lightning_modules.cli.arguments import positive_int

    counts = comma_separated(positive_int, "whole number of at least 1")
    assert counts("5,10,20") == [5, 10, 20] and comma_separated(float, "number")("1.0,1.3") == [1.0, 1.3]
    with pytest.raises(argparse.ArgumentTypeError, match="'5,0': each comma-separated value must be a whole number"):
        counts("5,0")  # the last 0 checkpoints would have been all of them
    with pytest.raises(argparse.ArgumentTypeError, match="'5,x'"):
        counts("5,x")


def fake_run(folder: Path, dataset: str, source_lang: str, target_lang: str) -> Path:
    """A run folder whose last.ckpt holds what quality.py reads first: the data module's settings."""
    (folder / "checkpoints").mkdir(parents=True)
    data = {"dataset": dataset, "source_lang": source_lang, "target_lang": target_lang}
    checkpoint = {"state_dict": {}, "hf_config": {}, "tokenizer": {}, "global_step": 60}
    torch.save({**checkpoint, "datamodule_hyper_parameters": data}, folder / "checkpoints" / "last.ckpt")
    return folder


def test_quality_refuses_a_run_of_other_data_or_languages_naming_both(tmp_path, monkeypatch):
    """quality.py scored the digits-to-words demo run as Multi30k en->de: a results entry "Multi30k en->de after 60
    steps" (sacreBLEU 0.00), exit status 0."""
    folder = multi30k_dir()
    fake_run(tmp_path / "runs" / "demo", "synthetic", "digits", "words")
    out = tmp_path / "quality.json"
    refused = subprocess.run(
        [sys.executable, str(BENCHMARKS / "quality.py"), "--run-dir", "runs/demo", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert refused.returncode == 1 and not out.exists()
    assert refused.stderr.strip() == (
        "quality.py: error: runs/demo was trained on synthetic digits -> words, but quality.py scores Multi30k en -> "
        f"de runs (data.dataset bentrevett/multi30k or a folder of Multi30k's files such as {Path(folder).resolve()}, "
        "data.source_lang en, data.target_lang de): give the folder of such a run, or score this one with "
        "`hf-transformer test`"
    )
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from quality import check_multi30k_run

    from hf_transformer.errors import UserError

    def trained_on(dataset: str, source_lang: str, target_lang: str) -> dict:
        return {
            "datamodule_hyper_parameters": {"dataset": dataset, "source_lang": source_lang, "target_lang": target_lang}
        }

    check_multi30k_run(tmp_path, trained_on("bentrevett/multi30k", "en", "de"))
    check_multi30k_run(tmp_path, trained_on(folder, "en", "de"))
    for dataset, source, target in (("synthetic", "digits", "words"), (folder, "en", "fr"), ("wmt14", "en", "de")):
        expected = f"^{tmp_path} was trained on {dataset} {source} -> {target}, but quality.py scores Multi30k en -> de"
        with pytest.raises(UserError, match=expected):
            check_multi30k_run(tmp_path, trained_on(dataset, source, target))


def compare(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / "compare.py"), *args], capture_output=True, text=True, cwd=cwd
    )


def test_compare_names_a_damaged_file_a_missing_model_or_a_bad_flag_in_one_line(tmp_path):
    """A truncated translations.json ended in JSONDecodeError, a run scored without the compared model in KeyError
    'average', --resamples 0 in IndexError; two runs with no split in common printed a header alone and exited 0."""
    multi30k_dir()
    kept = {"average": {"val": ["ein Hund"] * 4}, "last_checkpoint": {"val": ["eine Katze"] * 4}}
    for name, translations in (("a", kept), ("b", kept), ("last_only", {"last_checkpoint": kept["last_checkpoint"]})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "translations.json").write_text(json.dumps(translations))
    (tmp_path / "test_only").mkdir()
    (tmp_path / "test_only" / "translations.json").write_text(json.dumps({"average": {"test_2016_flickr": ["x"]}}))
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "translations.json").write_text(json.dumps(kept)[:30])
    assert compare(tmp_path, "--runs", "a", "--baseline", "b").returncode == 0
    for args, message in (
        (("--runs", "cut", "--baseline", "b"), r"cut/translations\.json is not readable JSON \(.*\): it was cut short"),
        (
            ("--runs", "a", "--baseline", "last_only"),
            r"last_only/translations\.json holds no translations by the model 'average' \(--model; it holds: "
            r"last_checkpoint\): compare with --model one it holds",
        ),
        (("--runs", "a", "--baseline", "b", "--resamples", "0"), r"--resamples 0: draw at least 1 resample"),
        (
            ("--runs", "a", "--baseline", "test_only"),
            r"nothing compared: no split was scored for every run \(a: val; test_only: test_2016_flickr\)",
        ),
    ):
        result = compare(tmp_path, *args)
        assert result.returncode == 1 and result.stdout == "", args
        (line,) = result.stderr.strip().splitlines()
        assert re.match(f"compare\\.py: error: {message}", line), line


def test_a_recipe_names_the_model_and_data_settings_it_changes(tmp_path, monkeypatch):
    """A tried setting is another recipe, not another seed of the recipe (whose entry it would replace); a run of 0.4
    (flat options) and one of this version (the same settings as classes chosen by class path) name the same
    recipe."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from quality import RECIPE, flat_settings, recipe

    shipped = yaml.safe_load(RECIPE.read_text())

    def named(model: dict, data: dict | None = None) -> str:
        logs = tmp_path / "logs" / "version_0"
        logs.mkdir(parents=True, exist_ok=True)
        settings = {"model": model, "trainer": {"max_steps": 8000}, "data": data or shipped["data"]}
        (logs / "config.yaml").write_text(json.dumps(settings))  # JSON is YAML
        return recipe(tmp_path, "1.0")

    def of_0_4(changes: dict, data: dict | None = None, training: dict | None = None) -> str:
        config = {**shipped["model"]["config"], **changes}
        model = {**flat_settings(shipped["model"]), "config": config, "warmup_steps": 2000, **(training or {})}
        return named(model, {**shipped["data"], **(data or {})})

    def of_now(changes: dict, module: str | None = None, alpha: float = 5.0, cooldown: int | None = None) -> str:
        schedule = {"class_path": "lightning_modules.schedules.InverseSquareRoot", "init_args": {"peak_lr": 0.005}}
        schedule["init_args"]["warmup_steps"] = 2000
        if cooldown:
            schedule["class_path"] = "lightning_modules.experimental.InverseSquareRootWithCooldown"
            schedule["init_args"]["cooldown_steps"] = cooldown
        init_args = {**shipped["model"], "config": {**shipped["model"]["config"], **changes}, "schedule": schedule}
        if module:
            init_args["alpha"] = alpha
        return named({"class_path": module or "lightning_modules.TranslationModule", "init_args": init_args})

    plain = of_0_4({"dropout": 0.3, "attention_dropout": 0.0})
    assert "attention dropout" not in plain and "bpe" not in plain
    assert of_0_4({"dropout": 0.3}, {"bpe_dropout": 0.0, "streaming": True, "dataset": "elsewhere"}) == plain
    tried = of_0_4({"dropout": 0.3, "attention_dropout": 0.1, "activation_dropout": 0.1})
    assert "dropout 0.3, attention dropout 0.1, activation dropout 0.1, warm-up 2000" in tried
    assert "dropout 0.3, bpe dropout 0.1, warm-up 2000" in of_0_4({"dropout": 0.3}, {"bpe_dropout": 0.1})
    assert of_0_4({"dropout": 0.3}, training={"cooldown_steps": 0}) == plain
    cooled = of_0_4({"dropout": 0.3}, training={"cooldown_steps": 3000})
    assert "dropout 0.3, cooldown steps 3000, warm-up 2000" in cooled
    assert of_0_4({"dropout": 0.3}, training={"rdrop_alpha": 0.0}) == plain
    rdrop = of_0_4({"dropout": 0.3}, training={"rdrop_alpha": 5.0})
    assert "dropout 0.3, rdrop alpha 5.0, warm-up 2000" in rdrop
    assert of_now({"dropout": 0.3}) == plain
    assert of_now({"dropout": 0.3}, cooldown=3000) == cooled
    assert of_now({"dropout": 0.3}, module="lightning_modules.experimental.RDropTranslationModule") == rdrop
    bpe = {"class_path": "lightning_modules.experimental.BPEDropoutDataModule", "init_args": {**shipped["data"]}}
    bpe["init_args"] |= {"bpe_dropout": 0.1, "streaming": True}
    expected = of_0_4({"dropout": 0.3}, {"bpe_dropout": 0.1, "streaming": True})
    of_now({"dropout": 0.3})
    (logs,) = tmp_path.glob("logs/version_0/config.yaml")
    logs.write_text(json.dumps({**yaml.safe_load(logs.read_text()), "data": bpe}))  # the recipe's model, of now
    assert recipe(tmp_path, "1.0") == expected


def test_compare_finds_the_better_run_better_with_the_difference_and_interval_on_its_side(
    tmp_path, monkeypatch, capsys
):
    """compare.py on two made-up runs of the first 60 sentences of val and test_2016_flickr: one gives the references,
    the other the references with every third word replaced. The first is better beyond doubt whichever side it is
    on: its score 100, the difference the scores' with its sign, its interval on that side of 0, p small."""
    multi30k_dir()
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import compare
    from multi30k import read_split

    from hf_transformer.scoring import sacrebleu_scores

    references = {split: read_split(split, "de")[:60] for split in ("val", "test_2016_flickr")}
    garbled = {
        split: [" ".join("Hund" if i % 3 == 2 else w for i, w in enumerate(line.split())) for line in lines]
        for split, lines in references.items()
    }
    for name, translations in (("good", references), ("garbled", garbled)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "translations.json").write_text(json.dumps({"average": translations}))
    line = (
        r"{split}: ([\d.]+) against ([\d.]+): ([+-][\d.]+) \(95% interval ([+-][\d.]+) to ([+-][\d.]+)\), p = ([\d.]+)"
    )
    for runs, baseline, sign in (("good", "garbled", 1), ("garbled", "good", -1)):
        monkeypatch.setattr(
            sys, "argv", ["compare.py", "--runs", str(tmp_path / runs), "--baseline", str(tmp_path / baseline)]
        )
        compare.main()
        stdout = capsys.readouterr().out
        for split in references:
            found = re.search(line.format(split=split), stdout)
            assert found, stdout
            system, base, difference, low, high, p_value = map(float, found.groups())
            garbled_score = round(sacrebleu_scores(garbled[split], references[split])[0].value, 2)
            assert (system, base) == ((100.0, garbled_score) if sign > 0 else (garbled_score, 100.0))
            assert difference == pytest.approx(system - base, abs=0.011) and sign * difference > 0
            assert sign * low > 0 and sign * high > 0 and low <= difference <= high
            assert p_value < 0.01


@pytest.mark.slow
def test_padding_benchmark_runs(tmp_path):
    multi30k_dir()
    out = tmp_path / "padding.json"
    run(str(BENCHMARKS / "padding.py"), "--max-tokens", "4096", "--epochs", "1", "--out", str(out))
    (result,) = json.loads(out.read_text())
    assert result["token_budget"] > 0.9 > 0.6 > result["random"]  # > 0.95 with the defaults: tests/test_data.py


@pytest.mark.slow
def test_quality_report_runs_on_a_short_run(run_dir):
    multi30k = ("--data.dataset", multi30k_dir(), "--data.source_lang=en", "--data.target_lang=de")
    main([*TINY_FIT, *multi30k, "--trainer.max_steps=6", "--trainer.log_every_n_steps=2"])
    out = run_dir / "quality.json"
    scoring = ("--beams", "4", "--length-penalties", "1.0", "--limit", "8", "--device", "cpu")
    run(
        str(BENCHMARKS / "quality.py"),
        "--run-dir",
        "runs/demo",
        "--average",
        "1,2",
        *scoring,
        "--select-on",
        "sacreBLEU, lowercased",
        "--trained-on",
        "a GPU for steps 1-3, this CPU after",
        "--out",
        str(out),
        cwd=run_dir,
    )
    (report,) = json.loads(out.read_text())["runs"]
    assert {"last_checkpoint", "average"} <= set(report)
    assert report["device"] == "a GPU for steps 1-3, this CPU after"  # where it trained, not where it was scored
    grid = report["averaging_grid"]  # each average's best val score; the one chosen is the best
    assert set(grid) == {"last 1", "last 2"} and all(0 <= value <= 100 for value in grid.values())
    chosen = len(report["averaged_checkpoints"])
    assert grid[f"last {chosen}"] == max(grid.values()) == report["average"]["val"]["scores"]["sacreBLEU, lowercased"]
    assert report["steps"] == 6 and report["target_tokens"] > 0 and report["seed"] == 0
    last = report["last_checkpoint"]  # one decoding tried; val chose it on its lowercased score
    assert list(last["decoding"]["val_grid"].values()) == [last["val"]["scores"]["sacreBLEU, lowercased"]]
    lowercased = {split: last[split]["scores"]["sacreBLEU, lowercased"] for split in ("val", "test_2016_flickr")}
    assert last["val_to_test_gap"] == {"test_2016_flickr": lowercased["test_2016_flickr"] - lowercased["val"]}
    steps = [step for step, _ in report["learning_curve"]["train_loss"]]  # what the plot draws: every 2nd step
    assert len(steps) == 3 and steps == sorted(steps) and steps[-1] < 6
    assert set(report["last_checkpoint"]["test_2016_flickr"]["scores"]) >= {"sacreBLEU", "tokenized BLEU, lowercased"}
    assert report["last_checkpoint"]["test_2016_flickr"]["sacrebleu_interval_95"] >= 0  # the test set's sampling
    # Each model's translations stay in the run's folder, out of the results, for compare.py: the run compared with
    # itself (the same translations) differs by nothing.
    translations = json.loads((run_dir / "runs/demo/translations.json").read_text())
    assert {split: len(lines) for split, lines in translations["average"].items()} == {"val": 8, "test_2016_flickr": 8}
    assert translations.keys() == {"last_checkpoint", "average"} and "hypotheses" not in json.dumps(report)
    stdout = run(str(BENCHMARKS / "compare.py"), "--runs", "runs/demo", "--baseline", "runs/demo", cwd=run_dir)
    assert re.search(
        r"test_2016_flickr: ([\d.]+) against \1: \+0\.00 \(95% interval \+0\.00 to \+0\.00\), p = 1\.000", stdout
    )
    missing = subprocess.run(
        [sys.executable, str(BENCHMARKS / "compare.py"), "--runs", "runs/demo", "--baseline", "nowhere"],
        capture_output=True,
        text=True,
        cwd=run_dir,
    )
    assert missing.returncode == 1
    assert "nowhere/translations.json does not exist: score the run with benchmarks/quality.py first" in missing.stderr
    too_many = subprocess.run(
        [sys.executable, str(BENCHMARKS / "quality.py"), "--run-dir", "runs/demo", "--average", "10"],
        capture_output=True,
        text=True,
        cwd=run_dir,
    )
    assert too_many.returncode == 1 and "Traceback" not in too_many.stderr
    assert "quality.py: error: asked to average 10 checkpoints but runs/demo/checkpoints holds 2" in too_many.stderr


@pytest.mark.slow
def test_deploy_benchmark_runs_on_a_short_run(run_dir):
    multi30k_dir()
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed: pip install 'hf-transformer[ctranslate2]'")
    # The demo tokenizer splits Multi30k English into many tokens (up to 129 for these 8): room for them and outputs.
    main([*TINY_FIT, "--trainer.max_steps=3", "--model.config.max_position_embeddings=512", "--data.max_tokens=1024"])
    main(["export", "runs/demo/checkpoints/last.ckpt", "exported"])  # it saves beam 2 (tiny.yaml)
    out = run_dir / "deploy.json"
    quick = ("--limit", "4", "--repeats", "1", "--threads", "1")
    run(str(BENCHMARKS / "deploy.py"), "multi30k", "--model", "exported", *quick, "--out", str(out))
    measured = json.loads(out.read_text())["sizes"]["multi30k"]
    engines = measured["threads"]["1"]
    assert set(engines) == {
        "translate() float32",
        "translate() int8",
        "translate() int8, forward() per step",
        "translate() int8 + shortlist",
        "ctranslate2 float32",
        "ctranslate2 int8",
        "ctranslate2 int8 + shortlist",
    }
    assert all(entry["sentences_per_sec"] > 0 and entry["target_tokens_per_sec"] > 0 for entry in engines.values())
    assert all(entry["memory_loaded_mib"] >= 0 for entry in engines.values())
    # What the results page counts: every engine decodes as translate() does (beam 4, length penalty 0.6, whatever
    # the model saved), so CTranslate2 float32 gives its translations but where two candidates score within rounding
    # (one sentence of the four); int8 is checked on a trained model in test_int8.py and test_ctranslate2.py.
    assert engines["translate() float32"]["same_as_translate_float32"] == 4
    assert engines["ctranslate2 float32"]["same_as_translate_float32"] >= 3
    for entry in engines.values():
        if entry["same_as_translate_float32"] == 4:
            assert entry["bleu"] == engines["translate() float32"]["bleu"]


@pytest.mark.slow
def test_serve_benchmark_runs_on_a_short_run(run_dir):
    pytest.importorskip("fastapi", reason="serving needs FastAPI: pip install 'hf-transformer[serve]'")
    main([*TINY_FIT, "--trainer.max_steps=3"])
    main(["export", "runs/demo/checkpoints/last.ckpt", "exported"])
    out = run_dir / "serve.json"
    tiny = ("--requests", "4", "--repeats", "1", "--clients", "1", "2", "--seconds", "30")
    run(str(BENCHMARKS / "serve.py"), "--model", "exported", *tiny, "--out", str(out), cwd=run_dir)
    settings = json.loads(out.read_text())["settings"]
    assert set(settings) == {"translate() loop, 1 client", "fastapi, 1 client", "fastapi, 2 clients"}
    # Every request was answered (a client whose request failed would stop, and its requests go uncounted).
    assert all(entry["requests"] == 4 for entry in settings.values())
    assert all(entry["sentences_per_sec"] > 0 and entry["p99_ms"] >= entry["p50_ms"] > 0 for entry in settings.values())


@pytest.mark.slow
def test_ensemble_benchmark_scores_each_seed_and_their_ensembles(run_dir):
    """Two tiny seeds of the demo: each scored, their ensemble under both rules, the cost measured side by side, and
    the runs as the results say (the steps asked, one tokenizer, two different models)."""
    from lightning_modules.checkpoint import load_checkpoint, tokenizer_from_checkpoint

    out = run_dir / "ensemble.json"
    tiny = ("--config", "tiny.yaml", "--steps", "3", "--warmup-steps", "2", "--limit", "8", "--timing-sentences", "4")
    run(
        str(BENCHMARKS / "ensemble.py"),
        *tiny,
        "--seeds",
        "0",
        "1",
        "--rounds",
        "1",
        "--work",
        "work",
        "--out",
        str(out),
    )
    report = json.loads(out.read_text())
    assert report["seeds"] == [0, 1] and report["steps"] == 3 and report["test_sentences"] == 8
    members = report["members"]
    assert [member["seed"] for member in members] == [0, 1]
    bleu = [member["sacrebleu"] for member in members]
    assert report["mean_member_sacrebleu"] == pytest.approx(sum(bleu) / 2) and report["best_member_sacrebleu"] == max(
        bleu
    )
    assert [(entry["seeds"], entry["average"]) for entry in report["ensembles"]] == [
        ([0, 1], "probabilities"),
        ([0, 1], "log-probabilities"),
    ]
    for entry in members + report["ensembles"]:
        assert 0 <= entry["sacrebleu"] <= 100 and 0 <= entry["exact_match"] <= 1 and entry["seconds"] > 0
    cost = report["cost"]
    seconds = cost["seconds_per_sentence"]
    assert cost["sentences"] == 4 and seconds["one_model"] > 0 and seconds["ensemble"] > 0
    assert cost["ratio_ensemble_over_one_model"] == pytest.approx(seconds["ensemble"] / seconds["one_model"])
    assert report["device"] not in ("", "cpu") and "--seed_everything=SEED --trainer.max_steps=3" in report["fit"]
    checkpoints = [load_checkpoint(run_dir / f"work/seed{seed}/checkpoints/last.ckpt") for seed in (0, 1)]
    assert [checkpoint["global_step"] for checkpoint in checkpoints] == [3, 3]
    tokenizers = [tokenizer_from_checkpoint(checkpoint).backend_tokenizer.to_str() for checkpoint in checkpoints]
    assert tokenizers[0] == tokenizers[1]  # one tokenizer, as an ensemble needs
    weights = [checkpoint["state_dict"] for checkpoint in checkpoints]
    assert not all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])  # two seeds, two models


def test_data_scale_benchmark_runs_on_a_small_corpus(tmp_path):
    """Both paths on a corpus of 3,000 pairs, kept in --work: a second call measures the second run and streaming
    again on what the first left there, and keeps the first run it measured."""
    out, work = tmp_path / "data_scale.json", tmp_path / "work"
    common = ["--sizes", "3000", "--work", str(work), "--out", str(out), "--stream-batches", "3"]
    run(str(BENCHMARKS / "data_scale.py"), *common, "--tokenization-pairs", "1000", "--tokenization-rounds", "2")
    (entry,) = json.loads(out.read_text())["sizes"]
    assert entry["first_run"]["batches"] > 0 and entry["second_run"]["batches"] == entry["first_run"]["batches"]
    tokenization = entry["tokenization"]
    assert tokenization["pairs"] == 1000 and len(tokenization["encode_batch_pairs_per_s"]) == 2
    assert tokenization["ratio_to_encode_batch"] > 0 and tokenization["ratio_to_encode_batch_fast"] > 0
    assert entry["cache_mib"] > 0
    assert entry["streaming"]["first_run"]["batches_per_s"] > 0
    assert set(entry["first_run"]["phases_s"]) == {"import", "read", "tokenizer", "tokenize", "plan", "first_batch"}
    first = entry["first_run"]
    run(str(BENCHMARKS / "data_scale.py"), *common, "--measure", "rerun", "streaming")
    (again,) = json.loads(out.read_text())["sizes"]
    assert again["first_run"] == first and again["second_run"]["batches"] == first["batches"]
    assert again["streaming"]["second_run"]["to_first_batch_s"] > 0
    assert set(again["commits"]) == {"prepare", "tokenization", "rerun", "streaming"}
    assert (tmp_path / "data_scale.png").exists()

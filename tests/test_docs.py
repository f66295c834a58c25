"""The front page and the documentation say what the results JSON says: README's headline table is the one
`benchmarks/report.py` generates, and every table a docs page asks for exists. (The site itself is built with
warnings as errors by `.ci/run`: `python -m sphinx -W -n docs ...`.)"""

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import report  # noqa: E402

MARKER = re.compile(r"^<!-- generated: (table|help) ([\w-]+) -->$", re.MULTILINE)


def test_readme_holds_the_headline_table_as_generated_from_the_results():
    assert report.table("headline") in (ROOT / "README.md").read_text()


def test_readme_is_a_front_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert not re.search(r"20\d\d-[01]\d-[0-3]\d", text), "dates belong in the results data, not the front page"


def test_ci_runs_readmes_test_command_and_the_slow_tests_it_leaves_out():
    """README's second command is the one `.ci/run` runs, and CI runs the end-to-end tests it deselects too."""
    block = (ROOT / "README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    command = block.splitlines()[1]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command.startswith("python -m pytest") and '-m "not slow"' in command
    assert any(line.split("  #")[0].strip() == command for line in ci)
    assert any(line.strip() == command.replace('-m "not slow"', "-m slow") for line in ci)


@pytest.mark.parametrize("page", sorted((ROOT / "docs").rglob("*.md")), ids=lambda path: path.name)
def test_every_generated_table_of_a_page_exists(page):
    for kind, name in MARKER.findall(page.read_text()):
        if kind == "table":
            assert report.table(name).startswith("|")


def test_a_table_changes_with_its_json(monkeypatch):
    """The numbers come from the JSON: another JSON, another table."""
    speed = report.result("speed")
    changed = {**speed, "training": [{**speed["training"][0], "ratio_ours_over": {"marian": 9.5, "nn.Transformer": 1}}]}
    monkeypatch.setattr(report, "result", lambda name: changed if name == "speed" else report.result.__wrapped__(name))
    assert "9.50x" in report.table("training_speed")


def test_a_recipe_of_several_seeds_is_reported_with_their_mean(monkeypatch):
    run = report.result("multi30k")["runs"][0]
    other = {**run, "seed": 1, "average": {**run["average"], "val_to_test_gap": {"test_2016_flickr": 0.5}}}
    test = other["average"]["test_2016_flickr"]
    other["average"]["test_2016_flickr"] = {**test, "scores": {**test["scores"], "tokenized BLEU, lowercased": 50.0}}
    runs, stored = {"runs": [run, other]}, report.result
    monkeypatch.setattr(report, "result", lambda name: runs if name == "multi30k" else stored(name))
    mean = (run["average"]["test_2016_flickr"]["scores"]["tokenized BLEU, lowercased"] + 50.0) / 2
    assert "**mean of 2** |  |  | test_2016_flickr |" in report.table("quality")
    assert f"**{mean:.2f}**" in report.table("quality")
    assert "mean of 2 seeds" in report.table("headline") and f"/ {mean:.2f}" in report.table("headline")


def test_a_test_set_only_some_seeds_were_scored_on_is_averaged_over_those(monkeypatch):
    run = report.result("multi30k")["runs"][0]
    later = {**run["average"]["test_2016_flickr"], "scores": {"sacreBLEU": 30.0, "tokenized BLEU, lowercased": 31.0}}
    gaps = {**run["average"]["val_to_test_gap"], "test_2017_mscoco": -5.0}
    other = {**run, "seed": 1, "average": {**run["average"], "test_2017_mscoco": later, "val_to_test_gap": gaps}}
    runs, stored = {"runs": [run, other]}, report.result
    monkeypatch.setattr(report, "result", lambda name: runs if name == "multi30k" else stored(name))
    table = report.table("quality")
    assert "**mean of 2** |  |  | test_2016_flickr |" in table
    assert "| 1 | " in table and "| test_2017_mscoco | " in table and "mean of 1" not in table


def test_the_headline_reports_the_recipe_scored_last_with_all_its_seeds(monkeypatch):
    run = report.result("multi30k")["runs"][0]
    other = {**run, "recipe": "another recipe"}
    runs, stored = {"runs": [run, other, {**run, "seed": 1}]}, report.result
    monkeypatch.setattr(report, "result", lambda name: runs if name == "multi30k" else stored(name))
    assert run["recipe"] in report.table("headline") and "mean of 2 seeds" in report.table("headline")
    assert "another recipe" not in report.table("headline")


def test_the_ensemble_table_sets_each_ensemble_against_the_mean_of_its_seeds(monkeypatch):
    members = [{"seed": 0, "sacrebleu": 20.0, "exact_match": 0.25}, {"seed": 1, "sacrebleu": 30.0, "exact_match": 0.5}]
    ensembles = [{"seeds": [0, 1], "average": "probabilities", "sacrebleu": 27.5, "exact_match": 0.4}]
    cost = {"sentences": 100, "seconds_per_sentence": {"one_model": 0.01, "ensemble": 0.021}}
    fake = {"members": members, "ensembles": ensembles, "seeds": [0, 1], "device": "a CPU", "threads": 2}
    fake["cost"] = {**cost, "ratio_ensemble_over_one_model": 2.1}
    stored = report.result
    monkeypatch.setattr(report, "result", lambda name: fake if name == "ensemble" else stored(name))
    assert "| ensemble of seeds 0, 1, mean of the probabilities | 27.50 | 40.0% | +2.50 |" in report.table("ensemble")
    assert "| a CPU, 2 threads, 100 test sentences | 10.0 | 21.0 | 2.10x |" in report.table("ensemble_cost")

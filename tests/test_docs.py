"""The front page and the documentation say what the results JSON says: README's headline table is the one
`docs/results_tables.py` generates, and every table a docs page asks for exists. (The site itself is built with
warnings as errors by `.ci/run`: `python -m sphinx -W -n docs ...`.)"""

import re
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))

import results_tables as tables  # noqa: E402

MARKER = re.compile(r"^<!-- generated: (table|plot|help) ([\w-]+) -->$", re.MULTILINE)


def test_readme_holds_the_headline_table_as_generated_from_the_results():
    assert tables.table("headline") in (ROOT / "README.md").read_text()


def test_readme_is_a_front_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert not re.search(r"20\d\d-[01]\d-[0-3]\d", text), "dates belong in the results data, not the front page"


def test_ci_runs_readmes_test_command_and_the_slow_tests_it_leaves_out():
    """README's second line installs the test tools and runs the test command that `.ci/run` runs, and CI runs the
    end-to-end tests it deselects too."""
    block = (ROOT / "README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    install, command = block.splitlines()[1].split(" && ", 1)
    assert install == 'pip install -e ".[dev]"'
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command.startswith("python -m pytest") and '-m "not slow"' in command
    assert any(line.split("  #")[0].strip() == command for line in ci)
    assert any(line.strip() == command.replace('-m "not slow"', "-m slow") for line in ci)


@pytest.mark.parametrize("page", sorted((ROOT / "docs").rglob("*.md")), ids=lambda path: path.name)
def test_every_generated_table_of_a_page_exists(page):
    for kind, name in MARKER.findall(page.read_text()):
        if kind == "table":
            assert "\n|---|" in tables.table(name)  # a Markdown table (a section per setting has several)


def test_a_table_changes_with_its_json(monkeypatch):
    """The numbers come from the JSON: another JSON, another table."""
    speed = tables.result("speed")
    changed = {**speed, "training": [{**speed["training"][0], "ratio_ours_over": {"marian": 9.5, "nn.Transformer": 1}}]}
    monkeypatch.setattr(tables, "result", lambda name: changed if name == "speed" else tables.result.__wrapped__(name))
    assert "9.50x" in tables.table("training_speed")


def test_a_recipe_of_several_seeds_is_reported_with_their_mean_and_spread(monkeypatch):
    run = tables.result("multi30k")["runs"][0]
    other = {**run, "seed": 1, "average": {**run["average"], "val_to_test_gap": {"test_2016_flickr": 0.5}}}
    test = other["average"]["test_2016_flickr"]
    other["average"]["test_2016_flickr"] = {**test, "scores": {**test["scores"], "tokenized BLEU, lowercased": 50.0}}
    runs, stored = {"runs": [run, other]}, tables.result
    monkeypatch.setattr(tables, "result", lambda name: runs if name == "multi30k" else stored(name))
    first = run["average"]["test_2016_flickr"]["scores"]["tokenized BLEU, lowercased"]
    mean, spread = statistics.mean([first, 50.0]), statistics.stdev([first, 50.0])
    assert f"| the recipe | 2 | {mean:.2f} ± {spread:.2f} |" in tables.table("settings")
    assert f"**{mean:.2f} ± {spread:.2f}** | {mean - tables.ANCHOR['tokenized BLEU, lowercased']:+.2f}" in tables.table(
        "anchor"
    )
    assert "mean of 2 seeds" in tables.table("headline") and f"/ {mean:.2f}" in tables.table("headline")


def test_a_test_set_only_some_seeds_were_scored_on_is_averaged_over_those(monkeypatch):
    run = tables.result("multi30k")["runs"][0]
    later = {**run["average"]["test_2016_flickr"], "scores": {"sacreBLEU": 30.0, "tokenized BLEU, lowercased": 31.0}}
    gaps = {**run["average"]["val_to_test_gap"], "test_2017_mscoco": -5.0}
    other = {**run, "seed": 1, "average": {**run["average"], "test_2017_mscoco": later, "val_to_test_gap": gaps}}
    runs, stored = {"runs": [run, other]}, tables.result
    monkeypatch.setattr(tables, "result", lambda name: runs if name == "multi30k" else stored(name))
    assert tables.table("later_test_sets").splitlines()[2:] == ["| the recipe | 2 | 30.00 |"]
    detail = tables.table("runs_detail")
    assert detail.count("| test_2016_flickr |") == 2 and detail.count("| test_2017_mscoco |") == 1


def test_a_setting_is_named_by_what_it_changes_and_has_one_row():
    recipe = "hf-transformer 0.3.0: dropout 0.3, warm-up 2000, peak lr 0.005, 8192-token batches, bf16-mixed"
    changed = "hf-transformer 0.4.0: dropout 0.3, attention dropout 0.1, warm-up 2000, peak lr 0.005, 4096-token "
    changed += "batches"
    averaged = recipe + ", and an exponential moving average of the weights (EMAWeightAveraging, decay 0.998)"
    assert tables.setting_label(recipe, recipe) == "the recipe"
    assert tables.setting_label(changed, recipe) == "the recipe + attention dropout 0.1, 4096-token batches"
    assert tables.setting_label(averaged, recipe).endswith(
        "+ an exponential moving average of the weights (EMAWeightAveraging, decay 0.998)"
    )
    assert tables.setting_label("configs/multi30k.yaml of 0.3.0: one hour", recipe) == "one hour"
    rows = tables.table("settings").splitlines()[2:]
    assert len(rows) == len(tables.recipes())  # one row per setting, its seeds together


def test_every_plot_of_a_page_is_drawn_and_a_seed_validated_on_another_sample_is_marked(tmp_path):
    """The learning curves of the recipe's seeds: seed 3 validated on another quarter of val than seeds 0-2 (a BLEU
    about 10 lower from the sample alone), and nothing said so. Its curves are dashed and their legend names its
    sample."""
    pytest.importorskip("matplotlib", reason="the plots need matplotlib: pip install 'hf-transformer[plot]'")
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for kind, name in MARKER.findall(page.read_text()):
            if kind == "plot":
                assert tables.plot(name, tmp_path / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    figure = tables.learning_curves_plot(tmp_path / "curves.png")
    bleu = figure.axes[2]
    styles = {line.get_label(): line.get_linestyle() for line in bleu.get_lines()}
    samples = {
        run["seed"]: run["validation_sample"]
        for run in tables.recipes()[tables.headline_recipe(tables.result("multi30k")["runs"])]
    }
    assert samples[3] != samples[0]
    assert styles[f"seed 3: {samples[3]}"] == "--" and styles["seed 0"] == styles["seed 1"] == "-"


def test_the_headline_reports_the_recipe_scored_last_with_all_its_seeds(monkeypatch):
    run = tables.result("multi30k")["runs"][0]
    other = {**run, "recipe": "another recipe"}
    runs, stored = {"runs": [run, other, {**run, "seed": 1}]}, tables.result
    monkeypatch.setattr(tables, "result", lambda name: runs if name == "multi30k" else stored(name))
    assert run["recipe"] in tables.table("headline") and "mean of 2 seeds" in tables.table("headline")
    assert "another recipe" not in tables.table("headline")


def test_the_ensemble_table_sets_each_ensemble_against_the_mean_of_its_seeds(monkeypatch):
    members = [{"seed": 0, "sacrebleu": 20.0, "exact_match": 0.25}, {"seed": 1, "sacrebleu": 30.0, "exact_match": 0.5}]
    ensembles = [{"seeds": [0, 1], "average": "probabilities", "sacrebleu": 27.5, "exact_match": 0.4}]
    cost = {"sentences": 100, "seconds_per_sentence": {"one_model": 0.01, "ensemble": 0.021}}
    fake = {"members": members, "ensembles": ensembles, "seeds": [0, 1], "device": "a CPU", "threads": 2}
    fake["cost"] = {**cost, "ratio_ensemble_over_one_model": 2.1}
    stored = tables.result
    monkeypatch.setattr(tables, "result", lambda name: fake if name == "ensemble" else stored(name))
    assert "| ensemble of seeds 0, 1, mean of the probabilities | 27.50 | 40.0% | +2.50 |" in tables.table("ensemble")
    assert "| a CPU, 2 threads, 100 test sentences | 10.0 | 21.0 | 2.10x |" in tables.table("ensemble_cost")


def test_the_headline_is_the_recipe_of_most_seeds_not_a_setting_tried_last():
    recipe = [{"recipe": "recipe", "seed": seed} for seed in range(3)]
    assert tables.headline_recipe([*recipe, {"recipe": "a setting tried", "seed": 0}]) == "recipe"
    assert tables.headline_recipe([{"recipe": "earlier", "seed": 0}, {"recipe": "later", "seed": 0}]) == "later"

"""Pushing exported models with `push_folder`, and loading them back, against the in-process fake Hub; and what the
model card says of the scores and the decoding."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

import huggingface_hub.constants
import pytest
import torch
from conftest import TINY_CONFIG, make_tiny_config
from huggingface_hub import HfApi, ModelCard, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from sacrebleu.metrics import BLEU
from safetensors.torch import save_file

from hf_transformer import TransformerConfig, TransformerForConditionalGeneration, translate
from hf_transformer.decoding.search import MAX_LENGTH_OFFSET
from hf_transformer.errors import HubError
from hf_transformer.hub.model_card import bleu_signature, chrf_signature, write_model_card
from hf_transformer.hub.push import push_folder
from hf_transformer.scoring import CHRF_SCORE, SACREBLEU, VALIDATION_BLEU, sacrebleu_scores
from lightning_modules.cli import main
from lightning_modules.experimental import InverseSquareRootWithCooldown, RDropTranslationModule
from lightning_modules.upgrade import describe_training

if TYPE_CHECKING:
    from tests.hub_server import FakeHub

# Imported by pytest (not here) so that it can rewrite the module's asserts.
pytest_plugins = ["tests.hub_server"]

REPO = "alice/tiny"


def make_export(folder: Path, seed: int = 0) -> Path:
    """A folder shaped like `save_pretrained` output: config, safetensors weights, model card."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "transformer", "d_model": 8}))
    save_file(
        {"encoder.weight": torch.randn(8, 8, generator=torch.Generator().manual_seed(seed))},
        folder / "model.safetensors",
    )
    (folder / "README.md").write_text("---\nlicense: apache-2.0\n---\n# tiny\n")
    return folder


def fingerprint(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Content and modification time of every file, to prove a push leaves the folder alone."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.rglob("*")}


def assert_no_token(err: BaseException, token: str) -> None:
    """Not in the message, nor anywhere in the chained tracebacks."""
    assert token not in "".join(traceback.format_exception(err))


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter with the fixture's environment (where constants are read at import)."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result


def test_push_then_download_gives_identical_bytes(hub_endpoint: FakeHub, tmp_path: Path) -> None:
    folder = make_export(tmp_path / "export")
    before = fingerprint(folder)

    commit = push_folder(folder, REPO)

    assert commit.startswith(f"{hub_endpoint.url}/{REPO}/commit/") and len(commit.oid) == 40
    assert HfApi().model_info(REPO).sha == commit.oid
    snapshot = Path(snapshot_download(REPO))
    for name in before:
        assert (snapshot / name).read_bytes() == (folder / name).read_bytes()
    assert Path(hf_hub_download(REPO, "model.safetensors")).read_bytes() == (folder / "model.safetensors").read_bytes()
    assert fingerprint(folder) == before


def test_second_push_is_a_new_commit_and_the_first_stays_loadable(hub_endpoint: FakeHub, tmp_path: Path) -> None:
    first_weights = (make_export(tmp_path / "v1") / "model.safetensors").read_bytes()
    first = push_folder(tmp_path / "v1", REPO, commit_message="v1")
    second = push_folder(make_export(tmp_path / "v2", seed=1), REPO, commit_message="v2")

    assert second.oid != first.oid
    assert [hub_endpoint.repos[REPO].commits[c.oid].message for c in (first, second)] == ["v1", "v2"]
    assert [b.target_commit for b in HfApi().list_repo_refs(REPO).branches] == [second.oid]
    old = hf_hub_download(REPO, "model.safetensors", revision=first.oid)
    assert Path(old).read_bytes() == first_weights
    new = hf_hub_download(REPO, "model.safetensors")
    assert Path(new).read_bytes() == (tmp_path / "v2" / "model.safetensors").read_bytes() != first_weights


def test_push_to_a_new_branch_leaves_main_alone(hub_endpoint: FakeHub, tmp_path: Path) -> None:
    folder = make_export(tmp_path / "export")

    commit = push_folder(folder, REPO, revision="experiment")

    branches = {b.name: b.target_commit for b in HfApi().list_repo_refs(REPO).branches}
    assert branches["experiment"] == commit.oid and branches["main"] != commit.oid
    assert (
        Path(hf_hub_download(REPO, "config.json", revision="experiment")).read_bytes()
        == (folder / "config.json").read_bytes()
    )
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "config.json")  # main only has the repo's initial .gitattributes


@pytest.mark.parametrize("xet", [False, True], ids=["create_commit", "xet_upload_pipeline"])
def test_create_pr_opens_a_pull_request_and_leaves_main_alone(
    hub_endpoint: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, xet: bool
) -> None:
    # With hf_xet usable, upload_folder opens the PR through /discussions and commits to its ref.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", not xet)
    main = push_folder(make_export(tmp_path / "v1"), REPO)
    proposal = make_export(tmp_path / "v2", seed=1)

    commit = push_folder(proposal, REPO, create_pr=True)

    assert commit.pr_url == f"{hub_endpoint.url}/{REPO}/discussions/1" and commit.pr_revision == "refs/pr/1"
    assert HfApi().model_info(REPO).sha == main.oid
    pr_refs = HfApi().list_repo_refs(REPO, include_pull_requests=True).pull_requests
    assert [(r.ref, r.target_commit) for r in pr_refs] == [("refs/pr/1", commit.oid)]
    pr_weights = hf_hub_download(REPO, "model.safetensors", revision="refs/pr/1")
    assert Path(pr_weights).read_bytes() == (proposal / "model.safetensors").read_bytes()
    assert (("POST", f"/api/models/{REPO}/discussions") in hub_endpoint.requests) == xet


def test_a_later_push_can_add_to_an_open_pull_request(hub_endpoint: FakeHub, tmp_path: Path) -> None:
    push_folder(make_export(tmp_path / "v1"), REPO)
    opened = push_folder(make_export(tmp_path / "v2", seed=1), REPO, create_pr=True)

    update = push_folder(make_export(tmp_path / "v3", seed=2), REPO, revision=opened.pr_revision)

    pr_refs = HfApi().list_repo_refs(REPO, include_pull_requests=True).pull_requests
    assert [(r.ref, r.target_commit) for r in pr_refs] == [("refs/pr/1", update.oid)]
    with pytest.raises(HubError, match="failed: Invalid rev id: refs/pr/9"):
        push_folder(tmp_path / "v3", REPO, revision="refs/pr/9")


def test_offline_subprocess_loads_from_the_cache(hub_endpoint: FakeHub, tmp_path: Path) -> None:
    folder = make_export(tmp_path / "export")
    push_folder(folder, REPO)
    snapshot_download(REPO)
    hub_endpoint.stop()  # offline must not need the server

    result = run_python(
        f"""
        from huggingface_hub import hf_hub_download, snapshot_download
        print(snapshot_download({REPO!r}))
        print(hf_hub_download({REPO!r}, "model.safetensors"))
        """,
        HF_HUB_OFFLINE="1",
    )

    snapshot, weights = result.stdout.split()
    assert (Path(snapshot) / "config.json").read_bytes() == (folder / "config.json").read_bytes()
    assert Path(weights).read_bytes() == (folder / "model.safetensors").read_bytes()


def test_transformers_loads_the_pushed_model_through_the_endpoint(hub_endpoint: FakeHub, tmp_path: Path) -> None:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    model = BertModel(config).eval()
    model.save_pretrained(tmp_path / "bert")
    input_ids = torch.tensor([[2, 7, 11, 5, 3]])
    with torch.no_grad():
        expected = model(input_ids).last_hidden_state
    save_file({"input_ids": input_ids, "expected": expected}, tmp_path / "expected.safetensors")
    commit = push_folder(tmp_path / "bert", REPO)

    run_python(f"""
        import torch
        from safetensors.torch import load_file
        from transformers import AutoModel
        data = load_file({str(tmp_path / "expected.safetensors")!r})
        model = AutoModel.from_pretrained({REPO!r}).eval()
        with torch.no_grad():
            out = model(data["input_ids"]).last_hidden_state
        assert torch.equal(out, data["expected"]), (out - data["expected"]).abs().max()
        """)

    assert ("GET", f"/{REPO}/resolve/{commit.oid}/model.safetensors") in hub_endpoint.requests


def test_without_a_token_the_push_says_how_to_log_in(
    hub_endpoint: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command's line said the push twice ("hf-transformer push: error: ..., then re-run the push.")."""
    monkeypatch.delenv("HF_TOKEN")

    with pytest.raises(HubError, match=r"set HF_TOKEN or run `hf auth login`"):
        push_folder(make_export(tmp_path / "export"), REPO)
    assert not [r for r in hub_endpoint.requests if r[0] == "POST"]
    with pytest.raises(SystemExit):
        main(["push", str(tmp_path / "export"), REPO])
    assert capsys.readouterr().err.strip() == (
        "hf-transformer push: error: No Hugging Face token found: set HF_TOKEN or run `hf auth login`"
    )


def test_a_rejected_token_is_reported_without_being_shown(
    hub_endpoint: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_secret")

    with pytest.raises(HubError, match=r"rejected the token \(401\)") as info:
        push_folder(make_export(tmp_path / "export"), REPO)
    assert_no_token(info.value, "hf_not_a_real_secret")


def test_offline_mode_and_create_pr_on_a_branch_are_refused(
    hub_endpoint: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = make_export(tmp_path / "export")
    with pytest.raises(HubError, match="drop revision='dev'"):
        push_folder(folder, REPO, revision="dev", create_pr=True)

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubError, match="HF_HUB_OFFLINE is set. Unset it"):
        push_folder(folder, REPO)
    assert hub_endpoint.requests == []


@pytest.mark.parametrize("repo_id", ["tiny", "alice/tiny/extra", "alice/has space", "alice/a--b", ""])
def test_an_invalid_repo_id_is_refused_before_any_request(hub_endpoint: FakeHub, tmp_path: Path, repo_id: str) -> None:
    with pytest.raises(HubError, match="expected 'namespace/name'") as info:
        push_folder(make_export(tmp_path / "export"), repo_id)
    assert repr(repo_id) in str(info.value)
    assert hub_endpoint.requests == []


def test_pushing_to_another_users_namespace_names_repo_and_user(hub_endpoint: FakeHub, tmp_path: Path) -> None:
    folder = make_export(tmp_path / "export")
    push_folder(folder, "bob/shared", token=hub_endpoint.token_for("bob"))

    for repo_id in ("bob/shared", "bob/new"):  # refused at commit, and at repo creation
        with pytest.raises(HubError, match=rf"User 'alice' may not write to '{repo_id}' \(403\)") as info:
            push_folder(folder, repo_id)
        assert "alice/" in str(info.value)  # suggests the user's own namespace
        assert_no_token(info.value, os.environ["HF_TOKEN"])
    # As on the real Hub, anyone who can read a repo may propose changes to it.
    proposal = push_folder(make_export(tmp_path / "v2", seed=1), "bob/shared", create_pr=True)
    assert proposal.pr_revision == "refs/pr/1"


def test_hub_down_before_the_push_leaves_the_folder_intact(hub_endpoint: FakeHub, tmp_path: Path) -> None:
    folder = make_export(tmp_path / "export")
    before = fingerprint(folder)
    hub_endpoint.stop()

    with pytest.raises(HubError, match="ConnectError.* The local folder is intact; re-run the push") as info:
        push_folder(folder, REPO)
    assert_no_token(info.value, os.environ["HF_TOKEN"])
    assert fingerprint(folder) == before


def test_connection_dropped_at_commit_then_a_rerun_succeeds(
    hub_endpoint: FakeHub, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    folder = make_export(tmp_path / "export")
    before = fingerprint(folder)
    hub_endpoint.drop_commits = True

    with pytest.raises(
        HubError, match="Could not reach the Hub .*RemoteProtocolError.* The local folder is intact"
    ) as info:
        push_folder(folder, REPO)
    assert_no_token(info.value, os.environ["HF_TOKEN"])
    assert fingerprint(folder) == before
    assert [s.rfilename for s in HfApi().model_info(REPO).siblings or []] == [".gitattributes"]  # nothing committed

    hub_endpoint.drop_commits = False
    commit = push_folder(folder, REPO)
    assert HfApi().model_info(REPO).sha == commit.oid
    # The token is in no log record and in no file written (cache, folder).
    token = os.environ["HF_TOKEN"]
    assert token not in caplog.text
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]


BROKEN_EXPORTS = {
    "no config": (lambda folder: (folder / "config.json").unlink(), "missing config.json"),
    "no weights": (lambda folder: (folder / "model.safetensors").unlink(), "missing weights"),
    "config not JSON": (lambda folder: (folder / "config.json").write_text("{"), "config.json is not valid JSON"),
}


@pytest.mark.parametrize("case", BROKEN_EXPORTS)
def test_a_folder_that_is_not_an_export_is_refused(hub_endpoint: FakeHub, tmp_path: Path, case: str) -> None:
    break_export, problem = BROKEN_EXPORTS[case]
    folder = make_export(tmp_path / "export")
    break_export(folder)

    with pytest.raises(HubError, match=problem):
        push_folder(folder, REPO)
    assert hub_endpoint.requests == []


def test_push_refuses_an_export_cut_short_in_one_line(
    hub_endpoint: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a kill -9 left of an export before exports were written whole: config and weights, no tokenizer or card."""
    folder = make_export(tmp_path / "export")
    (folder / "README.md").unlink()

    with pytest.raises(SystemExit) as stopped:
        main(["push", str(folder), REPO])
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "missing tokenizer.json, tokenizer_config.json. Export it again (hf-transformer export" in err
    assert hub_endpoint.requests == []


def test_a_file_is_not_an_export_folder(hub_endpoint: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(HubError, match="it is not a folder"):
        push_folder(make_export(tmp_path / "export") / "config.json", REPO)


def test_a_sharded_export_needs_every_shard_of_its_index(hub_endpoint: FakeHub, tmp_path: Path) -> None:
    folder = make_export(tmp_path / "export")
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    with pytest.raises(HubError, match="missing model-00002-of-00002.safetensors"):
        push_folder(folder, REPO)


def test_fake_hub_errors_map_to_huggingface_hub_exceptions(hub_endpoint: FakeHub, tmp_path: Path) -> None:
    push_folder(make_export(tmp_path / "export"), REPO, private=True)
    anonymous = HfApi(token=False)

    with pytest.raises(HfHubHTTPError) as info:
        anonymous.create_repo("alice/other")
    assert info.value.response.status_code == 401
    with pytest.raises(RepositoryNotFoundError):
        anonymous.model_info(REPO)  # private: hidden from anonymous users
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("alice/missing", "config.json")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "config.json", revision="no-such-branch")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "no-such-file.json")
    assert HfApi().model_info(REPO).private is True


# --- the model card -----------------------------------------------------------------------------------------------


def card_checkpoint(**extra) -> dict:
    """What the card reads from a training checkpoint, without weights: enough to write a card."""
    generation = {"num_beams": 4, "length_penalty": 0.6, "max_new_tokens": 63}
    return {"hf_config": make_tiny_config().to_dict(), "generation_config": generation, "global_step": 30, **extra}


def test_each_score_carries_the_signature_of_what_computed_it(tmp_path: Path) -> None:
    """Validation scores are torchmetrics' (unsmoothed BLEU), test scores `hf_transformer.scoring`'s (sacreBLEU's
    default, exponentially smoothed): the card labelled both with the first."""
    results = {"test/bleu": 31.2, "test/chrf": 55.0, "val/bleu": 30.0, "val/chrf": 50.0}
    card = ModelCard.load(write_model_card(tmp_path, card_checkpoint(), results=results))
    signatures = {(r.dataset_split, r.metric_type): r.metric_args["signature"] for r in card.data.eval_results}

    hypotheses, references = ["a dog runs on the grass"], ["a dog walks on the grass"]  # no 4-gram in common
    labels = {score.name: score.how for score in sacrebleu_scores(hypotheses, references)}
    assert signatures[("test", "bleu")] == labels[SACREBLEU] and signatures[("test", "chrf")] == labels[CHRF_SCORE]
    assert signatures[("val", "bleu")] == bleu_signature() and signatures[("val", "chrf")] == chrf_signature()
    # The two BLEUs differ where smoothing counts, and each signature describes its own: the metric that validation
    # logs computes what its signature says.
    validation = 100 * float(VALIDATION_BLEU.torchmetrics()(hypotheses, [references]))
    assert validation == pytest.approx(BLEU(smooth_method="none").corpus_score(hypotheses, [references]).score)
    assert validation == 0 < BLEU().corpus_score(hypotheses, [references]).score
    assert "smooth:none" in signatures[("val", "bleu")] and "smooth:exp" in signatures[("test", "bleu")]
    for split in ("test", "val"):
        line = next(line for line in card.text.splitlines() if line.startswith(f"- {split}: scored by "))
        assert f"BLEU `{signatures[(split, 'bleu')]}`" in line and f"chrF `{signatures[(split, 'chrf')]}`" in line


def test_the_cards_training_rows_are_the_schedules_and_the_modules_own_descriptions(tmp_path: Path) -> None:
    """The card shows how the module trained as the module describes it (the schedule's own description, a row of
    each variant's): a cool-down and R-Drop appear, for a checkpoint of this version and, described when it is
    exported, for one of 0.4 that held them as flat module arguments."""
    schedule = InverseSquareRootWithCooldown(cooldown_steps=300, peak_lr=0.002, warmup_steps=100)
    module = RDropTranslationModule(config=dict(TINY_CONFIG), alpha=3.0, schedule=schedule)
    checkpoint = card_checkpoint(hyper_parameters=dict(module.hparams), training_description=module.describe_training())
    flat = dict(peak_lr=0.002, warmup_steps=100, cooldown_steps=300, rdrop_alpha=3.0, betas=[0.9, 0.98], eps=1e-9)
    old = card_checkpoint(hyper_parameters=flat)
    rows = []
    for name, written in (("new", checkpoint), ("old", old)):
        (tmp_path / name).mkdir()
        card = write_model_card(tmp_path / name, {**written, "training_description": describe_training(written)})
        rows.append(re.findall(r"^\| (Learning-rate schedule|R-Drop) \| (.*) \|$", card.read_text(), re.MULTILINE))
    assert rows[0] == rows[1] and [label for label, _ in rows[0]] == ["Learning-rate schedule", "R-Drop"]
    assert rows[0][0][1] == schedule.describe(make_tiny_config().d_model)
    assert "peak 0.002 after 100 linear warm-up steps" in rows[0][0][1] and "the last 300 steps" in rows[0][0][1]
    assert rows[0][1][1].startswith("alpha 3.0 (Liang et al. 2021)")


def test_the_cards_decoding_row_gives_the_output_bound_of_each_way_to_decode(tiny_tokenizer, tmp_path: Path) -> None:
    """A `max_new_tokens` saved by a model of 0.4 bounds its `generate()` only: `translate()`, which validation, test,
    the translate command and the server decode with, bounds the output by the source length, and so does the
    `generate()` of a model that saves no bound (as models do from 0.5 on)."""
    checkpoint = card_checkpoint()
    text = write_model_card(tmp_path, checkpoint).read_text()
    row = re.search(r"^\| Decoding \| (.*) \|$", text, re.MULTILINE).group(1)
    assert row.startswith("beam search with 4 beams, length penalty 0.6 (`generation_config.json`)")
    assert "at most 63 tokens with `generate()`" in row
    assert f"at most the source's length + {MAX_LENGTH_OFFSET} with `hf_transformer.translate()`" in row
    del checkpoint["generation_config"]["max_new_tokens"]
    text = write_model_card(tmp_path, checkpoint).read_text()
    row = re.search(r"^\| Decoding \| (.*) \|$", text, re.MULTILINE).group(1)
    assert f"length + {MAX_LENGTH_OFFSET} with `generate()`, the pipeline and `hf_transformer.translate()`" in row

    # A model that never ends its output runs to whichever bound applies.
    config = TransformerConfig(**{**make_tiny_config().to_dict(), "vocab_size": len(tiny_tokenizer)})
    model = TransformerForConditionalGeneration(config).eval()
    never_eos = torch.tensor([config.eos_token_id])
    model.lm_head.register_forward_hook(lambda module, args, logits: logits.index_fill(-1, never_eos, float("-inf")))
    model.generation_config.max_new_tokens = 3
    sentences = ["a dog", "two men play music"]
    inputs = tiny_tokenizer(sentences, return_tensors="pt", padding=True)
    assert model.generate(**inputs).shape[1] - 1 == 3  # - 1: the start token
    translations = translate(model, tiny_tokenizer, sentences, num_return_sequences=1)
    for sentence, best in zip(sentences, translations, strict=True):
        produced = len(best[0].token_ids) - 1
        assert produced == len(tiny_tokenizer(sentence)["input_ids"]) + MAX_LENGTH_OFFSET  # below the positions

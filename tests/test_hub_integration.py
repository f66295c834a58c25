"""A trained checkpoint goes to the (fake, in-process) Hub and comes back: `hf-transformer push`, loading by repo id
where this package is not installed, revisions, the offline cache, the model card, the push callback, and the
errors of a push that cannot happen."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import pytest
import torch
from conftest import tiny_data, tiny_module
from huggingface_hub import HfApi, ModelCard, hf_hub_download, metadata_load, snapshot_download
from lightning.pytorch.callbacks import ModelCheckpoint
from safetensors.torch import load_file

from hf_transformer import TransformerForConditionalGeneration, TranslationPipeline
from hf_transformer.errors import HubError
from hf_transformer.hub.model_card import bleu_signature, signatures, write_model_card
from lightning_modules.callbacks.push_to_hub import PushToHubCallback
from lightning_modules.checkpoint import RUN_ID, load_checkpoint, model_from_checkpoint, tokenizer_from_checkpoint
from lightning_modules.checkpoint_export import export_checkpoint, keep_test_scores
from lightning_modules.cli import main
from lightning_modules.module import TranslationModule
from lightning_modules.schedules import InverseSquareRoot

if TYPE_CHECKING:
    from tests.hub_server import FakeHub

# Imported by pytest (not here) so that it can rewrite the module's asserts.
pytest_plugins = ["tests.hub_server"]

REPO = "alice/transformer-digits"
ALICE_TOKEN = "hf_fake_alice_0123456789"  # tests.hub_server's token of `alice`, what HF_TOKEN holds
SENTENCES = ["4821", "17", "300000"]
# Not the paper's 4 / 0.6: the export must carry what the run used.
RUN_DECODING = {"num_beams": 3, "length_penalty": 0.8}
# The run's data and model beside conftest's tiny ones.
RUN_DATA = dict(synthetic_train_size=200, synthetic_eval_size=20, max_tokens=512)
RUN_MODULE = dict(
    generation=RUN_DECODING,
    # max_position_embeddings is also the generation length limit: an untrained model decodes that far.
    config=dict(dropout=0.0, max_position_embeddings=32),
    schedule=InverseSquareRoot(warmup_steps=10),
)


# --- a tiny trained run ------------------------------------------------------------------------------------------


def tiny_trainer(root: Path, callbacks: list[pl.Callback], validate_every_step: bool = False) -> pl.Trainer:
    validation = {"val_check_interval": 1, "check_val_every_n_epoch": None} if validate_every_step else {}
    return pl.Trainer(
        max_steps=2,
        accelerator="cpu",
        logger=False,
        callbacks=callbacks,
        enable_checkpointing=any(isinstance(callback, ModelCheckpoint) for callback in callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=1,
        use_distributed_sampler=False,
        default_root_dir=str(root),
        **validation,
    )


@pytest.fixture(scope="module")
def checkpoint_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint written by the Trainer after two steps: weights, hparams of module and data, tokenizer."""
    root = tmp_path_factory.mktemp("run")
    torch.manual_seed(0)
    data = tiny_data(root, **RUN_DATA)
    trainer = tiny_trainer(root, callbacks=[])
    trainer.fit(tiny_module(data, **RUN_MODULE), data)
    trainer.save_checkpoint(root / "last.ckpt", weights_only=True)
    return root / "last.ckpt"


def perturbed_copy(path: Path, target: Path) -> Path:
    """The same checkpoint with other weights: a second version of the model."""
    checkpoint = load_checkpoint(path)
    generator = torch.Generator().manual_seed(1)
    for tensor in checkpoint["state_dict"].values():
        if tensor.is_floating_point():
            tensor.add_(0.1 * torch.randn(tensor.shape, generator=generator))
    torch.save(checkpoint, target)
    return target


# --- what the local model computes, and what a fresh interpreter computes from the Hub ---------------------------


def model_inputs(tmp: Path, checkpoint: dict[str, Any]) -> Path:
    tokenizer = tokenizer_from_checkpoint(checkpoint)
    decoder_input_ids = torch.tensor([[1, 5, 9, 12]] * len(SENTENCES))
    path = tmp / "inputs.pt"
    torch.save(
        {"sentences": SENTENCES, "decoder_input_ids": decoder_input_ids, "ids": tokenizer(SENTENCES)["input_ids"]}, path
    )
    return path


def local_outputs(checkpoint: dict[str, Any], inputs_path: Path) -> dict[str, Any]:
    inputs = torch.load(inputs_path)
    model, tokenizer = model_from_checkpoint(checkpoint), tokenizer_from_checkpoint(checkpoint)
    encoded = tokenizer(inputs["sentences"], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**encoded, decoder_input_ids=inputs["decoder_input_ids"]).logits
    output_ids = model.generate(**encoded)
    translations = tokenizer.batch_decode(output_ids, skip_special_tokens=True)
    return {"logits": logits, "output_ids": output_ids, "translations": [text.strip() for text in translations]}


# Run where `hf_transformer` cannot be imported: everything comes from the repo (code included).
REMOTE_LOAD = """
import sys
sys.modules["hf_transformer"] = None  # as if this package were not installed
sys.modules["lightning_modules"] = None
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

repo_id, inputs_path, outputs_path, *revisions = sys.argv[1:]
inputs = torch.load(inputs_path)
outputs = {}
for revision in revisions:
    revision = None if revision == "main" else revision
    tokenizer = AutoTokenizer.from_pretrained(repo_id, revision=revision, trust_remote_code=True)
    model = AutoModelForSeq2SeqLM.from_pretrained(repo_id, revision=revision, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
    encoded = tokenizer(inputs["sentences"], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**encoded, decoder_input_ids=inputs["decoder_input_ids"]).logits
    translator = pipeline("translation", model=repo_id, revision=revision, trust_remote_code=True)
    outputs[revision or "main"] = {
        "ids": tokenizer(inputs["sentences"])["input_ids"],
        "logits": logits,
        "output_ids": model.generate(**encoded),
        "generation": model.generation_config.to_dict(),
        "pipeline": [result["translation_text"] for result in translator(inputs["sentences"])],
    }
torch.save(outputs, outputs_path)
"""


def run_without_the_package(tmp: Path, script: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter, cwd an empty folder, with the fake Hub's environment (HF_ENDPOINT, HF_HOME, ...)."""
    workdir = tmp / f"child-{len(list(tmp.glob('child-*')))}"
    workdir.mkdir()
    (workdir / "script.py").write_text(textwrap.dedent(script))
    result = subprocess.run(
        [sys.executable, "script.py", *args],
        cwd=workdir,
        env={**os.environ, "PYTHONPATH": "", **env},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def load_remotely(tmp: Path, inputs_path: Path, *revisions: str, **env: str) -> dict[str, dict[str, Any]]:
    outputs_path = tmp / f"outputs-{len(list(tmp.glob('outputs-*')))}.pt"
    run_without_the_package(tmp, REMOTE_LOAD, REPO, str(inputs_path), str(outputs_path), *revisions, **env)
    return torch.load(outputs_path)


def assert_same_model(remote: dict[str, Any], local: dict[str, Any]) -> None:
    torch.testing.assert_close(remote["logits"], local["logits"], atol=0, rtol=0)
    assert torch.equal(remote["output_ids"], local["output_ids"])
    assert remote["pipeline"] == local["translations"]


def push(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`hf-transformer push ...` in this process: (exit status, stdout, stderr)."""
    try:
        main(["push", *argv])
        status = 0
    except SystemExit as exit_:
        status = exit_.code
    out, err = capsys.readouterr()
    return status, out, err


def commit_sha(out: str) -> str:
    return re.search(r"/commit/([0-9a-f]{40})", out).group(1)


def repo_files(hub: FakeHub, revision: str = "refs/heads/main") -> dict[str, bytes]:
    repo = hub.repos[REPO]
    return repo.commits[repo.resolve(revision)].files


# --- push and load back ------------------------------------------------------------------------------------------


def test_pushed_checkpoints_load_by_repo_id_and_revision_without_the_package(
    hub_endpoint: FakeHub, checkpoint_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    second_path = perturbed_copy(checkpoint_path, tmp_path / "second.ckpt")
    before = checkpoint_path.read_bytes()

    status, out, err = push(str(checkpoint_path), REPO, "--commit-message", "first", capsys=capsys)

    assert status == 0, err
    assert out.startswith(f"Pushed {checkpoint_path} to {REPO}: commit {hub_endpoint.url}/{REPO}/commit/")
    assert checkpoint_path.read_bytes() == before
    files = repo_files(hub_endpoint)
    expected_files = {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"}
    expected_files |= {"tokenizer_config.json", "README.md", "pipeline_translation.py"}
    expected_files |= {"modeling_transformer.py", "configuration_transformer.py"}
    assert expected_files <= set(files)
    assert "AutoModelForSeq2SeqLM" in json.loads(files["config.json"])["auto_map"]
    assert all(ALICE_TOKEN.encode() not in data for data in files.values())
    assert ALICE_TOKEN not in out + err

    second_status, second_out, _ = push(str(second_path), REPO, capsys=capsys)  # a second version: a new commit

    assert second_status == 0
    first, second = commit_sha(out), commit_sha(second_out)
    # main ends on the card's own commit, whose snippet pins the commit of the model (and of its code).
    assert first != second and f'revision = "{second}"' in repo_files(hub_endpoint)["README.md"].decode()
    assert [hub_endpoint.repos[REPO].commits[sha].message for sha in (first, second)] == [
        "first",
        "Upload second.ckpt with hf-transformer",
    ]
    checkpoint = load_checkpoint(checkpoint_path)
    inputs_path = model_inputs(tmp_path, checkpoint)
    expected = {
        first: local_outputs(checkpoint, inputs_path),
        "main": local_outputs(load_checkpoint(second_path), inputs_path),
    }
    remote = load_remotely(tmp_path, inputs_path, first, "main")
    for revision, local in expected.items():
        assert_same_model(remote[revision], local)
        assert remote[revision]["ids"] == torch.load(inputs_path)["ids"]  # AutoTokenizer: the training tokenizer
        assert {key: remote[revision]["generation"][key] for key in RUN_DECODING} == RUN_DECODING


def test_after_a_first_download_a_fresh_interpreter_loads_offline_from_the_cache(
    hub_endpoint: FakeHub, checkpoint_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert push(str(checkpoint_path), REPO, capsys=capsys)[0] == 0
    snapshot_download(REPO)  # the first download fills the cache (HF_HOME is shared with the child)
    hub_endpoint.stop()  # offline must not need the server

    checkpoint = load_checkpoint(checkpoint_path)
    inputs_path = model_inputs(tmp_path, checkpoint)
    offline = load_remotely(tmp_path, inputs_path, "main", HF_HUB_OFFLINE="1")

    assert_same_model(offline["main"], local_outputs(checkpoint, inputs_path))


def test_the_cards_usage_snippet_runs_as_written_against_the_repo(
    hub_endpoint: FakeHub, checkpoint_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = push(str(checkpoint_path), REPO, capsys=capsys)
    assert status == 0
    card = Path(hf_hub_download(REPO, "README.md")).read_text()
    snippet = re.search(r"```python\n(.*?)```", card, flags=re.DOTALL).group(1)
    assert f'model_id = "{REPO}"' in snippet
    # Pinned to the commit that pushed the model (the card's own commit follows it): transformers warned six times,
    # once per code file, that new code was downloaded and might hold malicious code.
    assert f'revision = "{commit_sha(out)}"' in snippet

    result = run_without_the_package(tmp_path, 'import sys\nsys.modules["hf_transformer"] = None\n' + snippet)
    assert "malicious" not in result.stderr and "revision" not in result.stderr, result.stderr

    checkpoint = load_checkpoint(checkpoint_path)
    tokenizer, model = tokenizer_from_checkpoint(checkpoint), model_from_checkpoint(checkpoint)
    example = json.loads(re.search(r"tokenizer\(\[(.*?)\]", snippet).group(1))
    output_ids = model.generate(**tokenizer([example], return_tensors="pt", padding=True))
    translation = tokenizer.batch_decode(output_ids, skip_special_tokens=True)
    assert result.stdout.splitlines()[-2:] == [
        repr(translation),
        repr([{"translation_text": translation[0].strip()}]),
    ]


@pytest.mark.parametrize("source", ["checkpoint", "exported folder"])
def test_marian_format_loads_by_repo_id_with_stock_marian_and_its_card_snippet_runs(
    hub_endpoint: FakeHub, checkpoint_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], source: str
) -> None:
    """`push --format marian`: stock `MarianMTModel` loads the repo by id where this package is not installed, no
    remote code, and decodes as the checkpoint does; the card's Marian snippet runs as written."""
    if source == "checkpoint":
        pushed_from = checkpoint_path
    else:
        pushed_from = tmp_path / "export"
        main(["export", str(checkpoint_path), str(pushed_from)])
    status, _, err = push(str(pushed_from), REPO, "--format", "marian", capsys=capsys)

    assert status == 0, err
    files = repo_files(hub_endpoint)
    assert json.loads(files["config.json"])["model_type"] == "marian"
    assert not any(name.endswith(".py") for name in files)  # no code travels with it
    card = files["README.md"].decode()
    assert "custom_code" not in ModelCard(card).data.tags and str(tmp_path) not in card
    snippet = re.search(r"```python\n(.*?)```", card, flags=re.DOTALL).group(1)
    assert f'model_id = "{REPO}"' in snippet and "MarianMTModel.from_pretrained(model_id)" in snippet
    assert "trust_remote_code" not in snippet

    without_the_package = 'import sys\nsys.modules["hf_transformer"] = sys.modules["lightning_modules"] = None\n'
    result = run_without_the_package(tmp_path, without_the_package + snippet)

    checkpoint = load_checkpoint(checkpoint_path)
    tokenizer, model = tokenizer_from_checkpoint(checkpoint), model_from_checkpoint(checkpoint)
    example = json.loads(re.search(r"tokenizer\(\[(.*?)\]", snippet).group(1))
    output_ids = model.generate(**tokenizer([example], return_tensors="pt", padding=True))
    assert result.stdout.splitlines()[-1] == repr(tokenizer.batch_decode(output_ids, skip_special_tokens=True))


def test_a_marian_folder_pushes_as_marian_only_with_its_card_pointing_at_the_repo(
    hub_endpoint: FakeHub, checkpoint_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "marian"
    main(["export", str(checkpoint_path), str(folder), "--format", "marian"])
    assert f'model_id = "{folder.resolve()}"' in (folder / "README.md").read_text()

    status, _, err = push(str(folder), REPO, capsys=capsys)
    assert status == 1 and "is an export of --format marian: push it with --format marian" in err

    status, _, err = push(str(folder), REPO, "--format", "marian", capsys=capsys)
    assert status == 0, err
    card = repo_files(hub_endpoint)["README.md"].decode()
    assert f'model_id = "{REPO}"' in card and "MarianMTModel.from_pretrained(model_id)" in card
    assert f'model_id = "{folder.resolve()}"' in (folder / "README.md").read_text()  # the folder is only read


def test_with_the_package_installed_no_remote_code_is_needed_and_training_can_start_from_the_repo(
    hub_endpoint: FakeHub, checkpoint_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoModelForSeq2SeqLM, pipeline

    from lightning_modules.data.tokenization import load_tokenizer

    assert push(str(checkpoint_path), REPO, capsys=capsys)[0] == 0
    checkpoint = load_checkpoint(checkpoint_path)
    local = model_from_checkpoint(checkpoint)

    loaded = AutoModelForSeq2SeqLM.from_pretrained(REPO)
    translator = pipeline("translation", model=REPO, pipeline_class=TranslationPipeline)
    tokenizer = load_tokenizer(REPO)  # what `--data.tokenizer user/repo` does
    module = TranslationModule(tokenizer=tokenizer, init_from=REPO)

    assert type(loaded) is TransformerForConditionalGeneration
    assert type(module.model) is TransformerForConditionalGeneration
    for model in (loaded, module.model):
        state = model.state_dict()
        assert state.keys() == local.state_dict().keys()
        assert all(torch.equal(tensor, state[name]) for name, tensor in local.state_dict().items())
    expected = local_outputs(checkpoint, model_inputs(tmp_path, checkpoint))["translations"]
    assert [result["translation_text"] for result in translator(SENTENCES)] == expected


def test_an_exported_folder_pushes_with_its_card_pointing_at_the_repo(
    hub_endpoint: FakeHub, checkpoint_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "export"
    main(["export", str(checkpoint_path), str(folder)])
    before = {path.name: path.read_bytes() for path in folder.iterdir()}

    status, out, err = push(str(folder), REPO, "--revision", "experiment", "--private", capsys=capsys)

    assert status == 0, err
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before  # the folder is only read
    assert f'model_id = "{folder.resolve()}"' in before["README.md"].decode()
    pushed = repo_files(hub_endpoint, "experiment")
    card = pushed["README.md"].decode()
    assert f'model_id = "{REPO}"' in card and "# transformer-digits\n" in card and str(folder) not in card
    assert pushed["model.safetensors"] == before["model.safetensors"]
    assert HfApi().model_info(REPO).private is True
    assert "README.md" not in repo_files(hub_endpoint)  # main untouched


def test_results_and_wandb_link_given_to_push_go_into_the_card(
    hub_endpoint: FakeHub, checkpoint_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scores = tmp_path / "test_scores.json"  # as `hf-transformer test` writes it
    scores.write_text(json.dumps({"test/bleu": 27.31, "test/chrf": 55.0, "test/loss": 2.1}))
    wandb_url = "https://wandb.ai/alice/hf-transformer/runs/abc123"

    status, _, err = push(str(checkpoint_path), REPO, "--results", str(scores), "--wandb-url", wandb_url, capsys=capsys)

    assert status == 0, err
    card = ModelCard.load(hf_hub_download(REPO, "README.md"))
    assert {(r.dataset_split, r.metric_type, r.metric_value) for r in card.data.eval_results} == {
        ("test", "bleu", 27.31),
        ("test", "chrf", 55.0),
    }
    assert f"[W&B run]({wandb_url})" in card.text


def eval_results(card: ModelCard) -> set[tuple[str, str, float]]:
    """What huggingface_hub reads back from a card's model-index."""
    return {(result.dataset_split, result.metric_type, result.metric_value) for result in card.data.eval_results}


def test_every_route_to_a_shared_folder_carries_the_test_scores_into_the_card(
    hub_endpoint: FakeHub, checkpoint_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The scores that `hf-transformer test` wrote reach the card's model-index by export (one checkpoint or an
    average), by push of an exported folder (whose own folder stays as it was), and by push of an average."""
    scores = tmp_path / "test_scores.json"
    scores.write_text(json.dumps({"test/bleu": 31.5, "test/chrf": 58.25, "sacreBLEU": 31.5}))
    expected = {("test", "bleu", 31.5), ("test", "chrf", 58.25)}
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    shutil.copy(checkpoint_path, checkpoints / "step000002.ckpt")

    main(["export", str(checkpoints), str(tmp_path / "averaged"), "--average", "1", "--results", str(scores)])
    assert eval_results(ModelCard.load(tmp_path / "averaged" / "README.md")) == expected

    main(["export", str(checkpoint_path), str(tmp_path / "plain")])
    before = {path.name: path.read_bytes() for path in (tmp_path / "plain").iterdir()}
    assert push(str(tmp_path / "plain"), REPO, "--results", str(scores), capsys=capsys)[0] == 0
    assert eval_results(ModelCard.load(hf_hub_download(REPO, "README.md"))) == expected
    assert {path.name: path.read_bytes() for path in (tmp_path / "plain").iterdir()} == before

    status, _, err = push(str(checkpoints), REPO, "--average", "1", "--results", str(scores), capsys=capsys)
    assert status == 0, err
    assert eval_results(ModelCard.load(hf_hub_download(REPO, "README.md", force_download=True))) == expected

    # A checkpoint that `hf-transformer test` scored, pushed without --results: the scores kept beside it.
    tested = tmp_path / "tested" / "last.ckpt"
    tested.parent.mkdir()
    torch.save({**load_checkpoint(checkpoint_path), RUN_ID: "a run"}, tested)
    keep_test_scores(tested, json.loads(scores.read_text()), tmp_path / "logs")
    status, out, err = push(str(tested), REPO, capsys=capsys)
    assert status == 0 and "Test scores on the model card: " in out, err
    assert eval_results(ModelCard.load(hf_hub_download(REPO, "README.md", force_download=True))) == expected


def test_create_pr_opens_a_pull_request(
    hub_endpoint: FakeHub, checkpoint_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert push(str(checkpoint_path), REPO, capsys=capsys)[0] == 0
    proposal = perturbed_copy(checkpoint_path, tmp_path / "proposal.ckpt")  # identical files would be a no-op

    status, out, _ = push(str(proposal), REPO, "--create-pr", capsys=capsys)

    assert status == 0 and out.rstrip().endswith(f"pull request {hub_endpoint.url}/{REPO}/discussions/1")
    assert "refs/pr/1" in hub_endpoint.repos[REPO].refs


# --- pushes that cannot happen -------------------------------------------------------------------------------------


def no_token(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN")


def hub_down(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    hub.stop()


def connection_dropped_at_commit(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    hub.drop_commits = True


FAILURES = {
    "no token": (no_token, REPO, r"No Hugging Face token found: set HF_TOKEN or run `hf auth login`"),
    "invalid repo id": (None, "alice/has space", r"Invalid repo id 'alice/has space': expected 'namespace/name'"),
    "someone else's repo": (None, "bob/transformer", r"User 'alice' may not write to 'bob/transformer' \(403\)"),
    "hub down": (hub_down, REPO, r"Could not reach the Hub at .* while pushing .*last\.ckpt to "),
    "dropped at commit": (connection_dropped_at_commit, REPO, r"Could not reach the Hub .*RemoteProtocolError"),
}


@pytest.mark.parametrize("case", FAILURES)
def test_a_failed_push_says_why_and_leaves_nothing_that_looks_complete(
    hub_endpoint: FakeHub,
    checkpoint_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    case: str,
) -> None:
    break_push, repo_id, message = FAILURES[case]
    if break_push is not None:
        break_push(hub_endpoint, monkeypatch)
    before = checkpoint_path.read_bytes()

    status, out, err = push(str(checkpoint_path), repo_id, capsys=capsys)

    assert status == 1 and out == ""
    last_line = err.splitlines()[-1]  # after the export's progress bar
    assert last_line.startswith("hf-transformer push: error: ") and re.search(message, last_line), err
    assert "Traceback" not in err and ALICE_TOKEN not in err
    assert checkpoint_path.read_bytes() == before
    committed = [repo for repo in hub_endpoint.repos.values() if len(repo.commits) > 1]
    assert committed == []  # at most the repo's initial commit: no model files


def test_a_source_that_is_neither_a_checkpoint_nor_an_export_is_refused(
    hub_endpoint: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.ckpt").write_text("not a checkpoint")
    (tmp_path / "empty").mkdir()
    cases = {
        tmp_path / "missing.ckpt": "no such file or folder",
        tmp_path / "notes.ckpt": "not a checkpoint written by TranslationModule",
        tmp_path / "empty": "does not look like an exported model, missing config.json",
    }
    for source, message in cases.items():
        status, _, err = push(str(source), REPO, capsys=capsys)
        assert status == 1 and message in err and "Traceback" not in err
    assert hub_endpoint.requests == []


# --- the push callback -------------------------------------------------------------------------------------------


def test_the_callback_pushes_on_each_best_and_at_train_end(hub_endpoint: FakeHub, tmp_path: Path) -> None:
    torch.manual_seed(0)
    data = tiny_data(tmp_path, **RUN_DATA)
    module = tiny_module(data, **RUN_MODULE)
    callback = PushToHubCallback(REPO, push_on_best="val/bleu")
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True)
    trainer = tiny_trainer(tmp_path / "run", callbacks=[callback, checkpoints], validate_every_step=True)

    trainer.fit(module, data)

    messages = [hub_endpoint.repos[REPO].commits[commit.oid].message for commit in callback.pushes]
    assert messages[0].startswith("New best val/bleu = ") and messages[-1] == "Model after 2 training steps"
    assert f'revision = "{callback.pushes[-1].oid}"' in repo_files(hub_endpoint)["README.md"].decode()
    pushed = load_file(hf_hub_download(REPO, "model.safetensors"))
    trained = module.model.state_dict()
    assert pushed and all(torch.equal(tensor, trained[name]) for name, tensor in pushed.items())
    card = ModelCard.load(hf_hub_download(REPO, "README.md"))
    assert {(r.dataset_split, r.metric_type) for r in card.data.eval_results} == {
        ("validation", "bleu"),
        ("validation", "chrf"),
    }
    assert "| Compute | 1 x CPU, precision 32-true" in card.text
    assert (tmp_path / "run" / "hub_export" / "config.json").is_file()  # kept for a manual re-push
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and ALICE_TOKEN.encode() in p.read_bytes()]


def test_the_callback_refuses_to_start_training_without_a_token(
    hub_endpoint: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_TOKEN")
    data = tiny_data(tmp_path, **RUN_DATA)
    trainer = tiny_trainer(tmp_path / "run", callbacks=[PushToHubCallback(REPO)])

    with pytest.raises(HubError, match="set HF_TOKEN or run `hf auth login`"):
        trainer.fit(tiny_module(data, **RUN_MODULE), data)
    assert trainer.global_step == 0


def test_the_callback_logs_a_failed_push_and_keeps_the_export(
    hub_endpoint: FakeHub, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tiny_data(tmp_path, **RUN_DATA)
    callback = PushToHubCallback("bob/transformer")
    trainer = tiny_trainer(tmp_path / "run", callbacks=[callback])

    trainer.fit(tiny_module(data, **RUN_MODULE), data)

    assert callback.pushes == [] and trainer.global_step == 2
    assert "may not write to 'bob/transformer' (403)" in caplog.text
    assert f"hf-transformer push {tmp_path / 'run' / 'hub_export'} bob/transformer" in caplog.text
    assert not list((tmp_path / "run").glob(".hub_export-*"))  # no half-written export left beside it


def test_an_invalid_repo_id_fails_when_the_callback_is_made() -> None:
    with pytest.raises(HubError, match="Invalid repo id 'transformer'"):
        PushToHubCallback("transformer")


# --- the model card -----------------------------------------------------------------------------------------------


def test_the_card_is_valid_metadata_with_results_and_signatures(checkpoint_path: Path, tmp_path: Path) -> None:
    checkpoint = load_checkpoint(checkpoint_path)
    results = {"test/bleu": 31.234, "test/chrf": 58.9, "test/loss": 1.5, "val/bleu": 30.0}
    export_checkpoint(
        checkpoint, tmp_path, repo_id=REPO, results=results, wandb_url="https://wandb.ai/alice/hf/runs/abc"
    )

    metadata = metadata_load(tmp_path / "README.md")
    card = ModelCard.load(tmp_path / "README.md")

    assert metadata["library_name"] == "transformers" and metadata["license"] == "apache-2.0"
    assert metadata["pipeline_tag"] == "translation" and "translation" in metadata["tags"]
    assert "language" not in metadata and "datasets" not in metadata  # digits/words, synthetic: nothing to claim
    scores = {(r.dataset_split, r.metric_type): (r.metric_value, r.metric_args) for r in card.data.eval_results}
    assert scores == {
        ("test", "bleu"): (31.23, {"signature": signatures("test")["bleu"]}),  # hf_transformer.scoring's
        ("test", "chrf"): (58.9, {"signature": signatures("test")["chrf"]}),
        ("validation", "bleu"): (30.0, {"signature": bleu_signature()}),
    }
    assert bleu_signature().startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:none|version:")
    assert card.data.model_name == "transformer-digits"
    parameters = model_from_checkpoint(checkpoint).num_parameters()
    assert f"| Parameters | {parameters:,} " in card.text
    assert "| Training steps | 2 optimizer steps |" in card.text
    assert "| Dropout P_drop | 0.0 |" in card.text  # the further dropouts are 0: left out
    assert "beam search with 3 beams, length penalty 0.8" in card.text
    assert "[W&B run](https://wandb.ai/alice/hf/runs/abc)" in card.text
    assert "| test | 31.23 | 58.90 | 1.50 |" in card.text
    generation = json.loads((tmp_path / "generation_config.json").read_text())
    assert {key: generation[key] for key in RUN_DECODING} == RUN_DECODING


def test_the_cards_label_smoothing_is_the_model_configs(checkpoint_path: Path, tmp_path: Path) -> None:
    """Read from `TransformerConfig.label_smoothing`: every 0.3.0 card printed None (it read a module argument)."""
    checkpoint = load_checkpoint(checkpoint_path)
    checkpoint["hf_config"]["label_smoothing"] = 0.2
    export_checkpoint(checkpoint, tmp_path)
    rows = re.findall(r"^\| Label smoothing \| (.*?) \|$", (tmp_path / "README.md").read_text(), re.MULTILINE)
    assert rows == ["0.2"]


def test_the_card_of_a_hub_dataset_names_languages_dataset_and_base_model(
    checkpoint_path: Path, tmp_path: Path
) -> None:
    checkpoint = load_checkpoint(checkpoint_path)
    checkpoint["datamodule_hyper_parameters"].update(
        dataset="bentrevett/multi30k",
        source_lang="de",
        target_lang="en",
    )
    checkpoint["hyper_parameters"]["init_from"] = "alice/transformer-base"
    checkpoint["hf_config"].update(dropout=0.2, attention_dropout=0.1, activation_dropout=0.15)

    metadata = metadata_load(write_model_card(tmp_path, checkpoint))

    assert metadata["language"] == ["de", "en"]
    assert metadata["datasets"] == ["bentrevett/multi30k"]
    assert metadata["base_model"] == "alice/transformer-base"
    assert "model-index" not in metadata  # no results, no claims
    text = (tmp_path / "README.md").read_text()
    assert "No evaluation results were recorded" in text
    assert f'model_id = "{tmp_path.resolve()}"' in text
    assert "| Dropout P_drop | 0.2; 0.1 on the attention weights; 0.15 inside the feed-forward networks |" in text

"""W&B logging: `AutoWandbLogger` picks offline mode without credentials, and a short offline training run records the
hyperparameters, the training loss, the learning rate, validation BLEU and the table of sample translations in its
run file, which `wandb sync` would upload later.

wandb 0.31 has no Python reader for run files any more (the writer is the Go `wandb-core`), so `read_run_file` reads
the format: a 7-byte header, then LevelDB-log records (https://github.com/google/leveldb/blob/main/doc/log_format.md)
in 32 KiB blocks, each chunk checksummed with zlib's crc32, holding serialized `wandb_internal_pb2.Record` protos.
"""

import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import wandb
from conftest import DEMO, tiny_data, tiny_module
from lightning.pytorch.callbacks import LearningRateMonitor
from wandb.proto import wandb_internal_pb2

from lightning_modules.cli import run
from lightning_modules.cli.training import TranslationCLI
from lightning_modules.loggers import AutoWandbLogger
from lightning_modules.module import NUM_LOGGED_SAMPLES
from lightning_modules.schedules import InverseSquareRoot, inverse_sqrt_lr_lambda

# --- the run file ------------------------------------------------------------------------------------------------

FILE_HEADER = struct.pack("<4sHB", b":W&B", 0xBEE1, 0)  # ident, magic, version
BLOCK_SIZE = 32768
CHUNK_HEADER = struct.Struct("<IHB")  # crc32 of kind + payload, payload length, kind
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_run_file(path: Path) -> Iterator[wandb_internal_pb2.Record]:
    """The records of a `.wandb` file, in the order they were written. A record longer than what is left of a block
    is split into FIRST, MIDDLE..., LAST chunks; a block tail too short for a chunk header is zero padding."""
    data = path.read_bytes()
    assert data[: len(FILE_HEADER)] == FILE_HEADER, f"{path} is not a W&B run file"
    position, parts = len(FILE_HEADER), []
    while position + CHUNK_HEADER.size <= len(data):
        left_in_block = BLOCK_SIZE - position % BLOCK_SIZE
        if left_in_block < CHUNK_HEADER.size:
            position += left_in_block
            continue
        checksum, length, kind = CHUNK_HEADER.unpack_from(data, position)
        position += CHUNK_HEADER.size
        payload = data[position : position + length]
        position += length
        assert zlib.crc32(payload, zlib.crc32(bytes([kind]))) == checksum, f"corrupt chunk at byte {position}"
        parts.append(payload)
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            parts = []
            yield record


def config_of(records: list[wandb_internal_pb2.Record]) -> dict[str, Any]:
    """The run's config: the items set at `wandb.init` and every later `config.update`, later values winning."""
    config = {}
    for record in records:
        kind = record.WhichOneof("record_type")
        updates = record.run.config.update if kind == "run" else record.config.update if kind == "config" else []
        for item in updates:
            config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return config


def history_of(records: list[wandb_internal_pb2.Record]) -> list[dict[str, Any]]:
    """One dict per `wandb.log` call. wandb stores a dict value (a table's reference) as items with nested keys:
    they are put back together here."""
    rows = []
    for record in records:
        if record.WhichOneof("record_type") != "history":
            continue
        row: dict[str, Any] = {}
        for item in record.history.item:
            *parents, leaf = [item.key] if item.key else list(item.nested_key)
            target = row
            for parent in parents:
                target = target.setdefault(parent, {})
            target[leaf] = json.loads(item.value_json)
        rows.append(row)
    return rows


def values_of(history: list[dict[str, Any]], key: str) -> list[Any]:
    return [row[key] for row in history if key in row]


# --- a tiny offline run ------------------------------------------------------------------------------------------

TRAIN_STEPS = 4
PEAK_LR, WARMUP_STEPS = 1e-3, 2
SAMPLES = NUM_LOGGED_SAMPLES


# 64 training pairs in batches of at most 128 tokens (several batches), 8 validation pairs.
RUN_DATA = dict(
    synthetic_train_size=64, synthetic_eval_size=8, max_tokens=128, max_source_positions=64, max_target_positions=64
)
RUN_MODULE = dict(
    config=dict(max_position_embeddings=128),
    schedule=InverseSquareRoot(PEAK_LR, WARMUP_STEPS),
    generation=dict(num_beams=2),
)


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory) -> tuple[list[wandb_internal_pb2.Record], Path]:
    """Fit for TRAIN_STEPS steps with one validation at the end, finish the W&B run and return its records and run
    folder. Once for the module: the autouse fixture's environment is function-scoped, so it is set here too."""
    tmp_path = tmp_path_factory.mktemp("wandb-run")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("WANDB_MODE", "offline")
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
        pl.seed_everything(0, verbose=False)
        data = tiny_data(tmp_path, **RUN_DATA)
        logger = AutoWandbLogger(save_dir=str(tmp_path), name="test-run")
        assert logger.offline
        trainer = pl.Trainer(
            accelerator="cpu",
            max_steps=TRAIN_STEPS,
            limit_train_batches=TRAIN_STEPS,  # so the epoch, and with it the validation, ends after TRAIN_STEPS
            limit_val_batches=1,
            num_sanity_val_steps=1,  # its samples must not be logged
            log_every_n_steps=1,
            logger=logger,
            callbacks=[LearningRateMonitor(logging_interval="step")],
            use_distributed_sampler=False,  # the data module's batch sampler shards
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
        )
        try:
            trainer.fit(tiny_module(data, **RUN_MODULE), datamodule=data)
        finally:
            wandb.finish()  # Lightning leaves the run open
            # finish() returns once wandb-core has handled the exit record, which may still sit in its write buffer:
            # the run file is complete only when the service has closed it.
            wandb.teardown()
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    records = list(read_run_file(run_file))
    assert records and records[-1].WhichOneof("record_type") == "exit", "the run file is incomplete"
    return records, run_file.parent


def test_offline_run_file_holds_hyperparameters_and_metrics(offline_run):
    """Config holds the module's and the data module's init arguments; the history holds the per-step training loss
    and the learning rate of the schedule at every step, then validation BLEU and loss."""
    records, _ = offline_run
    config = config_of(records)
    assert config["config"]["d_model"] == 16  # the model settings over the preset, one value
    assert config["schedule"]["init_args"] == {"peak_lr": PEAK_LR, "warmup_steps": WARMUP_STEPS}
    assert config["dataset"] == "synthetic"  # the data module's hyperparameters are merged in
    assert config["bpe_vocab_size"] == 60

    history = history_of(records)
    losses = values_of(history, "train/loss")
    assert [row["trainer/global_step"] for row in history if "train/loss" in row] == list(range(TRAIN_STEPS))
    assert all(loss > 0 for loss in losses)
    schedule = inverse_sqrt_lr_lambda(PEAK_LR, WARMUP_STEPS)
    assert values_of(history, "lr-AdamW") == pytest.approx([schedule(step) for step in range(TRAIN_STEPS)])
    (bleu,) = values_of(history, "val/bleu")
    assert 0 <= bleu <= 100
    assert len(values_of(history, "val/loss")) == 1


def test_offline_run_file_holds_the_sample_translations(offline_run):
    """`val/samples` is logged once (after validation, not during a sanity check) as a table of source, reference and
    hypothesis for `num_logged_samples` validation pairs of distinct sources; the table's rows are in the run
    folder."""
    records, run_dir = offline_run
    (table,) = values_of(history_of(records), "val/samples")
    assert table["_type"] == "table-file"
    assert table["ncols"] == 3 and table["nrows"] == SAMPLES
    content = json.loads((run_dir / "files" / table["path"]).read_text())
    assert content["columns"] == ["source", "reference", "hypothesis"]
    assert len(content["data"]) == SAMPLES
    for source, reference, _hypothesis in content["data"]:
        assert source.isdigit() and reference and not reference[0].isdigit()  # numbers -> words


# --- online or offline -------------------------------------------------------------------------------------------


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    """No API key, no ~/.netrc and no WANDB_MODE (the autouse fixture sets offline; these tests decide themselves)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("NETRC", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    return tmp_path


def test_logger_is_offline_without_credentials(no_credentials):
    """Without credentials the run goes to disk instead of failing at login; model upload is off, since W&B refuses it
    offline."""
    logger = AutoWandbLogger(save_dir=str(no_credentials), log_model=True)
    assert logger.offline is True
    assert logger.log_model is False


def test_logger_is_online_with_an_api_key(no_credentials, monkeypatch):
    """WANDB_API_KEY is enough to log online (no run is started here)."""
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    logger = AutoWandbLogger(save_dir=str(no_credentials), log_model=True)
    assert logger.offline is False
    assert logger.log_model is True


def test_logger_is_online_with_a_netrc_login(no_credentials):
    """`wandb login` writes the key to ~/.netrc: that counts as credentials too."""
    netrc = no_credentials / ".netrc"
    netrc.write_text(f"machine api.wandb.ai\n  login user\n  password {'0' * 40}\n")
    netrc.chmod(0o600)  # netrc refuses files that others can read
    assert AutoWandbLogger(save_dir=str(no_credentials)).offline is False


@pytest.mark.parametrize("mode", ["offline", "dryrun"])
def test_wandb_mode_offline_wins_over_credentials(no_credentials, monkeypatch, mode):
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    monkeypatch.setenv("WANDB_MODE", mode)
    assert AutoWandbLogger(save_dir=str(no_credentials)).offline is True


def test_a_wandb_config_without_wandb_installed_says_how_to_install_it(no_credentials, monkeypatch):
    """wandb is an extra: a config that asks for it on a lean install gets the pip line, not an ImportError."""
    import importlib.util

    from hf_transformer.errors import ConfigError

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a))
    with pytest.raises(ConfigError, match=r"wandb is not installed: pip install \"hf-transformer\[wandb\]\""):
        AutoWandbLogger(save_dir=str(no_credentials))


def test_a_command_ends_the_wandb_run_it_started(run_dir, monkeypatch):
    """Two `fit` commands in one Python process (a notebook, a sweep script) write two W&B runs: Lightning leaves a run
    open and logs the next command into it, so the command ends the run it started."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    wandb_config = str(DEMO.parent / "trainer/wandb.yaml")
    for name in ("first", "second"):
        run(
            ["fit", "--config", str(DEMO), "--config", "tiny.yaml", "--config", wandb_config]
            + [f"--trainer.logger.init_args.name={name}", f"--trainer.default_root_dir=runs/{name}"]
            + ["--trainer.max_steps=1", "--trainer.limit_val_batches=0"]
        )
        assert wandb.run is None
    wandb.teardown()
    runs = [list(read_run_file(path)) for path in run_dir.glob("runs/*/wandb/offline-run-*/*.wandb")]
    names = [
        record.run.display_name for records in runs for record in records if record.WhichOneof("record_type") == "run"
    ]
    assert sorted(names) == ["first", "second"]


def test_the_wandb_config_leaves_the_run_name_to_wandb_and_the_folder_to_the_run(run_dir):
    """configs/trainer/wandb.yaml over the defaults: the CSV logger's `name: logs` (cli/defaults.yaml) does not carry
    over, or every W&B run would be named `logs`, and the files go to trainer.default_root_dir, linked to save_dir."""
    wandb_config = str(DEMO.parent / "trainer/wandb.yaml")
    args = ["--config", str(DEMO), "--config", "tiny.yaml", "--config", wandb_config]
    cli = TranslationCLI(args=[*args, "--trainer.default_root_dir=runs/composed"], run=False)
    assert isinstance(cli.trainer.logger, AutoWandbLogger)
    assert cli.config.trainer.logger.init_args.name is None
    assert Path(cli.trainer.logger.save_dir) == Path("runs/composed")

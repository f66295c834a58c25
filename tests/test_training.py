"""Training through the `hf-transformer` command: it learns, resumes exactly, fails clearly, and exports."""

import contextlib
import csv
import importlib.metadata
import io
import itertools
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest
import sacrebleu
import torch
import yaml
from conftest import DEMO
from filelock import FileLock
from lightning.pytorch.callbacks import ProgressBar, Timer, TQDMProgressBar
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from hf_transformer import TransformerForConditionalGeneration
from lightning_modules.callbacks import LineProgress
from lightning_modules.checkpoint import (
    AtomicCheckpointIO,
    average_checkpoints,
    averaging_span_warning,
    last_checkpoints,
    load_checkpoint,
    model_from_checkpoint,
    save_atomically,
)
from lightning_modules.checkpoint_export import export_checkpoint
from lightning_modules.cli import main, run
from lightning_modules.cli.training import TranslationCLI
from lightning_modules.experimental import RDropTranslationModule
from lightning_modules.module import model_config
from lightning_modules.schedules import noam_lr_lambda
from lightning_modules.upgrade import describe_training

CONFIGS = sorted(DEMO.parent.glob("*.yaml"))  # the experiments; configs/trainer/ holds trainer settings to compose


def fit(*overrides: str) -> None:
    run(["fit", "--config", str(DEMO), "--config", "tiny.yaml", *overrides])


def val_bleu(log_dir: Path) -> list[float]:
    newest = max(log_dir.glob("runs/demo/logs/version_*/metrics.csv"), key=lambda path: int(path.parent.name[8:]))
    with open(newest) as metrics:
        return [float(row["val/bleu"]) for row in csv.DictReader(metrics) if row.get("val/bleu")]


RDROP = "--model.class_path=lightning_modules.experimental.RDropTranslationModule"
COOLDOWN = "--model.schedule=lightning_modules.experimental.InverseSquareRootWithCooldown"


def test_rdrop_logs_its_divergence_beside_the_loss(run_dir):
    """With R-Drop, train/loss is the loss minimized (the cross-entropy plus alpha / 4 times the divergence per
    target token), and train/rdrop_divergence the divergence of the two dropout masks' distributions, at every step
    that logs; a run without R-Drop logs none."""
    fit(RDROP, "--model.alpha=5", "--trainer.max_steps=4", "--trainer.log_every_n_steps=1")
    newest = max(run_dir.glob("runs/demo/logs/version_*/metrics.csv"), key=lambda path: int(path.parent.name[8:]))
    with open(newest) as metrics:
        rows = [row for row in csv.DictReader(metrics) if row.get("train/loss")]
    assert [int(row["step"]) for row in rows] == [0, 1, 2, 3]
    divergences = [float(row["train/rdrop_divergence"]) for row in rows]
    assert all(0 < divergence < float(row["train/loss"]) for divergence, row in zip(divergences, rows, strict=True))
    fit("--trainer.max_steps=1", "--trainer.log_every_n_steps=1", "--trainer.default_root_dir=plain")
    (plain,) = run_dir.glob("plain/logs/version_*/metrics.csv")
    assert "train/rdrop_divergence" not in plain.read_text()


def test_rdrop_without_dropout_is_named_in_a_warning():
    """Every dropout at 0: R-Drop runs each pair twice per step for a divergence that is always 0."""
    from conftest import tiny_module

    with pytest.warns(UserWarning, match=r"R-Drop \(model.class_path lightning_modules.experimental.RDrop.* every "):
        tiny_module(config={"dropout": 0.0}, module=RDropTranslationModule, alpha=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tiny_module(config={"dropout": 0.0, "attention_dropout": 0.1}, module=RDropTranslationModule, alpha=1)


def test_noam_schedule_is_the_papers_formula():
    lr = noam_lr_lambda(d_model=512, warmup_steps=4000)
    for step in (1, 100, 3999, 4000, 4001, 100_000):
        expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        assert math.isclose(lr(step - 1), expected)
    assert max(range(8000), key=lr) == 3999  # the peak is at step 4000


def test_mfu_is_the_model_flops_per_second_over_the_device_peak(tiny_config, monkeypatch):
    from lightning_modules.callbacks import throughput as callbacks
    from lightning_modules.callbacks.throughput import training_flops

    peak = 1e12  # what lightning reports for a GPU it knows; on a CPU it knows none, and MFU is not logged
    monkeypatch.setattr(callbacks, "get_available_flops", lambda device, dtype: peak)
    logged = {}
    module = SimpleNamespace(
        model=TransformerForConditionalGeneration(tiny_config), device=torch.device("cpu"), log_dict=logged.update
    )
    trainer = SimpleNamespace(precision="bf16-mixed")
    throughput = callbacks.TranslationThroughput(log_every_n_steps=2)
    batch = {
        "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]),  # source lengths 3 and 4
        "labels": torch.tensor([[5, 6, -100], [7, 8, 9]]),  # target lengths 2 and 3
    }
    throughput.on_train_start(trainer, module)
    for batch_idx in range(2):
        throughput.on_train_batch_end(trainer, module, None, batch, batch_idx)
    # Both rates share the elapsed time, so their ratio is the model FLOPs per target token.
    flops_per_target_token = int(training_flops(module.model.config, torch.tensor([3, 4]), torch.tensor([2, 3]))) / 5
    assert logged["throughput/mfu"] * peak / logged["throughput/target_tokens_per_sec"] == pytest.approx(
        flops_per_target_token
    )


@pytest.mark.slow
def test_demo_config_learns_the_synthetic_task(tmp_path, monkeypatch, capsys):
    """The demo as shipped (model size, data, schedule), cut to 400 steps: BLEU goes from ~0 to well above, and the
    run ends on a summary that shows what it learned and what to do next."""
    from lightning_modules.cli.training import TranslationCLI

    monkeypatch.chdir(tmp_path)
    quick = ["--data.synthetic_eval_size=64"]
    cli = TranslationCLI(args=["--config", str(DEMO), *quick], run=False)
    cli.trainer.validate(cli.model, datamodule=cli.datamodule)  # the untrained model, which `validate` refuses
    untrained = val_bleu(tmp_path)[-1]
    capsys.readouterr()
    main(["fit", "--config", str(DEMO), *quick, "--trainer.max_steps=400", "--trainer.val_check_interval=400"])
    trained = val_bleu(tmp_path)[-1]
    assert untrained < 5 and trained > 25, (untrained, trained)
    printed = capsys.readouterr().out
    assert "Total FLOPs" not in printed
    assert "step 1/400 | " in printed and "step 100/400 | " in printed and "validation at step 400: loss " in printed
    summary = printed.split("Trained 400 steps in ", 1)[1]
    assert f"BLEU {trained:.1f}" in summary and summary.count("hypothesis: ") == 3
    sources = [line.split("source: ", 1)[1].strip() for line in summary.splitlines() if "source: " in line]
    assert len(set(sources)) == 3 and max(map(len, sources)) >= 4, sources  # distinct, not only one-digit numbers
    assert "Tokenizer:   runs/demo/tokenizer" in summary
    assert "Export it:   hf-transformer export runs/demo/checkpoints/last.ckpt exports/<name>" in summary


def test_resume_mid_epoch_ends_with_the_same_weights(run_dir):
    """Stopped at step 6 and resumed with --ckpt_path last == 12 uninterrupted steps (dropout on, mid-epoch)."""
    fit("--trainer.max_steps=12")
    uninterrupted = load_checkpoint(run_dir / "runs/demo/checkpoints/last.ckpt")
    (run_dir / "runs/demo/checkpoints").rename(run_dir / "uninterrupted")

    fit("--trainer.max_steps=6")
    fit("--trainer.max_steps=12", "--ckpt_path=last")
    resumed = load_checkpoint(run_dir / "runs/demo/checkpoints/last.ckpt")
    assert resumed["global_step"] == uninterrupted["global_step"] == 12
    for name, tensor in uninterrupted["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][name], tensor, atol=1e-6, rtol=0, msg=name)


def test_training_that_ends_between_step_checkpoints_saves_its_last_steps(run_dir):
    """max_steps 4 with a checkpoint every 3 steps: last.ckpt holds step 4 (not 3), and resumes from it."""
    fit("--trainer.max_steps=4")
    assert checkpoint_steps(run_dir) == {"step000003.ckpt": 3, "last.ckpt": 4}
    fit("--trainer.max_steps=7", "--ckpt_path=last")
    assert checkpoint_steps(run_dir) == {"step000003.ckpt": 3, "step000006.ckpt": 6, "last.ckpt": 7}


def test_bf16_mixed_trains_on_cpu_multiplying_in_bf16_and_keeping_float32_weights(run_dir):
    """Every linear layer of the training steps computes in bfloat16 (autocast), while the weights the optimizer
    updates, and the checkpoint keeps, stay float32: the precision is that of bf16-mixed, not ignored nor bf16-true."""
    training_dtypes = set()

    def record(module: torch.nn.Module, inputs, output) -> None:
        if isinstance(module, torch.nn.Linear) and module.training:
            training_dtypes.add(output.dtype)

    hook = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        fit("--trainer.max_steps=3", "--trainer.precision=bf16-mixed")
    finally:
        hook.remove()
    assert training_dtypes == {torch.bfloat16}
    checkpoint = load_checkpoint(run_dir / "runs/demo/checkpoints/last.ckpt")
    assert checkpoint["global_step"] == 3
    weights = [t for t in checkpoint["state_dict"].values() if t.is_floating_point()]
    assert all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in weights)


def checkpoint_steps(run_dir: Path) -> dict[str, int]:
    return {
        path.name: load_checkpoint(path)["global_step"] for path in (run_dir / "runs/demo/checkpoints").glob("*.ckpt")
    }


def test_non_finite_loss_stops_with_a_message_naming_the_checkpoint_that_resumes(run_dir, monkeypatch):
    from lightning_modules.module import TranslationModule

    original = TranslationModule.training_loss

    def poisoned(self, batch, num_items_in_batch=None):
        loss = original(self, batch, num_items_in_batch)
        return loss * float("nan") if self.global_step == 4 else loss

    monkeypatch.setattr(TranslationModule, "training_loss", poisoned)
    # The loss is read from the device every NON_FINITE_CHECK_INTERVAL steps and before every checkpoint: the one of
    # step 6 is not written.
    with pytest.raises(FloatingPointError, match=r"NaN or infinite before step 6.*runs/demo/checkpoints/last\.ckpt"):
        fit("--trainer.max_steps=10")
    # The state of a diverging run is not saved: last.ckpt is the checkpoint written at step 3.
    assert checkpoint_steps(run_dir) == {"step000003.ckpt": 3, "last.ckpt": 3}


def test_non_finite_weights_are_never_saved_and_the_run_resumes_from_the_last_good_checkpoint(run_dir, monkeypatch):
    """An update that makes the weights NaN: the checkpoint due right after it (step 6) is refused, nothing else is
    written, and --ckpt_path last resumes from step 3 (with the same learning rate here: the NaN was injected)."""
    from lightning_modules.module import TranslationModule

    original = TranslationModule.optimizer_step

    def diverging(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.global_step == 5:  # the 6th update, which the checkpoint of step 6 would save
            next(self.parameters()).data.fill_(float("nan"))

    monkeypatch.setattr(TranslationModule, "optimizer_step", diverging)
    with pytest.raises(FloatingPointError, match=r"(?s)not finite after step 6.*runs/demo/checkpoints/last\.ckpt"):
        fit("--trainer.max_steps=10")
    assert checkpoint_steps(run_dir) == {"step000003.ckpt": 3, "last.ckpt": 3}

    monkeypatch.setattr(TranslationModule, "optimizer_step", original)
    fit("--trainer.max_steps=6", "--ckpt_path=last")
    resumed = load_checkpoint(run_dir / "runs/demo/checkpoints/last.ckpt")
    assert resumed["global_step"] == 6
    assert all(torch.isfinite(t).all() for t in resumed["state_dict"].values() if t.is_floating_point())


def test_fit_resumes_only_when_asked(run_dir, monkeypatch):
    """A second fit into the same folder stops with a message instead of resuming (or overwriting) by itself; a run
    that fails before training writes no checkpoint; --ckpt_path last resumes from last.ckpt."""
    from lightning_modules.module import TranslationModule

    fit("--trainer.max_steps=3")
    with pytest.raises(FileExistsError, match=r"runs/demo/checkpoints holds the checkpoints .*--ckpt_path last"):
        fit("--trainer.max_steps=6")
    assert checkpoint_steps(run_dir) == {"step000003.ckpt": 3, "last.ckpt": 3}

    def broken_setup(self):
        raise RuntimeError("setup failed")

    with monkeypatch.context() as patch:
        patch.setattr(TranslationModule, "configure_model", broken_setup)
        with pytest.raises(RuntimeError, match="setup failed"):
            fit("--trainer.max_steps=6", "--ckpt_path=last")
    assert checkpoint_steps(run_dir) == {"step000003.ckpt": 3, "last.ckpt": 3}

    fit("--trainer.max_steps=6", "--ckpt_path=last")
    assert checkpoint_steps(run_dir)["last.ckpt"] == 6


def test_saved_steps_are_regular_across_epoch_ends(run_dir):
    """Epochs of 6 batches, a checkpoint every 3 steps: steps 6 and 12 end an epoch and are saved like the others."""
    fit("--trainer.max_steps=12", "--trainer.limit_train_batches=6")
    steps = checkpoint_steps(run_dir)
    assert steps.pop("last.ckpt") == 12
    assert sorted(steps.values()) == [3, 6, 9, 12]


def test_config_errors_are_reported_before_any_work(run_dir, capsys, monkeypatch):
    """A mistyped or ill-typed setting stops the command with its name and no traceback, before the data are made or
    the tokenizer is trained (either would fail this test), and the command's process exits with a failure status."""

    def work(*args, **kwargs):
        raise AssertionError("the data or the tokenizer were made before the mistake was reported")

    for name in ("synthetic_splits", "train_bpe_tokenizer"):
        monkeypatch.setattr(f"lightning_modules.data.datamodule.{name}", work)
    for bad in ("--model.d_modle=64", "--model.schedule.warmup_steps=high", "--trainer.max_stepz=3"):
        with pytest.raises(SystemExit) as stopped:
            main(["fit", "--config", str(DEMO), bad])
        assert stopped.value.code
        err = capsys.readouterr().err
        key = bad.split("=")[0].lstrip("-").split(".")[-1]
        assert key in err or "high" in err, err[-2000:]
        assert "Traceback" not in err
        assert not (run_dir / "runs").exists()
    result = subprocess.run(
        [sys.executable, "-m", "lightning_modules.cli", "fit", "--config", str(DEMO), "--model.d_modle=64"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0 and "d_modle" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        (
            "--model.config.d_modle=64",
            "model.config: 'd_modle' is not a TransformerConfig field (did you mean 'd_model'?)",
        ),
        ("--model.d_model=64", "did you mean --model.config.d_model?"),
        ("--model.config.encoder_attention_heads=3", "model.config: TransformerConfig"),
        ("--trainer.max_step=3", "did you mean --trainer.max_steps?"),  # an abbreviation is refused, not expanded
        ("--model.schedule.warmup_steps=0", "model.schedule.warmup_steps=0 must be at least 1"),
        ("--model.schedule.peak_lr=-1", "model.schedule.peak_lr=-1.0 must be positive"),
        (
            '--model.schedule={"class_path": "lightning_modules.experimental.InverseSquareRootWithCooldown", '
            '"init_args": {"cooldown_steps": 1150}}',
            "model.schedule.cooldown_steps=1150 needs trainer.max_steps (1200) of at least",
        ),
        # Options of 0.4 that are classes now: each names the class path that replaces it.
        ("--model.warmup_steps=100", "--model.warmup_steps is gone: the schedule is an object: set "),
        ("--model.cooldown_steps=3", "schedule lightning_modules.experimental.InverseSquareRootWithCooldown"),
        ("--model.rdrop_alpha=5", "R-Drop is the module lightning_modules.experimental.RDropTranslationModule"),
        ("--model.config.label_smoothing=1.5", "TransformerConfig.label_smoothing must be in [0, 1), got 1.5"),
        ("--data.dataset=./no/such/folder", "no/such/folder does not exist"),
        ("--trainer.enable_checkpointing=false", "every run checkpoints (to resume, to average, to export)"),
    ],
)
def test_mistakes_are_one_message_before_any_work(run_dir, capsys, bad, expected):
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--config", str(DEMO), "--config", "tiny.yaml", bad])
    assert stopped.value.code == 1
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.startswith("hf-transformer fit: error: ") and expected in message
    assert not (run_dir / "runs").exists()


def test_the_data_keeps_and_cuts_pairs_to_the_model_positions(run_dir, monkeypatch):
    """One value: a model with fewer positions makes the data drop longer training pairs and cut evaluation pairs.
    The command builds the model config of its settings once, for both links to the data and for its checks (it built
    it six times)."""
    from lightning_modules.cli import training

    built = []
    monkeypatch.setattr(training, "model_config", lambda *args: built.append(args) or model_config(*args))
    cli = training.TranslationCLI(
        args=["--config", str(DEMO), "--config", "tiny.yaml", "--model.config.max_position_embeddings=9"], run=False
    )
    assert len(built) == 1
    assert cli.model.model.config.max_position_embeddings == 9
    assert cli.datamodule.hparams.max_source_positions == cli.datamodule.hparams.max_target_positions == 9
    cli.datamodule.setup("fit")
    assert cli.datamodule.filter_stats["train"]["dropped_too_long"] > 0
    assert max(batch["labels"].shape[1] for batch in cli.datamodule.val_dataloader()) <= 9


def interrupted_run(run_dir: Path, stop: signal.Signals, *overrides: str) -> subprocess.CompletedProcess:
    """`fit` of tiny.yaml in a subprocess whose process group is sent `stop` (as a terminal sends Ctrl-C to the
    program in the foreground, its data loader workers included) as soon as its first last.ckpt appears (step 3); its
    exit status and output."""
    with open(run_dir / "output.txt", "w") as output:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lightning_modules.cli",
                "fit",
                "--config",
                str(DEMO),
                "--config",
                "tiny.yaml",
                "--trainer.max_steps=100000",
                *overrides,
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            # As in a terminal, where Ctrl-C reaches a program in the foreground. A shell that starts a job in the
            # background (`.ci/run &`) makes it ignore SIGINT, its children inherit that and Python keeps it: the run
            # then trained on past the signal (two CI runs started that way failed here).
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 120
            while not (run_dir / "runs/demo/checkpoints/last.ckpt").exists():
                assert time.monotonic() < deadline and process.poll() is None, "training did not start"
                time.sleep(0.5)
            os.killpg(process.pid, stop)  # the next checkpoint may be being written
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                output.flush()
                tail = (run_dir / "output.txt").read_text()[-3000:]
                pytest.fail(f"the run did not stop within 120 s of the signal; its output ends:\n{tail}")
        finally:
            with contextlib.suppress(ProcessLookupError):  # the run's data loader workers, if any outlived it
                os.killpg(process.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(process.args, process.returncode, (run_dir / "output.txt").read_text())


@pytest.mark.parametrize(
    ("stop", "name"), [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C"), (signal.SIGKILL, "kill -9")]
)
def test_an_interrupted_run_resumes_exactly(run_dir, stop, name):
    """Pre-emption (SIGTERM), Ctrl-C or kill -9 mid-training leaves a checkpoint that `--ckpt_path last` resumes, and
    the resumed run ends bit for bit as one that never stopped: weights and Adam's moments (the same computation on
    the same machine, so equality is the test). A Ctrl-C landed mid-step, and its state held that step's dropout draws
    and a data position one batch ahead: the resumed run differed by up to 4.5e-3. SIGTERM and Ctrl-C end saying
    where the state is (the run ended on Lightning's stray "`weights_only` was not set" line) and exit 128 + the
    signal's number, as a process ended by it (a SIGTERM exited 0, as if the run had finished). The Ctrl-C reaches a
    data loader worker too, which leaves it to the main process."""
    # Epochs of ~120 batches, so that the stop falls mid-epoch (an epoch's end: the test below).
    settings = ["--data.synthetic_train_size=4000"] + (["--data.num_workers=1"] if stop == signal.SIGINT else [])
    stopped = interrupted_run(run_dir, stop, *settings)
    assert stopped.returncode == (-stop if stop == signal.SIGKILL else 128 + stop)
    saved = load_checkpoint(run_dir / "runs/demo/checkpoints/last.ckpt")["global_step"]
    assert saved >= 3
    if stop != signal.SIGKILL:
        last_lines = stopped.stdout.strip().splitlines()[-2:]
        assert "weights_only" not in "\n".join(last_lines)
        assert last_lines[-1] == (
            f"Stopped at step {saved} ({name}); its state is saved in runs/demo/checkpoints/last.ckpt. Resume: "
            "the same command with --ckpt_path last"
        )
    if stop == signal.SIGINT:
        assert stopped.stdout.count("Ctrl-C: stopping once this step is done and its state saved") == 1
    target = (saved // 3 + 1) * 3  # the next step at which tiny.yaml writes a checkpoint
    fit(f"--trainer.max_steps={target}", "--ckpt_path=last", *settings)
    resumed = load_checkpoint(run_dir / "runs/demo/checkpoints/last.ckpt")
    (run_dir / "runs").rename(run_dir / "interrupted")
    fit(f"--trainer.max_steps={target}", *settings)
    uninterrupted = load_checkpoint(run_dir / "runs/demo/checkpoints/last.ckpt")
    assert resumed["global_step"] == uninterrupted["global_step"] == target
    assert_same_training_state(resumed, uninterrupted)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_run_resumed_from_an_epochs_last_step_trains_exactly_as_one_that_never_stopped(run_dir, workers):
    """A checkpoint at an epoch's last step resumes into the next epoch exactly. Its data iterator used to draw the
    workers' base seed from the global RNG after that checkpoint in the run that never stopped, and before the RNG's
    restore in the resumed one: the dropout masks shifted by one draw, the weights differed by up to 4e-4."""
    loader = f"--data.num_workers={workers}"
    fit("--trainer.max_epochs=1", "--trainer.max_steps=-1", loader)
    epoch_steps = load_checkpoint(run_dir / "runs/demo/checkpoints/last.ckpt")["global_step"]
    shutil.rmtree(run_dir / "runs")
    fit(f"--trainer.max_steps={epoch_steps}", loader)
    fit(f"--trainer.max_steps={epoch_steps + 3}", "--ckpt_path=last", loader)
    resumed = load_checkpoint(run_dir / "runs/demo/checkpoints/last.ckpt")
    (run_dir / "runs").rename(run_dir / "interrupted")
    fit(f"--trainer.max_steps={epoch_steps + 3}", loader)
    uninterrupted = load_checkpoint(run_dir / "runs/demo/checkpoints/last.ckpt")
    assert resumed["global_step"] == uninterrupted["global_step"] == epoch_steps + 3
    assert resumed["epoch"] == uninterrupted["epoch"] == 1
    assert_same_training_state(resumed, uninterrupted)


def assert_same_training_state(resumed: dict, uninterrupted: dict) -> None:
    """The weights and Adam's moments of two checkpoints are equal, bit for bit."""
    for name, tensor in uninterrupted["state_dict"].items():
        difference = (resumed["state_dict"][name] - tensor).abs().max()
        assert torch.equal(resumed["state_dict"][name], tensor), f"{name} differs by up to {difference}"
    for index, state in uninterrupted["optimizer_states"][0]["state"].items():
        for key, tensor in state.items():
            assert torch.equal(resumed["optimizer_states"][0]["state"][index][key], tensor), f"parameter {index} {key}"


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_stops_at_the_end_of_its_step_and_twice_stops_at_once(run_dir, capfd, monkeypatch, presses):
    """Ctrl-C in the middle of step 5 (its dropout masks drawn): the run stops once that step is done and saves it.
    Pressed again during the step, it stops at once, and the state then, half a step, is not saved."""
    from lightning_modules.module import TranslationModule

    original = TranslationModule.training_loss

    def pressed(self, batch, num_items_in_batch=None):
        loss = original(self, batch, num_items_in_batch)
        for _ in range(presses if self.global_step == 4 else 0):
            signal.raise_signal(signal.SIGINT)
        return loss

    monkeypatch.setattr(TranslationModule, "training_loss", pressed)
    # Python's own Ctrl-C handler, as in a terminal: a run started as a background job inherits an ignored SIGINT.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SystemExit) as stopped:
            fit("--trainer.max_steps=100")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, inherited)
    printed = capfd.readouterr().err
    assert "Ctrl-C: stopping once this step is done and its state saved (Ctrl-C again stops at once" in printed
    if presses == 1:
        assert stopped.value.code == 130
        assert checkpoint_steps(run_dir) == {"step000003.ckpt": 3, "last.ckpt": 5}
    else:
        assert stopped.value.code == 1
        assert printed.strip().splitlines()[-1] == (
            "Stopped during step 5 (Ctrl-C twice), whose state is not saved; runs/demo/checkpoints/last.ckpt holds "
            "step 3. Resume: the same command with --ckpt_path last"
        )
        assert checkpoint_steps(run_dir) == {"step000003.ckpt": 3, "last.ckpt": 3}


@pytest.mark.parametrize("validate_every", [3, 4], ids=["at a step checkpoint", "between step checkpoints"])
def test_ctrl_c_during_validation_stops_at_once_and_resumes_exactly(run_dir, capfd, monkeypatch, validate_every):
    """Ctrl-C in the middle of the validation after step 3 or 4, at or between the step checkpoints (every 3): the run
    stops before that validation's beam search goes on, with the step's state saved, and resumes, without validating
    that step again, to the weights and Adam's moments of a run that never stopped. It stopped only after the whole
    validation (103 s on a loaded 2-core machine for Multi30k's); and each validation drew the workers' seed of its
    loader from the model's random generator, so that a run resumed from the step before it drew other dropout masks."""
    from lightning_modules.module import TranslationModule

    original, decoded = TranslationModule.translate, []

    def pressed(self, input_ids, attention_mask):
        if not decoded:
            signal.raise_signal(signal.SIGINT)
        decoded.append(self.global_step)  # not reached when the Ctrl-C stops the validation at once
        return original(self, input_ids, attention_mask)

    every = [f"--trainer.val_check_interval={validate_every}", "--trainer.check_val_every_n_epoch=null"]
    with monkeypatch.context() as patch:
        patch.setattr(TranslationModule, "translate", pressed)
        inherited = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
        try:
            with pytest.raises(SystemExit) as stopped:
                fit("--trainer.max_steps=100", *every)
        finally:
            signal.signal(signal.SIGINT, inherited)
    assert stopped.value.code == 130 and decoded == []
    assert capfd.readouterr().err.strip().splitlines()[-1] == (
        f"Stopped at step {validate_every} (Ctrl-C); its state is saved in runs/demo/checkpoints/last.ckpt. Resume: "
        "the same command with --ckpt_path last"
    )
    assert checkpoint_steps(run_dir)["last.ckpt"] == validate_every
    fit("--trainer.max_steps=9", "--ckpt_path=last", *every)
    resumed = load_checkpoint(run_dir / "runs/demo/checkpoints/last.ckpt")
    (run_dir / "runs").rename(run_dir / "interrupted")
    fit("--trainer.max_steps=9", *every)
    uninterrupted = load_checkpoint(run_dir / "runs/demo/checkpoints/last.ckpt")
    assert resumed["global_step"] == uninterrupted["global_step"] == 9
    assert_same_training_state(resumed, uninterrupted)


class SendsCtrlC:
    """Pickled by torch.save, it presses Ctrl-C in the middle of the checkpoint's write."""

    def __reduce__(self) -> tuple:
        signal.raise_signal(signal.SIGINT)
        return (int, (7,))


def test_a_ctrl_c_during_a_checkpoint_write_stops_the_run_after_the_write(tmp_path):
    """Python raises KeyboardInterrupt wherever it is: inside torch.save's writer it broke the write ("unexpected
    pos") and the run ended without its state. The write finishes first, then the Ctrl-C acts as it would have."""
    path = tmp_path / "step=3.ckpt"
    # Python's own Ctrl-C handler, as in a terminal: a run started as a background job inherits an ignored SIGINT.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            save_atomically({"weights": torch.arange(10_000.0), "interrupt": SendsCtrlC(), "global_step": 3}, path)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, inherited)
    saved = torch.load(path, weights_only=False)
    assert saved["global_step"] == 3 and saved["interrupt"] == 7 and torch.equal(saved["weights"], torch.arange(1e4))
    assert [p.name for p in tmp_path.iterdir()] == ["step=3.ckpt"]  # no temporary file left


def test_test_command_writes_hypotheses_in_test_set_order_and_labelled_scores(run_dir, capsys):
    fit("--trainer.max_steps=3")
    main(["test", "--config", str(DEMO), "--config", "tiny.yaml", "--ckpt_path=runs/demo/checkpoints/last.ckpt"])
    hypotheses = next(run_dir.glob("runs/demo/logs/version_*/test_hypotheses.txt")).read_text().splitlines()
    assert len(hypotheses) == 16
    scores = json.loads(next(run_dir.glob("runs/demo/logs/version_*/test_scores.json")).read_text())
    labelled = {"sacreBLEU", "sacreBLEU, lowercased", "chrF", "tokenized BLEU, lowercased"}
    assert {"test/bleu", "test/chrf"} | labelled <= set(scores)
    # One BLEU of the test split: the logged test/bleu is the labelled sacreBLEU of the written hypotheses, in
    # test-set order, and test/chrf its chrF.
    from lightning_modules.cli.training import TranslationCLI

    data = TranslationCLI(args=["--config", str(DEMO), "--config", "tiny.yaml"], run=False).datamodule
    references = list(data.raw_pairs(data.hparams.test_split)["target_text"])
    assert scores["sacreBLEU"] == sacrebleu.corpus_bleu(hypotheses, [references]).score
    # Logged as float32 tensors.
    assert scores["test/bleu"] == pytest.approx(scores["sacreBLEU"], rel=1e-6)
    assert scores["test/chrf"] == pytest.approx(scores["chrF"], rel=1e-6)
    printed = capsys.readouterr().out
    assert "nrefs:1|case:mixed|eff:no|tok:13a" in printed and "multi-bleu.perl -lc" in printed


def test_fit_resume_and_test_warn_of_nothing_and_test_prints_its_scores_once(run_dir, capsys):
    """A resume printed Lightning's "Checkpoint directory ... exists and is not empty" (the normal state of a resume),
    fit and test a FutureWarning from inside Lightning, and test printed its scores three times: Lightning's table,
    a progress line and the labelled scores. Only the labelled scores remain."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit("--trainer.max_steps=3")
        fit("--trainer.max_steps=6", "--ckpt_path=last")
        assert "Resuming from step 3/6" in capsys.readouterr().out
        main(["test", "--config", str(DEMO), "--config", "tiny.yaml", "--ckpt_path=runs/demo/checkpoints/last.ckpt"])
    messages = [str(warning.message) for warning in caught]
    assert not [message for message in messages if "is not empty" in message or "LeafSpec" in message], messages
    printed = capsys.readouterr().out
    bleu_lines = [line.split()[0] for line in printed.splitlines() if "BLEU" in line]
    assert bleu_lines == ["sacreBLEU", "sacreBLEU,", "tokenized"] and "Test metric" not in printed, printed


def test_export_and_push_of_a_tested_checkpoint_put_its_test_scores_on_the_card(run_dir, capsys):
    """The tour tests last.ckpt and exports it: the card said "No evaluation results were recorded". `test` keeps its
    scores beside the checkpoint, and `export` (and `push`, by the same function) of those weights puts them on the
    card; an average, which no test scored, and the same file trained further get none."""
    from huggingface_hub import ModelCard

    def card_scores(folder: str) -> dict[tuple[str, str], float]:
        card = ModelCard.load(run_dir / folder / "README.md")
        return {
            (result.dataset_split, result.metric_type): result.metric_value for result in card.data.eval_results or []
        }

    fit("--trainer.max_steps=3")
    main(["test", "--config", str(DEMO), "--config", "tiny.yaml", "--ckpt_path=runs/demo/checkpoints/last.ckpt"])
    scores = json.loads(next(run_dir.glob("runs/demo/logs/version_*/test_scores.json")).read_text())
    capsys.readouterr()
    main(["export", "runs/demo/checkpoints/last.ckpt", "exports/demo"])
    assert "Test scores on the model card: runs/demo/checkpoints/test_scores-step000003.json" in capsys.readouterr().out
    expected = {("test", name): round(scores[f"test/{name}"], 2) for name in ("bleu", "chrf")}  # the card's rounding
    assert card_scores("exports/demo") == expected

    main(["export", "runs/demo/checkpoints", "exports/averaged", "--average", "1"])
    fit("--trainer.max_steps=6", "--ckpt_path=last")
    main(["export", "runs/demo/checkpoints/last.ckpt", "exports/later"])
    assert "Test scores" not in capsys.readouterr().out
    assert card_scores("exports/averaged") == card_scores("exports/later") == {}


def test_export_then_from_pretrained_translates_like_the_checkpoint(run_dir):
    fit("--trainer.max_steps=6")
    checkpoint = load_checkpoint(run_dir / "runs/demo/checkpoints/last.ckpt")
    export_checkpoint(checkpoint, run_dir / "exported")
    for name in (
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "modeling_transformer.py",
        "pipeline_translation.py",
    ):
        assert (run_dir / "exported" / name).exists(), name
    umask = os.umask(0)
    os.umask(umask)
    assert (run_dir / "exported" / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask  # not -rw-------
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "exported")
    exported = AutoModelForSeq2SeqLM.from_pretrained(run_dir / "exported").eval()
    original = model_from_checkpoint(checkpoint)
    inputs = tokenizer(["4821", "17", "300000"], return_tensors="pt", padding=True)
    assert exported.generation_config.num_beams == 2  # what the run used
    assert torch.equal(exported.generate(**inputs, max_new_tokens=12), original.generate(**inputs, max_new_tokens=12))


@pytest.mark.parametrize(("page", "section"), [("README.md", "## A five-minute tour"), ("docs/using.md", "## From")])
def test_the_python_snippets_for_a_trained_model_run_as_written(run_dir, page, section):
    """The first Python block of README's tour and of the guide's "From Python", verbatim, on an exported demo run: no
    prompt for remote code (a prompt would wait on the closed stdin), no warning about model types."""
    fit("--trainer.max_steps=6")
    main(["export", "runs/demo/checkpoints/last.ckpt", "exports/demo"])
    text = (DEMO.parents[1] / page).read_text()
    snippet = text.split(section, 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    result = subprocess.run(
        [sys.executable, "-c", snippet], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "custom code" not in result.stdout + result.stderr and "model of type" not in result.stderr
    assert result.stdout.startswith("[")  # the printed translations


def test_export_as_marian_from_a_checkpoint_or_a_folder_loads_without_remote_code(run_dir):
    """`export --format marian`: stock MarianMTModel and AutoTokenizer load the folder (no trust_remote_code) and
    decode as the checkpoint does, whether exported from the checkpoint or from an exported folder."""
    from transformers import MarianMTModel

    fit("--trainer.max_steps=6")
    checkpoint_path = run_dir / "runs/demo/checkpoints/last.ckpt"
    main(["export", str(checkpoint_path), "marian-from-checkpoint", "--format", "marian"])
    main(["export", str(checkpoint_path), "exported"])
    main(["export", "exported", "marian-from-folder", "--format", "marian"])
    # float64: Marian sums in another order than ours, and in float32 a near tie could go either way.
    original = model_from_checkpoint(load_checkpoint(checkpoint_path)).double()
    for folder in ("marian-from-checkpoint", "marian-from-folder"):
        assert not (run_dir / folder / "modeling_transformer.py").exists()
        tokenizer = AutoTokenizer.from_pretrained(run_dir / folder)
        marian = MarianMTModel.from_pretrained(run_dir / folder).double()
        inputs = tokenizer(["4821", "17", "300000"], return_tensors="pt", padding=True)
        expected = original.generate(**inputs, max_new_tokens=12)
        assert torch.equal(marian.generate(**inputs, max_new_tokens=12), expected), folder


def test_checkpoint_averaging_is_the_mean_of_the_weights(run_dir, capsys):
    """`average_checkpoints` and `export --average 2` give the mean of the last two step checkpoints' weights: the
    exported ones, summed in float64 and rounded once to float32, exactly."""
    fit("--trainer.max_steps=9")
    folder = run_dir / "runs/demo/checkpoints"
    by_step = {load_checkpoint(path)["global_step"]: path for path in folder.glob("step*.ckpt")}
    assert sorted(by_step) == [3, 6, 9]
    averaged = average_checkpoints([by_step[6], by_step[9]])
    first, second = (load_checkpoint(by_step[step])["state_dict"] for step in (6, 9))
    for name, tensor in averaged["state_dict"].items():
        if tensor.is_floating_point():
            torch.testing.assert_close(tensor, (first[name] + second[name]) / 2)
    capsys.readouterr()
    main(["export", str(folder), str(run_dir / "averaged"), "--average", "2"])
    assert f"Averaged 2 checkpoints of {folder}, steps 6, 9" in capsys.readouterr().out
    exported = TransformerForConditionalGeneration.from_pretrained(run_dir / "averaged").state_dict()
    assert {f"model.{name}" for name in exported} <= set(first)
    for name, tensor in exported.items():
        mean = (first[f"model.{name}"].double() + second[f"model.{name}"].double()) / 2
        torch.testing.assert_close(tensor, mean.float(), atol=0, rtol=0, msg=name)
    # ... which the other checkpoints would not give: every weight moved between steps 6 and 9.
    assert all(not torch.equal(first[f"model.{name}"], second[f"model.{name}"]) for name in exported)


EMA = ("--trainer.callbacks+=lightning.pytorch.callbacks.EMAWeightAveraging", "--trainer.callbacks.decay=0.9")


def test_ema_weights_are_what_a_checkpoint_exports_and_resume_continues_both(run_dir):
    """With Lightning's EMAWeightAveraging in trainer.callbacks a checkpoint's state_dict holds the exponential moving
    average (what export and averaging read) and current_model_state the weights being trained; stopped at a step
    checkpoint (step 6) and resumed, both end as in 12 uninterrupted steps."""
    fit("--trainer.max_steps=12", *EMA)
    uninterrupted = load_checkpoint(run_dir / "runs/demo/checkpoints/last.ckpt")
    (run_dir / "runs/demo/checkpoints").rename(run_dir / "uninterrupted")
    fit("--trainer.max_steps=6", *EMA)
    fit("--trainer.max_steps=12", "--ckpt_path=last", *EMA)
    resumed = load_checkpoint(run_dir / "runs/demo/checkpoints/last.ckpt")
    for state in ("state_dict", "current_model_state"):
        for name, tensor in uninterrupted[state].items():
            torch.testing.assert_close(resumed[state][name], tensor, atol=1e-6, rtol=0, msg=f"{state} {name}")
    name = "model.model.encoder.layers.0.feed_forward.fc1.weight"
    assert not torch.allclose(uninterrupted["state_dict"][name], uninterrupted["current_model_state"][name])
    export_checkpoint(uninterrupted, run_dir / "exported")
    exported = TransformerForConditionalGeneration.from_pretrained(run_dir / "exported")
    torch.testing.assert_close(
        exported.model.encoder.layers[0].feed_forward.fc1.weight, uninterrupted["state_dict"][name], atol=0, rtol=0
    )


def test_a_checkpoint_is_written_beside_its_target_and_a_write_cut_short_leaves_the_previous_file(
    tmp_path, monkeypatch
):
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"global_step": 1}, path)
    events = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: events.append("fsync") or fsync(fd))
    monkeypatch.setattr(os, "replace", lambda src, dst: events.append(Path(src).parent) or replace(src, dst))
    AtomicCheckpointIO().save_checkpoint({"global_step": 2}, path)
    # Flushed to disk before it takes the name, from a file in the same folder (a rename, never a copy), and the
    # rename flushed too.
    assert events == ["fsync", tmp_path, "fsync"]
    assert torch.load(path, weights_only=True) == {"global_step": 2}

    def killed_while_writing(obj, file):
        file.write(b"PK\x03\x04 the first bytes of a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", killed_while_writing)
    with pytest.raises(KeyboardInterrupt):
        AtomicCheckpointIO().save_checkpoint({"global_step": 3}, path)
    assert torch.load(path, weights_only=True) == {"global_step": 2}
    assert [file.name for file in tmp_path.iterdir()] == ["last.ckpt"]


def test_a_checkpoint_of_the_old_module_layout_names_its_version_and_still_exports(run_dir):
    fit("--trainer.max_steps=3")
    path = run_dir / "runs/demo/checkpoints/last.ckpt"
    checkpoint = load_checkpoint(path)
    assert checkpoint["hf_transformer_version"] == importlib.metadata.version("hf-transformer")
    old = run_dir / "old.ckpt"  # as 0.1.0 wrote it: the model sizes as module arguments, no version
    del checkpoint["hf_transformer_version"]
    checkpoint["hyper_parameters"] = {"d_model": 32, "attention_heads": 2, "lr_schedule": "noam", "peak_lr": 1e-3}
    torch.save(checkpoint, old)
    with pytest.raises(
        ValueError, match=r"old\.ckpt was written by hf-transformer a version before 0\.2\.0.*attention_heads"
    ):
        fit("--trainer.max_steps=6", f"--ckpt_path={old}")
    run(["export", str(old), "exports/old"])
    assert (run_dir / "exports/old/model.safetensors").exists()


def test_a_run_trained_further_after_max_steps_is_the_run_that_never_stopped(run_dir):
    """A run that ended at max_steps in the middle of an epoch, resumed with a higher max_steps, trains the rest of that
    epoch's batches: its last.ckpt marked the epoch complete, and the resumed run started the next one (weights 2e-4
    apart after 3 more steps). The throughput callback's total, the target tokens trained (a recipe's budget in
    tokens, as papers state it), is those of the batches trained."""
    fit("--trainer.max_steps=7", "--trainer.default_root_dir=uninterrupted")
    fit("--trainer.max_steps=4")
    fit("--trainer.max_steps=7", "--ckpt_path=last")
    resumed = load_checkpoint(run_dir / "runs/demo/checkpoints/last.ckpt")
    uninterrupted = load_checkpoint(run_dir / "uninterrupted/checkpoints/last.ckpt")
    for name, tensor in uninterrupted["state_dict"].items():
        assert torch.equal(resumed["state_dict"][name], tensor), name
    totals = resumed["callbacks"]["TranslationThroughput"]
    data = TranslationCLI(args=["--config", str(DEMO), "--config", "tiny.yaml"], run=False).datamodule
    data.setup("fit")
    batches = list(itertools.islice(data.train_dataloader(), 7))
    assert totals["trained_target_tokens"] == sum(int((batch["labels"] != -100).sum()) for batch in batches)
    assert totals["trained_seconds"] > 0


def as_written_by(version: str, checkpoint: dict) -> dict:
    """`checkpoint` as hf-transformer 0.3 or 0.4 wrote it: the schedule and R-Drop as flat module arguments
    (`peak_lr`, `warmup_steps`, `cooldown_steps`, `rdrop_alpha`), no class path, no description of the training."""
    hparams = dict(checkpoint["hyper_parameters"])
    schedule = hparams.pop("schedule")["init_args"]
    hparams.pop("_class_path", None)
    flat = dict(
        peak_lr=schedule["peak_lr"],
        warmup_steps=schedule["warmup_steps"],
        cooldown_steps=schedule.get("cooldown_steps", 0),
        rdrop_alpha=hparams.pop("alpha", 0.0),
    )
    old = {key: value for key, value in checkpoint.items() if key != "training_description"}
    return old | {"hf_transformer_version": version, "hyper_parameters": hparams | flat}


def test_a_0_3_checkpoint_resumes_with_its_module_arguments(run_dir):
    """A checkpoint of 0.3, whose training module took rdrop_alpha and cooldown_steps, resumes from its file with
    them: LightningCLI reads its module arguments back, upgraded to R-Drop's class and the schedule's."""
    fit("--trainer.max_steps=3")
    checkpoint = as_written_by("0.3.0", load_checkpoint(run_dir / "runs/demo/checkpoints/last.ckpt"))
    checkpoint["hyper_parameters"].update(cooldown_steps=0, rdrop_alpha=5.0)
    old = run_dir / "old.ckpt"
    torch.save(checkpoint, old)
    fit("--trainer.max_steps=6", f"--ckpt_path={old}")
    resumed = load_checkpoint(run_dir / "runs/demo/checkpoints/last.ckpt")
    assert resumed["global_step"] == 6
    hparams = resumed["hyper_parameters"]
    assert hparams["_class_path"].endswith("RDropTranslationModule") and hparams["alpha"] == 5.0
    assert hparams["schedule"]["init_args"] == yaml.safe_load(DEMO.read_text())["model"]["schedule"]["init_args"]
    # Its card, exported from the old file, describes the training from the upgraded arguments.
    main(["export", str(old), "exported"])
    card = (run_dir / "exported" / "README.md").read_text()
    rows = describe_training(checkpoint)
    assert [label for label, _ in rows] == ["Learning-rate schedule", "R-Drop"]
    assert all(f"| {label} | {text} |" in card for label, text in rows), rows


@pytest.mark.parametrize("version", ["0.3.0", "0.4.0"])
def test_an_old_checkpoint_with_rdrop_and_a_cooldown_resumes_into_them_exactly(run_dir, version):
    """A run of 0.3 or 0.4 with R-Drop and a cool-down, interrupted inside the cool-down, resumes as the run that
    never stopped: the same weights (R-Drop's dropout masks included), and the learning rate at 0 at max_steps. The
    command names neither: LightningCLI reads the module arguments back from the checkpoint, and they map onto
    RDropTranslationModule and InverseSquareRootWithCooldown."""
    settings = ["--trainer.max_steps=6", "--model.schedule.warmup_steps=1", "--model.schedule.cooldown_steps=3"]
    fit(RDROP, "--model.alpha=5", COOLDOWN, *settings, "--trainer.default_root_dir=uninterrupted")
    written = load_checkpoint(run_dir / "uninterrupted/checkpoints/step000003.ckpt")
    old = run_dir / "old.ckpt"
    torch.save(as_written_by(version, written), old)
    fit("--trainer.max_steps=6", f"--ckpt_path={old}")
    resumed = load_checkpoint(run_dir / "runs/demo/checkpoints/last.ckpt")
    uninterrupted = load_checkpoint(run_dir / "uninterrupted/checkpoints/last.ckpt")
    assert resumed["global_step"] == 6 and resumed["lr_schedulers"][0]["_last_lr"] == [0.0]
    classes = [checkpoint["hyper_parameters"].pop("_class_path") for checkpoint in (resumed, uninterrupted)]
    assert all(path.startswith("lightning_modules.experimental.") for path in classes)
    assert all(path.endswith(".RDropTranslationModule") for path in classes)
    assert resumed["hyper_parameters"] == uninterrupted["hyper_parameters"]
    for name, tensor in uninterrupted["state_dict"].items():
        assert torch.equal(resumed["state_dict"][name], tensor), name


def test_a_torn_checkpoint_is_skipped_by_averaging_and_named_by_export_and_resume(run_dir, capsys):
    fit("--trainer.max_steps=9")
    folder = run_dir / "runs/demo/checkpoints"
    torn = folder / "step000006.ckpt"
    torn.write_bytes(torn.read_bytes()[: torn.stat().st_size // 2])
    with pytest.warns(UserWarning, match=r"Not averaging .*step000006\.ckpt is not a readable checkpoint"):
        main(["export", str(folder), "averaged", "--average", "2"])
    assert "steps 3, 9" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"step000006\.ckpt is not a readable checkpoint"):
        run(["export", str(torn), "exported"])
    with pytest.raises(ValueError, match=r"step000006\.ckpt is not a readable checkpoint"):
        fit("--trainer.max_steps=12", f"--ckpt_path={torn}")


@pytest.mark.parametrize(
    ("kind", "reason"), [("pickled object", "UnpicklingError: Unsupported global"), ("text", "KeyError")]
)
def test_a_file_that_is_no_checkpoint_is_named_in_one_line(run_dir, capsys, kind, reason):
    """A pickled object's refusal embedded torch's page on `weights_only` (and how to allow the object) in the
    message; a text file ended in a KeyError traceback from inside the unpickler."""
    path = run_dir / "not.ckpt"
    if kind == "text":
        path.write_text("hello\n")
    else:
        torch.save({"state": SimpleNamespace(step=1)}, path)
    message = error_line(capsys, "export", str(path), "exported")
    assert message.startswith(f"hf-transformer export: error: {path} is not a readable checkpoint ({reason}")
    assert message.endswith("Use another checkpoint of its folder.") and "weights_only" not in message


def test_export_says_which_steps_it_averaged_and_warns_when_they_span_most_of_the_run(run_dir, capsys):
    fit("--trainer.max_steps=9")
    main(["export", "runs/demo/checkpoints", "averaged", "--average", "3"])
    output = capsys.readouterr()
    assert "steps 3, 6, 9" in output.out
    assert "span steps 3-9, most of the run" in output.err
    assert averaging_span_warning([1120, 1140, 1160, 1180, 1200]) is None


def resolved_config(*configs: Path) -> dict:
    """The configuration a run of these config files resolves to (`--print_config`), the defaults included: in this
    process (the parser prints it and exits before anything is built), not in a new one that imports everything."""
    arguments = ["fit"] + [part for config in configs for part in ("--config", str(config))] + ["--print_config"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.raises(SystemExit) as exited:
        main(arguments)
    assert not exited.value.code, printed.getvalue()
    return yaml.safe_load(printed.getvalue())


# wmt14_big.yaml states what differs from wmt14_base.yaml: it is run after it.
RUNS = [[config] for config in CONFIGS if config.stem != "wmt14_big"] + [
    [DEMO.parent / "wmt14_base.yaml", DEMO.parent / "wmt14_big.yaml"]
]


@pytest.mark.parametrize("configs", RUNS, ids=lambda configs: configs[-1].stem)
def test_every_config_checkpoints_atomically_and_resumes_only_when_asked(configs):
    resolved = resolved_config(*configs)
    callbacks = [callback["class_path"] for callback in resolved["trainer"]["callbacks"]]
    assert not any("Checkpoint" in callback for callback in callbacks)  # the one checkpoint callback is `checkpoint`
    assert resolved["checkpoint"]["save_on_train_epoch_end"] is True  # else the step that ends an epoch is not saved
    assert resolved["checkpoint"]["save_last"] is True and resolved["checkpoint"]["every_n_train_steps"] > 0
    assert {"class_path": "lightning_modules.checkpoint.AtomicCheckpointIO"} in resolved["trainer"]["plugins"]
    assert resolved["trainer"]["default_root_dir"] == f"runs/{configs[-1].stem}"


@pytest.mark.parametrize("config", sorted(DEMO.parent.rglob("*.yaml")), ids=lambda config: config.stem)
def test_no_shipped_config_names_a_path_that_only_this_repository_has(config):
    """A user elsewhere runs every config: data comes from the Hub or from a path they pass."""
    settings = yaml.safe_load(config.read_text())
    dataset = (settings.get("data") or {}).get("dataset")
    assert dataset is None or dataset == "synthetic" or not Path(dataset).exists(), dataset
    assert "../" not in config.read_text() and "/work/" not in config.read_text()


def hub_copy_of_multi30k(folder: Path, pairs: int) -> Path:
    """A folder laid out as the Hub copy bentrevett/multi30k: train.jsonl, val.jsonl, test.jsonl of {"en", "de"}."""
    folder.mkdir()
    words = ["a", "dog", "man", "runs", "on", "the", "grass", "two", "women", "play", "music", "in", "a", "park"]
    german = ["ein", "Hund", "Mann", "rennt", "auf", "dem", "Gras", "zwei", "Frauen", "spielen", "Musik", "in", "einem"]
    generator = random.Random(0)
    for split, count in (("train", pairs), ("val", pairs // 8), ("test", pairs // 8)):
        rows = []
        for _ in range(count):
            length = generator.randint(3, 9)
            rows.append(
                {
                    "en": " ".join(generator.choices(words, k=length)),
                    "de": " ".join(generator.choices(german, k=length)),
                }
            )
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


QUICK = ("--trainer.max_steps=3", "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0")


@pytest.mark.slow
def test_the_multi30k_recipe_trains_from_the_hub_copy_layout_or_a_folder_of_raw_files(run_dir):
    """configs/multi30k.yaml names the Hub copy; a folder in its layout, or one of Multi30k's raw files, is one flag."""
    hub_copy = hub_copy_of_multi30k(run_dir / "hub_copy", pairs=400)
    config = str(DEMO.parent / "multi30k.yaml")
    run(["fit", "--config", config, "--data.dataset", str(hub_copy), "--data.bpe_vocab_size=200", *QUICK])
    assert load_checkpoint(run_dir / "runs/multi30k/checkpoints/last.ckpt")["global_step"] == 3
    raw = os.environ.get("MULTI30K_DIR")
    if raw:  # the splits val and test_2016_flickr answer to validation and test
        root = "--trainer.default_root_dir=raw"
        run(["fit", "--config", config, "--data.dataset", raw, "--trainer.max_steps=1", *QUICK[1:], root])
        assert load_checkpoint(run_dir / "raw/checkpoints/last.ckpt")["global_step"] == 1


def wmt14_layout(folder: Path, pairs: int) -> Path:
    """A local dataset laid out as wmt/wmt14 on the Hub: a de-en configuration of parquet files whose rows hold a
    `translation` dict."""
    (folder / "de-en").mkdir(parents=True)
    generator = random.Random(1)
    for split, count in (("train", pairs), ("validation", pairs // 8), ("test", pairs // 8)):
        rows = [
            {
                "translation": {
                    "de": f"der Satz {generator.randint(0, 99)}",
                    "en": f"the sentence {generator.randint(0, 99)}",
                }
            }
            for _ in range(count)
        ]
        datasets.Dataset.from_list(rows).to_parquet(str(folder / "de-en" / f"{split}-00000-of-00001.parquet"))
    (folder / "README.md").write_text(
        "---\nconfigs:\n- config_name: de-en\n  data_files:\n"
        + "".join(f"  - split: {s}\n    path: de-en/{s}-*\n" for s in ("train", "validation", "test"))
        + "---\n"
    )
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("streaming", [False, True], ids=["prepared", "streamed"])
def test_the_paper_base_recipe_runs_on_the_wmt14_layout_on_a_cpu(run_dir, streaming):
    """configs/wmt14_base.yaml as a user starts it, on a small local dataset in WMT14's Hub layout (translation
    dicts), with the GPU settings overridden for this CPU and a tiny model, its training split prepared or streamed."""
    folder = wmt14_layout(run_dir / "wmt14", pairs=200)
    base = DEMO.parent / "wmt14_base.yaml"
    cpu = ["--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.strategy=auto", "--trainer.precision=32-true"]
    tiny = [
        "--model.compile=false",
        "--model.config={d_model: 32, encoder_layers: 1, decoder_layers: 1, "
        "encoder_attention_heads: 2, decoder_attention_heads: 2, encoder_ffn_dim: 64, decoder_ffn_dim: 64, "
        "max_position_embeddings: 64}",
        "--data.bpe_vocab_size=200",
        "--data.num_workers=0",
    ]
    logger = ["--trainer.logger.init_args.offline=true", f"--data.streaming={streaming}", "--data.stream_buffer=50"]
    run(["fit", "--config", str(base), "--data.dataset", str(folder), *cpu, *tiny, *logger, *QUICK])
    assert load_checkpoint(run_dir / "runs/wmt14_base/checkpoints/last.ckpt")["global_step"] == 3


def test_the_demo_keeps_the_last_checkpoints_of_the_run_for_averaging():
    """As section 6.1 averages the last 5 checkpoints of 12 hours, 10 minutes apart: the demo's last 5 lie in the
    last tenth of its steps."""
    resolved = resolved_config(DEMO)
    settings, max_steps = resolved["checkpoint"], resolved["trainer"]["max_steps"]
    span = settings["every_n_train_steps"] * (settings["save_top_k"] - 1)
    assert settings["save_top_k"] == 5 and span <= max_steps / 10


@pytest.mark.skipif(not torch.cuda.is_available(), reason="16-mixed uses a gradient scaler only on a CUDA GPU")
def test_fp16_mixed_with_grad_scaler_trains_on_gpu(run_dir):
    fit("--trainer.max_steps=6", "--trainer.precision=16-mixed", "--trainer.accelerator=gpu", "--trainer.devices=1")
    checkpoint = load_checkpoint(run_dir / "runs/demo/checkpoints/last.ckpt")
    assert checkpoint["global_step"] == 6
    assert checkpoint["MixedPrecision"]["scale"] > 0  # the grad scaler and its state travel with the checkpoint
    assert all(torch.isfinite(t).all() for t in checkpoint["state_dict"].values() if t.is_floating_point())


def test_progress_prints_the_first_step_then_every_n_steps_once_per_step(capsys, monkeypatch):
    """A line after the first step (the demo was silent for its first 100 steps), then every `every_n_steps` steps or
    `every_n_seconds` seconds, once per step when batches are accumulated."""
    from lightning_modules.callbacks import progress as callbacks

    now = [0.0]
    monkeypatch.setattr(callbacks.time, "monotonic", lambda: now[0])

    def printed_steps(progress: callbacks.LineProgress, steps: list[int], seconds_per_batch: float = 0) -> list[str]:
        trainer = SimpleNamespace(
            global_step=0, max_steps=9, callback_metrics={}, optimizers=[], is_global_zero=True, callbacks=[]
        )
        for step in steps:
            now[0] += seconds_per_batch
            trainer.global_step = step
            progress.on_train_batch_end(trainer, None, None, None, 0)
        return [line.split(" | ")[0] for line in capsys.readouterr().out.splitlines()]

    two_batches_per_step = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert printed_steps(callbacks.LineProgress(every_n_steps=2), two_batches_per_step) == [
        "step 1/9",
        "step 2/9",
        "step 4/9",
    ]
    assert printed_steps(callbacks.LineProgress(every_n_steps=100, every_n_seconds=60), list(range(1, 7)), 25) == [
        "step 1/9",
        "step 4/9",
    ]


def simulate_progress(progress: LineProgress, monkeypatch, steps: range, seconds_of_step, validation_seconds: float):
    """Drive `progress` through a fit of `steps` on a fake clock: each step takes `seconds_of_step(step)` and carries
    8 target tokens, a validation of `validation_seconds` follows every 10th step (val_check_interval 10). Returns
    (line, the true time left when it was printed) for every step line."""
    from lightning_modules.callbacks import progress as callbacks

    now = [0.0]
    monkeypatch.setattr(callbacks.time, "monotonic", lambda: now[0])
    trainer = SimpleNamespace(
        global_step=steps[0] - 1,
        max_steps=steps[-1],
        callback_metrics={},
        optimizers=[],
        is_global_zero=True,
        callbacks=[],
        sanity_checking=False,
        num_val_batches=[1],
        val_check_batch=10,
        check_val_every_n_epoch=None,
        accumulate_grad_batches=1,
    )
    module = SimpleNamespace(model=SimpleNamespace(generation_config=SimpleNamespace(num_beams=1)), parameters=list)
    if steps[0] > 1:
        progress.on_load_checkpoint(trainer, module, {"global_step": steps[0] - 1})
    progress.on_fit_start(trainer, module)
    progress.on_train_start(trainer, module)
    printed = []
    labels = torch.zeros(2, 4, dtype=torch.long)
    for step in steps:
        now[0] += seconds_of_step(step)
        trainer.global_step = step
        progress.on_train_batch_end(trainer, module, None, {"labels": labels}, step)
        printed.append(now[0])
        if step % 10 == 0:
            progress.on_validation_start(trainer, module)
            now[0] += validation_seconds
            progress.on_validation_end(trainer, module)
    return printed, now[0]


def test_the_time_left_comes_from_a_moving_window_within_twice_the_truth(capsys, monkeypatch):
    """The first step of a start or resume pays for the data loader and first allocations (here 20 times a later step):
    its line shows no time left, where extrapolating it said 20 times too long. From the next line on the time left is
    the window's pace times the steps left plus the validations still to come at the last one's length, within 2x of
    the time the run really takes, after a resume too; the target tokens/s are the window's own, not a stale value."""

    def step_lines(first_step: int, max_steps: int) -> list[tuple[str, float]]:
        progress = LineProgress(every_n_steps=5, every_n_seconds=1e9, window_seconds=8)
        capsys.readouterr()
        times, end = simulate_progress(
            progress, monkeypatch, range(first_step, max_steps + 1), lambda step: 20.0 if step == first_step else 1.0, 6
        )
        lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
        steps = [int(line.split()[1].split("/")[0]) for line in lines]
        return [(line, end - times[step - first_step]) for line, step in zip(lines, steps, strict=True)]

    for first_step in (1, 23):  # a start, then a resume
        lines = step_lines(first_step, 60)
        assert lines[0][0].startswith(f"step {first_step}/60") and " left" not in lines[0][0]
        assert len(lines) > 5
        for line, truth in lines[1:]:
            minutes, seconds = line.split(" | ")[2].removesuffix(" left").split(":")
            shown = 60 * int(minutes) + int(seconds)
            assert truth / 2 <= shown <= 2 * truth, (line, truth)
            assert line.endswith(" | 8 target tokens/s"), line


def test_the_time_left_is_the_sooner_of_max_steps_and_max_time(capsys, monkeypatch):
    """At the window's pace (10 s a step here) until trainer.max_steps, or the time max_time leaves, the sooner."""
    from lightning_modules.callbacks import progress as callbacks

    now = [0.0]
    monkeypatch.setattr(callbacks.time, "monotonic", lambda: now[0])
    timer = Timer(duration="00:00:00:30")
    monkeypatch.setattr(timer, "time_remaining", lambda: 30.0)
    shown = []
    for callbacks_, max_steps in (([], 9), ([], -1), ([timer], 9), ([timer], -1)):
        progress = LineProgress(every_n_steps=1)
        trainer = SimpleNamespace(
            global_step=0, max_steps=max_steps, callback_metrics={}, optimizers=[], is_global_zero=True
        )
        trainer.callbacks = callbacks_
        progress.on_train_start(trainer, None)
        for step in (1, 2):
            now[0] += 10
            trainer.global_step = step
            progress.on_train_batch_end(trainer, None, None, None, 0)
        last = capsys.readouterr().out.splitlines()[-1]
        shown.append(last.split(" | ")[2] if " left" in last else None)
    assert shown == [
        "1:10 left",  # 7 steps at 10 s
        None,  # neither max_steps nor max_time
        "0:30 left",
        "0:30 left",
    ]


def test_validation_says_that_its_decoding_runs_on_rank_0(capsys):
    progress = LineProgress()
    for batches in (1, 2):
        progress.on_sanity_check_start(SimpleNamespace(num_sanity_val_steps=batches, is_global_zero=True), None)
    assert capsys.readouterr().out.splitlines() == [
        "Checking validation on up to 1 batch before training (trainer.num_sanity_val_steps)",
        "Checking validation on up to 2 batches before training (trainer.num_sanity_val_steps)",
    ]
    module = SimpleNamespace(model=SimpleNamespace(generation_config=SimpleNamespace(num_beams=4)))
    for rank_zero in (True, False):
        trainer = SimpleNamespace(sanity_checking=False, num_val_batches=[2], global_step=3, is_global_zero=rank_zero)
        progress.on_validation_start(trainer, module)
    assert capsys.readouterr().out == "validation at step 3: translating 2 batches (beam search, 4 beams)\n"


def test_progress_bars_as_lightning_takes_them(run_dir):
    """`--trainer.enable_progress_bar false` means no progress lines, and another progress bar replaces them
    (Lightning raised on both: the default LineProgress is a progress bar)."""

    def progress_bars(*options: str) -> list[type]:
        cli = TranslationCLI(args=["--config", str(DEMO), "--config", "tiny.yaml", *options], run=False)
        return [type(callback) for callback in cli.trainer.callbacks if isinstance(callback, ProgressBar)]

    assert progress_bars() == [LineProgress]
    assert progress_bars("--trainer.enable_progress_bar=false") == []
    assert progress_bars("--trainer.callbacks+=TQDMProgressBar") == [TQDMProgressBar]


def test_fit_offers_no_optimizer_or_scheduler_that_would_replace_the_recipes(capsys):
    """LightningCLI's --optimizer / --lr_scheduler silently replaced the module's AdamW and warm-up schedule."""
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    usage = capsys.readouterr().out
    assert "--model.help" in usage  # the module's options: `fit --model.help TranslationModule`
    assert "--optimizer" not in usage and "--lr_scheduler" not in usage
    with pytest.raises(SystemExit):
        main(["fit", "--model.help", "TranslationModule"])
    assert "--model.schedule" in capsys.readouterr().out


def error_line(capsys, *argv: str) -> str:
    """The one line that `hf-transformer` prints for a mistake, and exits 1 with."""
    with pytest.raises(SystemExit) as stopped:
        main(list(argv))
    assert stopped.value.code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(lines)
    return lines[-1]


def test_a_validation_split_too_small_for_limit_val_batches_is_one_line(run_dir, capsys):
    """A fraction of a one-batch split is no batch: Lightning stopped with a 40-line traceback."""
    message = error_line(
        capsys, "fit", "--config", str(DEMO), "--config", "tiny.yaml", "--trainer.limit_val_batches=0.25"
    )
    assert message.endswith(
        "validation split 'validation' makes 1 batch of up to 2048 tokens per device, and "
        "trainer.limit_val_batches=0.25 keeps 25% of them: less than one. Set "
        "trainer.limit_val_batches to 1.0 (the whole split) or to a number of batches (an int, e.g. 1)"
    )


def test_export_refuses_to_overwrite_a_folder_or_a_file_and_names_a_short_average(run_dir, capsys):
    fit("--trainer.max_steps=3")
    last = "runs/demo/checkpoints/last.ckpt"
    (run_dir / "mine").mkdir()
    (run_dir / "mine/README.md").write_text("my notes")
    message = error_line(capsys, "export", last, "mine")
    assert message.endswith(
        "mine is not empty (README.md): export into a new or empty folder, or add --overwrite to replace its files"
    )
    assert (run_dir / "mine/README.md").read_text() == "my notes"
    main(["export", last, "mine", "--overwrite"])
    assert (run_dir / "mine/model.safetensors").exists()
    (run_dir / "a-file").write_text("")
    assert error_line(capsys, "export", last, "a-file").endswith(
        "a-file is a file: give the path of a new or empty folder to export into"
    )
    message = error_line(capsys, "export", "runs/demo/checkpoints", "averaged", "--average", "10")
    assert message.endswith(
        "asked to average 10 checkpoints but runs/demo/checkpoints holds 1 (steps 3): average at "
        "most 1 (--average 1), or keep more in the next run (save_top_k of the checkpoint callback)"
    )
    with pytest.raises(ValueError, match="checkpoints to average must be at least 1, got 0"):
        last_checkpoints("runs/demo/checkpoints", 0)  # the last 0 would be all of them


def test_a_model_folder_with_a_bad_config_or_no_tokenizer_is_named_before_anything_is_written(run_dir, capsys):
    fit("--trainer.max_steps=3")
    main(["export", "runs/demo/checkpoints/last.ckpt", "exported"])
    (run_dir / "exported/tokenizer.json").unlink()
    message = error_line(capsys, "export", "exported", "marian", "--format", "marian")
    assert "exported has no tokenizer.json: a model folder needs the tokenizer it was trained with" in message
    assert not (run_dir / "marian").exists()

    config = run_dir / "exported/config.json"
    config.write_text(config.read_text().replace('"d_model": 32', '"d_model": "32"'))
    expected = "exported/config.json: Field 'd_model' expected int, got str (value: '32'). Fix that field in the file"
    assert expected in error_line(capsys, "export", "exported", "marian", "--format", "marian")
    message = error_line(capsys, "fit", "--config", str(DEMO), "--config", "tiny.yaml", "--model.init_from=exported")
    assert message.startswith(f"hf-transformer fit: error: {expected}")


def test_a_moved_run_folder_resumes_as_the_same_run(run_dir, tmp_path_factory, monkeypatch):
    """Moved (or copied) elsewhere, a run resumes into its own last.ckpt (Lightning wrote last-v1.ckpt and left
    last.ckpt, which README tells to export, at the old step) and keeps its run id and its last 5 checkpoints."""
    fit("--trainer.max_steps=9")
    moved = tmp_path_factory.mktemp("moved")
    (run_dir / "runs").rename(moved / "runs")
    (run_dir / "tiny.yaml").rename(moved / "tiny.yaml")
    monkeypatch.chdir(moved)
    fit("--trainer.max_steps=18", "--ckpt_path=last")
    folder = moved / "runs/demo/checkpoints"
    assert checkpoint_steps(moved) == {f"step{step:06d}.ckpt": step for step in (6, 9, 12, 15, 18)} | {"last.ckpt": 18}
    assert len({load_checkpoint(path)["run_id"] for path in folder.glob("*.ckpt")}) == 1


def test_a_run_owns_its_folder_while_it_trains(run_dir, capsys):
    """Two runs started at once into one folder interleaved their checkpoints; the second now stops, naming the
    first. The lock is the OS's (through filelock, on Windows too), so it ends with its process, kill -9 included."""
    folder = run_dir / "runs/demo/checkpoints"
    folder.mkdir(parents=True)
    (folder / ".lock-holder").write_text("process 4242 on trainer-7, started 2026-01-01 10:00:00\n")
    with FileLock(folder / ".lock"):  # another process training into the folder
        message = error_line(capsys, "fit", "--config", str(DEMO), "--config", "tiny.yaml", "--trainer.max_steps=3")
    assert "runs/demo/checkpoints belongs to a run that is still training (process 4242 on trainer-7" in message
    assert not list(folder.glob("*.ckpt"))
    fit("--trainer.max_steps=3")  # once that process has ended
    fit("--trainer.max_steps=6", "--ckpt_path=last")  # and the lock of a run ends with it
    assert checkpoint_steps(run_dir)["last.ckpt"] == 6
    assert not (folder / ".lock-holder").exists()


def test_averaging_refuses_checkpoints_of_different_runs(run_dir, capsys):
    fit("--trainer.max_steps=6")
    (run_dir / "runs").rename(run_dir / "first")
    fit("--trainer.max_steps=6")
    folder = run_dir / "runs/demo/checkpoints"
    (run_dir / "first/demo/checkpoints/step000006.ckpt").rename(folder / "step000009.ckpt")  # as if written there
    message = error_line(capsys, "export", str(folder), "averaged", "--average", "2")
    assert "the checkpoints to average belong to 2 different runs" in message
    assert "step000006.ckpt" in message and "step000009.ckpt" in message
    assert not (run_dir / "averaged").exists()


@pytest.mark.parametrize("command", ["test", "validate"])
def test_evaluating_needs_a_model(run_dir, capsys, command):
    """Without --ckpt_path, `test` scored a freshly initialised model (BLEU 0.0) and exited 0."""
    message = error_line(capsys, command, "--config", str(DEMO), "--config", "tiny.yaml")
    assert f"no model to {command}: " in message and "--ckpt_path last" in message and "--model.init_from" in message
    assert not (run_dir / "runs").exists()  # before any work


def test_ckpt_path_last_resumes_or_says_there_is_nothing_to_resume(run_dir, capsys):
    """Lightning warns ("Set save_last=True") and trains from step 0 when no last checkpoint exists."""
    args = ["--config", str(DEMO), "--config", "tiny.yaml", "--trainer.max_steps=3"]
    message = error_line(capsys, "fit", *args, "--ckpt_path=last")
    assert message.endswith(
        "--ckpt_path last: nothing to resume, runs/demo/checkpoints holds no last.ckpt. Start a new "
        "run without --ckpt_path, or give the checkpoint callback the dirpath of the run to resume"
    )
    assert not list(run_dir.glob("runs/demo/checkpoints/*.ckpt"))
    message = error_line(capsys, "test", *args, "--ckpt_path=last")
    assert "runs/demo/checkpoints holds no last.ckpt, so there is no model to test" in message
    message = error_line(capsys, "test", *args, "--ckpt_path=runs/demo/checkpoints/step000003.ckpt")
    assert message.endswith(
        "--ckpt_path runs/demo/checkpoints/step000003.ckpt: no such file. Pass a .ckpt file written by a run"
    )


@pytest.mark.parametrize("steps", [9, 15])
def test_a_run_resumed_with_a_smaller_save_top_k_keeps_its_last_checkpoints(run_dir, steps):
    """Resumed with save_top_k 2 after 3 (steps 3-9) or 5 (steps 3-15) checkpoints of save_top_k 5: Lightning stopped
    with KeyError '' in the first case and kept every checkpoint from then on in the second."""
    fit(f"--trainer.max_steps={steps}")
    # It says which files it deletes, which `export --average` could have averaged: it deleted them silently.
    deleted = ", ".join(f"step{step:06d}.ckpt" for step in range(3, steps - 3, 3))
    said = rf"save_top_k=2: deleting {deleted} of the {min(steps // 3, 5)} checkpoints this run kept in runs/demo/"
    with pytest.warns(UserWarning, match=said + r"checkpoints; .* averages at most 2\. Resume with --checkpoint"):
        fit(f"--trainer.max_steps={steps + 6}", "--ckpt_path=last", "--checkpoint.save_top_k=2")
    kept = {f"step{step:06d}.ckpt": step for step in (steps + 3, steps + 6)}
    assert checkpoint_steps(run_dir) == kept | {"last.ckpt": steps + 6}


def test_resuming_with_another_architecture_names_the_setting(run_dir, capsys):
    """Post-LN resumed as pre-LN: Lightning's RuntimeError listed the missing layer norms ("Missing key(s) in
    state_dict")."""
    fit("--trainer.max_steps=3")
    args = ["--config", str(DEMO), "--config", "tiny.yaml", "--trainer.max_steps=6", "--ckpt_path=last"]
    message = error_line(capsys, "fit", *args, "--model.config.normalize_before=true")
    assert message.endswith(
        "holds another architecture than this config builds: model.config.normalize_before is False in the "
        "checkpoint, True here (weights in one and not the other: model.model.decoder.layer_norm.bias, "
        "model.model.decoder.layer_norm.weight and 2 more). The settings must agree to resume or evaluate it: use "
        "those of the run that wrote it, or train with the new ones as a new run (another trainer.default_root_dir, "
        "without --ckpt_path)"
    )
    assert checkpoint_steps(run_dir) == {"step000003.ckpt": 3, "last.ckpt": 3}


def test_a_checkpoint_of_another_model_or_tokenizer_names_what_differs(run_dir, capsys):
    fit("--trainer.max_steps=3")
    ckpt = "--ckpt_path=runs/demo/checkpoints/last.ckpt"
    other_data = ["--data.bpe_vocab_size=80", "--data.tokenizer_dir=runs/other/tokenizer"]
    message = error_line(capsys, "test", "--config", str(DEMO), "--config", "tiny.yaml", *other_data, ckpt)
    assert (
        "the checkpoint (--ckpt_path) holds another model or tokenizer than this config builds: vocab_size 120 in "
        "the checkpoint, 80 here. Use the config of the run that wrote it" in message
    )


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full, a device that is always full")
def test_a_full_disk_stops_the_run_with_one_line(run_dir, capsys):
    """torch reported ENOSPC as `RuntimeError: [enforce fail at inline_container.cc:672]`, the cause mid-trace."""
    folder = run_dir / "runs/demo/checkpoints"
    folder.mkdir(parents=True)
    # What save_atomically writes step 3 into first (this process's pid): a disk with no space left.
    (folder / f".step000003.ckpt.{os.getpid()}.tmp").symlink_to("/dev/full")
    message = error_line(capsys, "fit", "--config", str(DEMO), "--config", "tiny.yaml", "--trainer.max_steps=6")
    assert message.startswith("hf-transformer fit: error: no space left on the disk of ")
    assert "runs/demo/checkpoints while writing step000003.ckpt" in message and "--ckpt_path last" in message
    assert not list(folder.glob("*.ckpt"))


@pytest.mark.parametrize(
    ("setting", "where"),
    [
        ("trainer.default_root_dir", "under a file"),
        ("checkpoint.dirpath", "under a file"),
        ("trainer.default_root_dir", "read-only"),
    ],
)
def test_a_run_folder_that_cannot_be_written_is_one_line_before_any_work(run_dir, capsys, setting, where):
    """`fit` into a folder on a read-only disk ended, once the data was read, in a 60-line traceback from the mkdir of
    the tokenizer's folder (the checkpoint folder's, with a tokenizer given)."""
    if where == "read-only":
        if os.geteuid() == 0:
            pytest.skip("root writes into a read-only folder: the folders under a file are the cases that run")
        (run_dir / "locked").mkdir(mode=0o555)
        folder, reason = "locked/run", f"no permission to write into {run_dir}/locked"
    else:
        (run_dir / "file").write_text("")
        folder, reason = "file/run", f"{run_dir}/file is not a folder"
    message = error_line(capsys, "fit", "--config", str(DEMO), "--config", "tiny.yaml", f"--{setting}={folder}")
    assert message.endswith(f"error: {setting} {folder}: cannot write there ({reason}). Give a folder you can write to")
    assert not (run_dir / "runs").exists()


def test_a_yaml_mistake_names_its_file_and_line(run_dir, capsys):
    (run_dir / "mine.yaml").write_text("trainer:\n  max_steps: [3\n")
    for option in (["--config", "mine.yaml"], ["--config=mine.yaml"]):
        message = error_line(capsys, "fit", "--config", str(DEMO), *option)
        assert message.startswith("hf-transformer fit: error: mine.yaml, line 3, column 1: expected ',' or ']'")
        assert "(while parsing a flow sequence, line 2, column 14); fix the YAML syntax there" in message


def test_a_class_path_of_0_3_names_where_the_class_is_now(run_dir, capsys):
    """A run folder's config.yaml written by 0.3 names the attention callback where 0.3 had it."""
    (run_dir / "old.yaml").write_text(
        "trainer:\n  callbacks:\n    - class_path: lightning_modules.attention_callback.AttentionMap\n"
    )
    message = error_line(capsys, "fit", "--config", str(DEMO), "--config", "old.yaml")
    assert message == (
        "hf-transformer fit: error: old.yaml, line 3: lightning_modules.attention_callback.AttentionMap is "
        "lightning_modules.callbacks.AttentionMap since hf-transformer 0.4; write that class path there"
    )


@pytest.mark.parametrize(
    ("option", "replacement"),
    [
        ("model.rdrop_alpha: 5", "R-Drop is the module lightning_modules.experimental.RDropTranslationModule"),
        ("model.cooldown_steps: 3000", "a cool-down is the schedule lightning_modules.experimental.InverseSquareRoot"),
        ("model.peak_lr: 0.002", "the schedule is an object: set model.schedule.peak_lr"),
        ("data.bpe_dropout: 0.1", "BPE-dropout is the data module lightning_modules.experimental.BPEDropoutDataModule"),
    ],
)
def test_a_training_option_of_0_4_names_the_class_that_replaces_it(run_dir, capsys, option, replacement):
    """A config of 0.4 (a run folder's config.yaml among them) set R-Drop, the schedule and BPE-dropout as flat
    options of the training and data modules: the file and line of the option, and the class path to write
    instead."""
    section, setting = option.split(".", 1)
    (run_dir / "old.yaml").write_text(f"{section}:\n  seed: 0\n  {setting}\n")
    message = error_line(capsys, "fit", "--config", str(DEMO), "--config", "old.yaml")
    name = option.split(":")[0]
    assert message.startswith(f"hf-transformer fit: error: old.yaml, line 3: {name} is gone: ")
    assert replacement in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="the configs run on this machine's GPUs")
@pytest.mark.parametrize(("config", "expected"), [("fsdp", "asks for FSDP, which shards"), ("ddp", "sets trainer")])
def test_gpu_configs_on_a_machine_without_gpus_say_what_to_use_instead(run_dir, capsys, config, expected):
    path = DEMO.parent / "trainer" / f"{config}.yaml"
    message = error_line(capsys, "fit", "--config", str(DEMO), "--config", "tiny.yaml", "--config", str(path))
    assert f"{path} {expected}" in message and "--trainer.accelerator cpu" in message
    assert not (run_dir / "runs").exists()  # before the tokenizer and the model are built


def test_resuming_a_finished_run_says_there_is_nothing_to_train(run_dir, capsys):
    fit("--trainer.max_steps=3")  # every run prints with LineProgress (lightning_modules/cli/defaults.yaml)
    printed = capsys.readouterr().out
    assert "Training from step 0/3 (" in printed and "step 1/3 | " in printed and "Trained 3 steps in " in printed
    assert "Total FLOPs" not in printed  # Lightning's summary table is left out: it counted 0 FLOPs

    fit("--trainer.max_steps=3", "--ckpt_path=last")
    printed = capsys.readouterr().out
    assert "Resuming from step 3/3 (" in printed
    assert (
        "Nothing to train: the run is at step 3, its trainer.max_steps. To train it further, resume with a "
        "higher --trainer.max_steps" in printed
    )
    assert "Trained" not in printed and "validation: \n" not in printed
    assert "Export it:   hf-transformer export runs/demo/checkpoints/last.ckpt exports/<name>" in printed

    fit("--trainer.max_steps=6", "--ckpt_path=last")
    printed = capsys.readouterr().out
    assert (
        "Resuming from step 3/6 (" in printed and "step 4/6 | " in printed and "Trained from step 3 to 6 in " in printed
    )


def test_summary_samples_are_distinct_and_spread_over_lengths():
    from lightning_modules.callbacks.progress import telling_samples

    rows = [[source, "", ""] for source in ["6", "6", "3", "6", "17", "482", "4821", "300000", "17", "99"]]
    assert [row[0] for row in telling_samples(rows, 3)] == ["3", "99", "4821"]
    assert [row[0] for row in telling_samples(rows[:3], 3)] == ["6", "3"]


def test_an_error_on_one_rank_of_many_saves_nothing_while_a_signal_saves(tmp_path):
    """Saving is collective: after an error that may have stopped one rank alone (out of memory), a rank that tried
    to save would wait for the others forever; a signal (SIGTERM, Ctrl-C) reaches every rank, which then save."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from lightning_modules.callbacks import ResumableCheckpoint

    saved = []
    callback = ResumableCheckpoint(dirpath=tmp_path)
    callback._save_last_now = saved.append  # what a save would call, recorded instead of writing
    trainer = SimpleNamespace(world_size=2, global_step=5, is_global_zero=False)
    for exception in (RuntimeError("CUDA out of memory"), SIGTERMException()):
        callback._saved_step = 4  # last.ckpt holds step 4: step 5 is unsaved
        callback.on_exception(trainer, torch.nn.Linear(2, 2), exception)  # finite weights
    assert saved == [trainer]  # the signal's save only

"""Data-parallel training computes the same thing as one process: DDP on two CPU processes (gloo) and a two-node
`torchrun` launch on 127.0.0.1, each rank on half of every batch, end with the weights of one process trained on the
whole batches.

Each run is `tests/ddp_train.py` in a subprocess: `strategy="ddp"` starts its other ranks by re-running the command
line, which inside pytest would be pytest itself.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("ddp_train.py")
REPO = SCRIPT.parent.parent
TIMEOUT_S = 180  # a run takes 10-20 s on two shared cores; a hung all-reduce must not hang the test session
ATOL = 1e-5
STEPS = 4  # ddp_train.STEPS
# A gradient-norm bound every step exceeds: the clipped gradients' elements are then of the order of Adam's eps, so the
# updates depend on the clipping factor, and a norm computed on one rank's shard alone would change them.
CLIP = 1e-3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def loopback_env(port: int) -> dict[str, str]:
    """Rendezvous and gloo traffic on 127.0.0.1 only."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    if Path("/sys/class/net/lo").exists():
        env["GLOO_SOCKET_IFNAME"] = "lo"  # otherwise gloo binds to whatever address the host name resolves to
    return env


def kill_tree(process: subprocess.Popen) -> None:
    """Kill a launcher, every process it started (DDP ranks; torchrun's workers, which get their own sessions) and
    whatever is left in its process group (ranks orphaned when the launcher died)."""
    family = []
    if process.poll() is None:  # still running, so its pid is still its own
        with contextlib.suppress(psutil.NoSuchProcess):
            launcher = psutil.Process(process.pid)
            family = [launcher, *launcher.children(recursive=True)]
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # the launcher led its own group (start_new_session=True)
    process.wait()
    psutil.wait_procs(family, timeout=10)


def wait_all(processes: list[subprocess.Popen], timeout: float) -> list[int | None]:
    """Exit codes once all succeeded, one failed (the others would wait for it forever) or the time is up (None)."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [process.poll() for process in processes]
        if all(code == 0 for code in codes) or any(code not in (None, 0) for code in codes):
            return codes
        if time.monotonic() > deadline:
            return codes
        time.sleep(0.2)


def run_together(commands: list[list[str]], env: dict[str, str], logs: Path, timeout: float = TIMEOUT_S) -> None:
    """Start the commands at once and wait for all of them; fail with their output if one fails or they run past the
    timeout. Nothing they started outlives this call."""
    logs.mkdir(parents=True, exist_ok=True)
    log_paths = [logs / f"process{index}.log" for index in range(len(commands))]
    processes = []
    try:
        for command, log_path in zip(commands, log_paths, strict=True):
            with open(log_path, "wb") as log:
                processes.append(
                    subprocess.Popen(
                        command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                    )
                )
        codes = wait_all(processes, timeout)
    finally:
        for process in processes:
            kill_tree(process)  # only finds something when a launcher failed or hung
    failed = [index for index, code in enumerate(codes) if code != 0]
    if failed:
        outcome = {None: "still running: killed"}
        outputs = "\n".join(
            f"--- {' '.join(commands[index])} -> {outcome.get(codes[index], f'exit code {codes[index]}')}\n"
            f"{log_paths[index].read_text()[-3000:]}"
            for index in failed
        )
        pytest.fail(f"{len(failed)} of {len(commands)} processes failed or ran past {timeout} s:\n{outputs}")


def train(out: Path, *args: str) -> dict:
    """One launch of the script on one machine; the result rank 0 saved."""
    run_together([[sys.executable, str(SCRIPT), str(out), *args]], loopback_env(free_port()), out.parent / "logs")
    return torch.load(out, weights_only=True)


def assert_same_training(result: dict, reference: dict, world_size: int) -> None:
    """`world_size` ranks started from the reference's initial weights, took disjoint, equal shares of every reference
    batch and reached the reference's trained weights."""
    assert result["world_size"] == world_size
    for name, weight in result["initial"].items():
        assert torch.equal(weight, reference["initial"][name]), f"{name} started from different weights"
    assert result["steps"] == reference["steps"] == STEPS
    sources = result["sources"]  # [rank, micro-batch, row, position]
    assert sources.shape[0] == world_size
    # A step's consecutive micro-batches of a rank are its share; the ranks' shares in order are the batch.
    shares = sources.reshape(world_size, STEPS, -1, sources.shape[-1])
    assert torch.equal(torch.cat(list(shares), dim=1), reference["sources"][0]), "ranks did not split the batches"
    assert result["trained"].keys() == reference["trained"].keys()
    for name, weight in result["trained"].items():
        torch.testing.assert_close(weight, reference["trained"][name], rtol=0, atol=ATOL, msg=name)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """One process on the whole batches. The weights must move by far more than the tolerance, or equality of the
    distributed runs would prove nothing."""
    result = train(tmp_path_factory.mktemp("single") / "weights.pt")
    assert result["world_size"] == 1
    moved = max((result["trained"][name] - weight).abs().max() for name, weight in result["initial"].items())
    assert moved > 100 * ATOL
    return result


def test_ddp_on_two_processes_matches_one_process(reference, tmp_path):
    """`devices=2, strategy="ddp"` (gloo): the two halves of each batch hold different numbers of target tokens, and
    the mean of their gradients, as DDP takes it, is still the whole batch's per-token gradient, so after the same
    optimizer steps the weights agree."""
    result = train(tmp_path / "weights.pt", "--devices", "2")
    assert_same_training(result, reference, world_size=2)


def test_accumulating_micro_batches_of_different_sizes_matches_one_batch(reference, tmp_path):
    """`accumulate_grad_batches=2` on quarter batches, as two DDP processes: every target token of the step weighs the
    same however many each micro-batch and rank holds, so the weights reach those of whole batches."""
    result = train(tmp_path / "weights.pt", "--devices", "2", "--accumulate", "2")
    assert_same_training(result, reference, world_size=2)


def test_rdrop_on_two_processes_accumulating_micro_batches_matches_one_plain_process(reference, tmp_path):
    """R-Drop runs each micro-batch twice and divides by twice its step's target tokens: without dropout its two
    copies agree (their divergence and its gradient are 0), so with DDP and accumulation it must train the plain
    single-process weights, or its divisor weighs the ranks' and micro-batches' tokens differently from the plain
    path's."""
    result = train(tmp_path / "weights.pt", "--devices", "2", "--accumulate", "2", "--rdrop-alpha", "5")
    assert_same_training(result, reference, world_size=2)


def test_two_nodes_launched_by_torchrun_match_one_process(reference, tmp_path):
    """Two `torchrun` "nodes" of one process each on 127.0.0.1 (`num_nodes=2, devices=1`): both exit 0 and the weights
    equal the single-process run."""
    out = tmp_path / "weights.pt"
    port = free_port()
    commands = [
        [
            sys.executable,
            "-m",
            "torch.distributed.run",  # what the torchrun command runs
            "--nnodes=2",
            "--nproc-per-node=1",
            f"--node-rank={node_rank}",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            str(SCRIPT),
            str(out),
            "--num-nodes",
            "2",
        ]
        for node_rank in (0, 1)
    ]
    run_together(commands, loopback_env(port), tmp_path / "logs")
    assert_same_training(torch.load(out, weights_only=True), reference, world_size=2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Lightning runs FSDP on GPUs only")
def test_fsdp_clips_the_gradient_norm_as_one_process(tmp_path):
    """configs/trainer/fsdp.yaml's strategy with `trainer.gradient_clip_val`, which Lightning's FSDP plugin refuses to
    apply by norm and the module hands to FSDP's root module, on up to two GPUs: each rank holds a shard of the
    gradients, the norm is the whole gradient's, and the weights reach those of one GPU clipping without FSDP."""
    devices = min(torch.cuda.device_count(), 2)
    on_gpu = ("--accelerator", "gpu")
    clipped = train(tmp_path / "clipped.pt", *on_gpu, "--gradient-clip-val", str(CLIP))
    unclipped = train(tmp_path / "unclipped.pt", *on_gpu)
    apart = max((clipped["trained"][name] - weight).abs().max() for name, weight in unclipped["trained"].items())
    assert apart > 100 * ATOL, "clipping did not change the training: the test could not tell FSDP's clipping apart"
    fsdp = train(
        tmp_path / "fsdp.pt", *on_gpu, "--devices", str(devices), "--strategy", "fsdp", "--gradient-clip-val", str(CLIP)
    )
    assert_same_training(fsdp, clipped, world_size=devices)

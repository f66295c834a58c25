"""The training step: the chunked label-smoothed loss, its compilation into one graph, and the optimizer."""

import json
import math
import subprocess
import sys
import textwrap
import traceback
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_CONFIG
from lightning.pytorch.plugins.precision import FSDPPrecision, MixedPrecision, Precision
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
from lightning.pytorch.utilities import GradClipAlgorithmType
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from hf_transformer.errors import ConfigError
from hf_transformer.model import loss
from hf_transformer.model.integrity import check_token_ids
from hf_transformer.model.loss import linear_cross_entropy, translation_loss
from lightning_modules import TranslationDataModule, TranslationModule
from lightning_modules.data.batching import TranslationCollator
from lightning_modules.experimental import InverseSquareRootWithCooldown, RDropTranslationModule
from lightning_modules.experimental.rdrop import rdrop_loss
from lightning_modules.module import clips_norm_through_fsdp, fused_adam_allowed
from lightning_modules.schedules import InverseSquareRoot


def tiny_module(vocab_size: int = 64, module: type[TranslationModule] = TranslationModule, **overrides):
    return module(config={**TINY_CONFIG, "dropout": 0.1, "vocab_size": vocab_size}, **overrides)


def padded_batch(vocab_size: int = 64) -> dict[str, torch.Tensor]:
    """Three pairs with source padding and -100 target padding, one ignored label inside a row."""
    source = torch.randint(4, vocab_size, (3, 9))
    attention_mask = (torch.arange(9) < torch.tensor([[9], [5], [7]])).long()
    labels = torch.randint(4, vocab_size, (3, 7)).masked_fill(torch.arange(7) >= torch.tensor([[7], [4], [6]]), -100)
    labels[2, 1] = -100
    return {"input_ids": source.masked_fill(attention_mask == 0, 0), "attention_mask": attention_mask, "labels": labels}


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("chunk_bytes", [loss.CPU_LOGITS_CHUNK_BYTES, 1000])
@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_linear_cross_entropy_equals_cross_entropy_in_value_and_gradients(
    monkeypatch, label_smoothing, chunk_bytes, scale
):
    """One chunk, and chunks of a few tokens each: the same loss and gradients as the full fp32 logits, also for
    logits in the hundreds, whose exponentials overflow fp32 unless shifted by their maximum first."""
    monkeypatch.setattr(loss, "CPU_LOGITS_CHUNK_BYTES", chunk_bytes)
    hidden = (scale * torch.randn(50, 16)).requires_grad_()
    weight = torch.randn(37, 16, requires_grad=True)
    labels = torch.randint(0, 37, (50,))
    labels[::7] = -100
    expected = F.cross_entropy(hidden @ weight.T, labels, label_smoothing=label_smoothing, reduction="sum")
    expected_gradients = torch.autograd.grad(3 * expected, (hidden, weight))
    chunked = linear_cross_entropy(hidden, weight, labels, label_smoothing)
    torch.testing.assert_close(chunked, expected)
    gradients = torch.autograd.grad(3 * chunked, (hidden, weight))
    for gradient, expected_gradient in zip(gradients, expected_gradients, strict=True):
        # Sums of terms `scale` times larger, in another order: fp32 rounding grows with them.
        torch.testing.assert_close(gradient, expected_gradient, rtol=1.3e-6 * scale, atol=1e-5 * scale)
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(hidden, weight, labels, label_smoothing), expected)


def test_linear_cross_entropy_under_bf16_autocast_projects_in_bf16_and_scores_in_fp32():
    hidden, weight = torch.randn(40, 16, requires_grad=True), torch.randn(37, 16, requires_grad=True)
    labels = torch.randint(0, 37, (40,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = F.cross_entropy(F.linear(hidden, weight).float(), labels, label_smoothing=0.1, reduction="sum")
        chunked = linear_cross_entropy(hidden, weight, labels, 0.1)
    torch.testing.assert_close(chunked, expected)
    chunked.backward()
    assert hidden.grad.dtype == weight.grad.dtype == torch.float32


MEMORY_CHILD = """
import json, sys, torch, torch.nn.functional as F
from pathlib import Path
from hf_transformer.model.loss import linear_cross_entropy
from lightning_modules.experimental.rdrop import rdrop_loss

def peak_rss():
    return next(int(l.split()[1]) * 1024 for l in Path("/proc/self/status").read_text().splitlines()
                if l.startswith("VmHWM:"))

tokens, vocab = 8192, 32000
hidden = torch.randn(tokens, 64, requires_grad=True)
weight = torch.randn(vocab, 64, requires_grad=True)
labels = torch.randint(0, vocab, (tokens,))
Path("/proc/self/clear_refs").write_text("5")
before = peak_rss()
if sys.argv[1] == "chunked":
    linear_cross_entropy(hidden, weight, labels, 0.1).backward()
elif sys.argv[1] == "rdrop":  # R-Drop's: the tokens are the two copies of 4,096 target tokens
    rdrop_loss(hidden.view(2, tokens // 2, -1), weight, labels[: tokens // 2].view(1, -1), 0.1, 5.0).loss.backward()
else:
    F.cross_entropy(hidden @ weight.T, labels, label_smoothing=0.1, reduction="sum").backward()
print(json.dumps(peak_rss() - before))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak memory is read from /proc/self/status")
def test_chunked_loss_never_holds_the_logits_of_every_token():
    """8,192 tokens x 32,000 words: full fp32 logits are 1 GiB, and F.cross_entropy's step holds them, their log
    softmax and their gradient; the chunked loss needs less than the logits alone, and R-Drop's chunked loss of two
    copies of 4,096 tokens less than one copy's logits. Peak memory of each step, measured in a fresh process."""
    peaks = {}
    for kind in ("chunked", "rdrop", "reference"):
        result = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(MEMORY_CHILD), kind], capture_output=True, text=True, check=True
        )
        peaks[kind] = json.loads(result.stdout.strip().splitlines()[-1]) / 2**20
    assert peaks["reference"] > 2 * 1024 and peaks["chunked"] < 1024 and peaks["rdrop"] < 512, peaks


def test_translation_loss_is_the_chunked_loss_of_the_target_positions():
    """`translation_loss`, which `forward(labels=...)` returns, equals F.cross_entropy over the target positions of
    full logits, eager and on the compiled path's every-position layout alike."""
    torch.manual_seed(0)
    hidden, weight = torch.randn(3, 5, 8), torch.randn(11, 8)
    labels = torch.randint(0, 11, (3, 5))
    labels[0, 3:] = labels[2, 1] = -100
    is_target = labels != -100
    expected = F.cross_entropy(hidden[is_target] @ weight.T, labels[is_target], label_smoothing=0.1)
    torch.testing.assert_close(translation_loss(hidden, weight, labels, 0.1), expected)
    summed = expected * is_target.sum()
    torch.testing.assert_close(translation_loss(hidden, weight, labels, 0.1, num_items_in_batch=20), summed / 20)


def rdrop_reference(hidden, weight, labels, label_smoothing, alpha):
    """R-Drop's summed loss by torch's functions on the full logits: both copies' cross-entropies and alpha / 2 times
    the two `kl_div`s, on the target tokens, in fp32 or fp64 (bf16 logits under autocast are scored in fp32); and the
    two `kl_div`s alone."""
    is_target = labels != -100
    logits = F.linear(hidden, weight)
    first, second = logits.to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(-1).chunk(2)
    cross_entropies = sum(
        F.cross_entropy(half[is_target], labels[is_target], label_smoothing=label_smoothing, reduction="sum")
        for half in (first, second)
    )
    both_ways = F.kl_div(second, first, log_target=True, reduction="none") + F.kl_div(
        first, second, log_target=True, reduction="none"
    )
    divergence = both_ways.sum(-1)[is_target].sum()
    return cross_entropies + alpha / 2 * divergence, divergence


@pytest.mark.parametrize("chunk_bytes", [loss.CPU_LOGITS_CHUNK_BYTES, 1000])
@pytest.mark.parametrize(("label_smoothing", "alpha"), [(0.0, 0.0), (0.1, 0.0), (0.0, 5.0), (0.1, 5.0)])
def test_rdrop_loss_is_two_cross_entropies_and_two_kl_divergences_in_value_and_gradients(
    monkeypatch, chunk_bytes, label_smoothing, alpha
):
    """One chunk, and chunks of a few tokens each: the closed-form loss and its gradients equal autograd's of torch's
    cross-entropies and `kl_div`s of the full logits (in fp64), on the target tokens only, and so does the divergence
    returned for the logs, whatever alpha; alpha 0 leaves the two cross-entropies, and equal halves add no
    divergence."""
    monkeypatch.setattr(loss, "CPU_LOGITS_CHUNK_BYTES", chunk_bytes)
    hidden = (3 * torch.randn(6, 5, 16)).requires_grad_()
    weight = torch.randn(37, 16, requires_grad=True)
    labels = torch.randint(0, 37, (3, 5))
    labels[1, 3:] = labels[2, 0] = -100
    exact = [tensor.detach().double().requires_grad_() for tensor in (hidden, weight)]
    expected, expected_divergence = rdrop_reference(*exact, labels, label_smoothing, alpha)
    expected_gradients = torch.autograd.grad(3 * expected, exact)
    chunked, divergence = rdrop_loss(hidden, weight, labels, label_smoothing, alpha)
    torch.testing.assert_close(chunked.double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(divergence.double(), expected_divergence.detach(), rtol=1e-5, atol=1e-5)
    assert not divergence.requires_grad and divergence > 0
    gradients = torch.autograd.grad(3 * chunked, (hidden, weight))
    for gradient, expected_gradient in zip(gradients, expected_gradients, strict=True):
        # fp32 rounding of log-probabilities of logits in the tens; torch's fp32 autograd is as far from fp64
        torch.testing.assert_close(gradient.double(), expected_gradient, rtol=3e-4, atol=3e-4)
    with torch.no_grad():
        same = torch.cat([hidden[:3], hidden[:3]])
        with_divergence, without = (rdrop_loss(same, weight, labels, label_smoothing, a) for a in (alpha, 0.0))
        torch.testing.assert_close(with_divergence.loss, without.loss)
        torch.testing.assert_close(with_divergence.divergence, torch.tensor(0.0), atol=1e-5, rtol=0)


def test_rdrop_loss_under_bf16_autocast_projects_in_bf16_and_scores_in_fp32():
    hidden, weight = torch.randn(6, 5, 16, requires_grad=True), torch.randn(37, 16, requires_grad=True)
    labels = torch.randint(0, 37, (3, 5))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected, _ = rdrop_reference(hidden, weight, labels, 0.1, 5.0)
        chunked = rdrop_loss(hidden, weight, labels, 0.1, 5.0).loss
    # the same bf16 logits, summed in another order (per token, then over the chunks)
    torch.testing.assert_close(chunked, expected, rtol=1e-5, atol=1e-5)
    chunked.backward()
    assert hidden.grad.dtype == weight.grad.dtype == torch.float32


@torch.no_grad()
def test_rdrop_adds_alpha_times_the_divergence_of_two_dropout_masks_to_the_plain_loss():
    """Without dropout both copies of a pair agree: R-Drop's loss is the plain loss, whatever alpha. With dropout,
    the same masks (the same seed) give a loss growing linearly with alpha, by alpha / 4 times the positive
    divergence per target token that the training step logs (train/rdrop_divergence)."""
    torch.manual_seed(0)
    batch = padded_batch()
    without_dropout = {**TINY_CONFIG, "dropout": 0.0, "vocab_size": 64}
    plain = TranslationModule(config=without_dropout).train()
    rdrop = RDropTranslationModule(config=without_dropout, alpha=5.0).train()
    rdrop.load_state_dict(plain.state_dict())
    assert float(rdrop.training_loss(batch)) == pytest.approx(float(plain.training_loss(batch)), rel=1e-5)
    module = RDropTranslationModule(config={**TINY_CONFIG, "dropout": 0.3, "vocab_size": 64}).train()
    target_tokens = (batch["labels"] != -100).sum()
    losses, divergences = {}, {}
    for alpha in (1.0, 3.0, 5.0):
        module.alpha = alpha
        torch.manual_seed(1)
        losses[alpha] = float(module.training_loss(batch))
        divergences[alpha] = float(module.divergence / target_tokens)  # as the training step logs it
    assert divergences[1.0] == divergences[3.0] == divergences[5.0] > 0
    assert losses[5.0] - losses[1.0] == pytest.approx(divergences[1.0], rel=1e-4)
    assert losses[3.0] - losses[1.0] == pytest.approx(divergences[1.0] / 2, rel=1e-4)


def test_the_training_loss_compiles_into_one_graph():
    """As the training module calls it: dropout on, padded source, -100 labels (padding and one ignored label)."""
    module = tiny_module().train()
    explanation = torch._dynamo.explain(module.training_loss)(padded_batch())
    assert explanation.graph_break_count == 0, [reason.reason for reason in explanation.break_reasons]
    assert explanation.graph_count == 1


def test_twenty_real_batches_of_varying_shapes_share_one_compiled_graph():
    """Token-budget batches of the synthetic task: their row counts and lengths differ from batch to batch, and the
    compiled training step is traced once for all of them, or twice when the first batch's source and target happen
    to be equally long (torch's "duck sizing" then assumes they stay equal). Counted by a custom backend."""
    data = TranslationDataModule(synthetic_train_size=2000, synthetic_eval_size=16, max_tokens=384)
    data.setup()
    module = tiny_module(len(data.tokenizer)).train()
    compilations = []

    def counting_backend(graph: torch.fx.GraphModule, example_inputs: list) -> callable:
        compilations.append(graph)
        return graph.forward

    module.compile_training_loss(backend=counting_backend)
    shapes = set()
    for _, batch in zip(range(20), data.train_dataloader(), strict=False):
        shapes.add((*batch["input_ids"].shape, batch["labels"].shape[1]))
        module.training_loss(batch).backward()
    assert len(shapes) >= 5, shapes
    assert len(compilations) <= 2


@pytest.mark.parametrize("module_class", [TranslationModule, RDropTranslationModule])
def test_compiled_training_loss_equals_eager_in_loss_and_gradients(module_class):
    """Compiled with inductor, which keeps every target position (no data-dependent shapes): the same loss and
    gradients as the eager step, which computes only up to each row's last target token; with R-Drop too: its doubled
    batch and closed-form divergence compile, and give the eager values (without dropout the divergence is 0)."""
    module = tiny_module(module=module_class).eval()  # no dropout, whose random stream differs under compilation
    batch = padded_batch()

    def loss_and_gradients() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        module.zero_grad()
        loss = module.training_loss(batch)
        loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in module.named_parameters()}

    eager_loss, eager_gradients = loss_and_gradients()
    module.compile_training_loss()
    compiled_loss, compiled_gradients = loss_and_gradients()
    torch.testing.assert_close(compiled_loss, eager_loss)
    for name, gradient in eager_gradients.items():
        torch.testing.assert_close(compiled_gradients[name], gradient, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_adam_is_fused_on_gpus_and_multi_tensor_elsewhere(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("fused Adam is chosen on a CUDA GPU")
    module = tiny_module().to(device)
    module.trainer = pl.Trainer(accelerator="gpu" if device == "cuda" else "cpu", devices=1, logger=False)
    optimizer = module.configure_optimizers()["optimizer"]
    assert (bool(optimizer.defaults["fused"]), bool(optimizer.defaults["foreach"])) == (
        device == "cuda",
        device != "cuda",
    )


@pytest.mark.parametrize("gradient_clip_val", [None, 0.0, 1.0])
@pytest.mark.parametrize("precision_plugin", [Precision(), MixedPrecision("bf16-mixed", "cpu")], ids=["32", "bf16"])
def test_adam_is_fused_only_where_lightning_clips_a_fused_optimizer(precision_plugin, gradient_clip_val):
    """Lightning's mixed-precision plugin raises when it clips a fused optimizer's gradients (this stopped a bf16 run
    on a GPU at its first step): Adam is fused exactly where clipping a fused AdamW (on the CPU here) goes through."""
    parameter = nn.Parameter(torch.ones(3))
    parameter.grad = torch.full((3,), 2.0)
    try:
        precision_plugin.clip_gradients(torch.optim.AdamW([parameter], fused=True), gradient_clip_val or 0.0)
        clipped = True
    except RuntimeError:
        clipped = False
    assert fused_adam_allowed(precision_plugin, gradient_clip_val) == clipped


@pytest.mark.parametrize("gradient_clip_algorithm", [None, GradClipAlgorithmType.NORM, GradClipAlgorithmType.VALUE])
@pytest.mark.parametrize("gradient_clip_val", [None, 0.0, 1.0])
@pytest.mark.parametrize("strategy", [FSDPStrategy(), DDPStrategy()], ids=["fsdp", "ddp"])
def test_clipping_goes_through_fsdp_exactly_where_lightning_refuses_it(
    strategy, gradient_clip_val, gradient_clip_algorithm
):
    """Lightning's FSDP plugin raises when asked to clip by norm (the FSDP config with the default clipping would stop
    at its first step): the module clips through FSDP's root module exactly where Lightning's own clipping, with the
    strategy's plugin, raises. The algorithm is what the Trainer passes: None where `gradient_clip_algorithm` is unset.
    FSDP's root module itself runs only on GPUs (Lightning refuses FSDP on a CPU)."""
    parameter = nn.Parameter(torch.ones(3))
    parameter.grad = torch.full((3,), 2.0)
    precision_plugin = FSDPPrecision("32-true") if isinstance(strategy, FSDPStrategy) else Precision()
    try:
        precision_plugin.clip_gradients(
            torch.optim.AdamW([parameter]),
            gradient_clip_val or 0.0,
            gradient_clip_algorithm or GradClipAlgorithmType.NORM,
        )
        refused = False
    except MisconfigurationException:
        refused = True
    assert clips_norm_through_fsdp(strategy, gradient_clip_val, gradient_clip_algorithm) == refused


@pytest.mark.parametrize("peak", [None, 3e-3])
def test_learning_rate_of_each_update_is_the_schedules_formula(peak):
    """Update k (from 1) runs at the paper's d_model^-0.5 * min(k^-0.5, k * warmup^-1.5) (peak_lr None), or at
    peak_lr * min(k / warmup, sqrt(warmup / k)): the peak exactly at update `warmup`."""
    warmup = 10
    module = tiny_module(schedule=InverseSquareRoot(peak, warmup))
    optimization = module.configure_optimizers()
    optimizer, scheduler = optimization["optimizer"], optimization["lr_scheduler"]["scheduler"]
    learning_rates = {}
    for update in range(1, 4 * warmup + 1):
        learning_rates[update] = optimizer.param_groups[0]["lr"]
        optimizer.step()  # no gradients: the parameters stay, the schedule advances as in training
        scheduler.step()

    def formula(k: int) -> float:
        if peak is None:
            return TINY_CONFIG["d_model"] ** -0.5 * min(k**-0.5, k * warmup**-1.5)
        return peak * min(k / warmup, math.sqrt(warmup / k))

    for update in (1, 2, warmup - 1, warmup, warmup + 1, 2 * warmup, 4 * warmup):
        assert learning_rates[update] == pytest.approx(formula(update), rel=1e-12), update
    assert max(learning_rates, key=learning_rates.get) == warmup


def test_cooldown_decays_the_schedule_linearly_to_zero_at_max_steps():
    """With the experimental cool-down, the inverse square root holds until `cooldown_steps` before trainer.max_steps,
    then the rate falls on a straight line whose next point, after the last update, is 0; a cool-down that would
    overlap the warm-up is refused, naming both settings."""
    warmup, cooldown, max_steps, peak = 10, 20, 50, 3e-3
    module = tiny_module(schedule=InverseSquareRootWithCooldown(cooldown, peak, warmup))
    module.trainer = pl.Trainer(max_steps=max_steps, logger=False, enable_checkpointing=False)
    optimization = module.configure_optimizers()
    optimizer, scheduler = optimization["optimizer"], optimization["lr_scheduler"]["scheduler"]
    learning_rates = []
    for _ in range(max_steps):
        learning_rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    start = max_steps - cooldown
    inverse_sqrt = [peak * min(k / warmup, math.sqrt(warmup / k)) for k in range(1, start + 2)]
    assert learning_rates[: start + 1] == pytest.approx(inverse_sqrt, rel=1e-12)  # updates 1 to start + 1
    decay = torch.tensor(learning_rates[start:], dtype=torch.float64)
    steps = torch.diff(decay)
    assert torch.allclose(steps, steps[0].expand_as(steps), rtol=1e-9)  # then a straight line...
    assert decay[-1].item() == pytest.approx(-steps[0].item(), rel=1e-9)  # ...to 0 one update after the last

    module.trainer = pl.Trainer(max_steps=warmup + cooldown - 1, logger=False, enable_checkpointing=False)
    with pytest.raises(ConfigError, match=r"model.schedule.cooldown_steps=20 needs trainer.max_steps \(29\) of at"):
        module.configure_optimizers()


def test_throughput_reads_nothing_from_the_device_between_the_steps_that_log(monkeypatch):
    """The counts stay on the device: no tensor is read to the host (nor the GPU synchronized) until a step logs."""
    from lightning_modules.callbacks import throughput as callbacks

    monkeypatch.setattr(callbacks, "get_available_flops", lambda device, dtype: 1e12)  # so MFU is counted too
    logged = {}
    module = SimpleNamespace(model=tiny_module().model, device=torch.device("cpu"), log_dict=logged.update)
    trainer = SimpleNamespace(precision="bf16-mixed")
    throughput = callbacks.TranslationThroughput(log_every_n_steps=3)
    reads = []
    for name in ("item", "tolist", "__int__", "__float__", "__bool__", "__index__"):
        read = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor, name, lambda self, *args, _read=read, _name=name: reads.append(_name) or _read(self, *args)
        )
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: reads.append("synchronize"))
    batch = padded_batch()
    throughput.on_train_start(trainer, module)
    for batch_idx in range(2):
        throughput.on_train_batch_end(trainer, module, None, batch, batch_idx)
    assert reads == [] and logged == {}
    throughput.on_train_batch_end(trainer, module, None, batch, 2)
    assert reads and "synchronize" not in reads
    assert set(logged) == {
        f"throughput/{name}" for name in ("target_tokens_per_sec", "tokens_per_sec", "padding_efficiency", "mfu")
    }


class HostReads(TorchDispatchMode):
    """The operations that make the host wait for the device's values: scalar reads (`.item()`, `bool(tensor)`,
    `.tolist()` all call `_local_scalar_dense`), each with the Python stack that asked, and `nonzero` and
    boolean-mask indexing, whose output size the host must learn from the device."""

    def __init__(self):
        super().__init__()
        self.scalar_reads: list[list[str]] = []
        self.nonzeros = self.boolean_indexings = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.scalar_reads.append([f"{frame.filename}:{frame.lineno}" for frame in traceback.extract_stack()])
        elif func.overloadpacket is torch.ops.aten.nonzero:
            self.nonzeros += 1
        elif func is torch.ops.aten.index.Tensor and any(i is not None and i.dtype == torch.bool for i in args[1]):
            self.boolean_indexings += 1
        return func(*args, **(kwargs or {}))


def test_the_eager_training_step_reads_nothing_from_the_device_but_the_padding_removal():
    """One `training_step` and its backward on a padded batch of the data module: the ids were checked by its
    collate, and the loss ignores padding by its label, so nothing is read to the host but the two `nonzero`s that
    pack the encoder's and the decoder's tokens (`PackedMask`). Excluded, by name: transformers' mask helpers, whose
    test for a batch without padding reads the mask (once for the encoder's and once for the cross-attention's mask,
    twice for the decoder's causal one), and the model's token-id checks, which read on a CPU only (on a GPU they
    step aside in training: the next test). Without a trainer, Lightning's `self.log` in the step logs nothing."""
    data = TranslationDataModule(synthetic_train_size=200, synthetic_eval_size=16, max_tokens=384)
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    assert (batch["attention_mask"] == 0).any() and (batch["labels"] == -100).any()  # the masks and packing work
    module = tiny_module(len(data.tokenizer)).train()
    with HostReads() as reads:
        module.training_step(batch, 0).backward()
    excluded = ("transformers/masking_utils.py", "hf_transformer/model/integrity.py")
    ours = [stack for stack in reads.scalar_reads if not any(name in f for f in stack for name in excluded)]
    assert ours == [], "\n\n".join("\n".join(f for f in stack if "/torch/" not in f) for stack in ours)
    assert (reads.nonzeros, reads.boolean_indexings) == (2, 0)


def test_token_ids_are_checked_in_training_only_where_it_costs_no_device_wait():
    """In training, `check_token_ids` reads the ids only on a CPU; on any other device (the meta device stands in for
    a GPU here: it holds no values, so a read would fail) it leaves them to the data pipeline. In eval mode it checks
    everywhere."""
    on_device = torch.full((2, 3), 99, device="meta")
    check_token_ids(on_device, vocab_size=10, training=True)  # returns without reading
    with pytest.raises((RuntimeError, NotImplementedError)):
        check_token_ids(on_device, vocab_size=10)  # eval mode reads: impossible on the meta device
    with pytest.raises(ValueError, match=r"Token ids \[99\] are outside the vocabulary \[0, 10\)"):
        check_token_ids(torch.full((2, 3), 99), vocab_size=10, training=True)


def test_the_collate_refuses_ids_outside_the_vocabulary():
    """Where the training step's ids are checked, on the CPU, with the message a direct call of the model gives."""
    collate = TranslationCollator(pad_token_id=0, max_source_positions=8, max_target_positions=8, vocab_size=10)
    rows = [{"input_ids": [3, 4, 2], "labels": [5, 2]}, {"input_ids": [3, 2], "labels": [6, 7, 2]}]
    assert collate(rows)["labels"].shape == (2, 3)
    with pytest.raises(ValueError, match=r"Token ids \[12\] are outside the vocabulary \[0, 10\)"):
        collate([{"input_ids": [3, 12, 2], "labels": [5, 2]}])
    with pytest.raises(ValueError, match=r"Token ids \[-3\] are outside the vocabulary \[0, 10\)"):
        collate([{"input_ids": [3, 2], "labels": [-3, 2]}])

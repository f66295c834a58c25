"""Train a tiny `TranslationModule` for a few steps on fixed batches, each rank on its share of every batch (in
`--accumulate` micro-batches), and save the weights. `tests/test_distributed.py` runs it as one process, as two DDP
processes (`--devices 2`), as two single-process "nodes" started by `torchrun` and as one process accumulating
micro-batches, and compares the weights; on GPUs also with the strategy of configs/trainer/fsdp.yaml (`--strategy
fsdp`), which Lightning runs on GPUs only.

    python tests/ddp_train.py OUT.pt [--devices N] [--num-nodes N] [--accumulate N] [--accelerator cpu|gpu]
        [--strategy ddp|fsdp] [--gradient-clip-val V] [--rdrop-alpha A]

A script rather than a test: `strategy="ddp"` starts the other ranks by re-running `sys.argv`, which inside pytest
would re-run the whole test session.
"""

import argparse
from pathlib import Path

import lightning.pytorch as pl
import torch
import yaml
from conftest import tiny_module
from jsonargparse import ArgumentParser
from lightning.pytorch.strategies import Strategy
from torch.utils.data import DataLoader, Dataset

from lightning_modules.experimental import RDropTranslationModule
from lightning_modules.module import TranslationModule
from lightning_modules.schedules import InverseSquareRoot

SEED = 0
STEPS = 4
ROWS_PER_BATCH = 8  # divisible by every world size times micro-batches the tests use
VOCAB_SIZE = 32
PAD, BOS, EOS = 0, 1, 2
MAX_SOURCE_LENGTH = 9
TARGET_LENGTH = 6
FSDP_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "trainer" / "fsdp.yaml"


def ddp_module(rdrop_alpha: float = 0.0) -> TranslationModule:
    """Dropout 0 so that every process computes the same function; label smoothing as in the paper. With
    `rdrop_alpha`, the experimental R-Drop module."""
    vocabulary = dict(vocab_size=VOCAB_SIZE, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)
    rdrop = dict(module=RDropTranslationModule, alpha=rdrop_alpha) if rdrop_alpha else {}
    return tiny_module(
        config=dict(dropout=0.0, max_position_embeddings=32, decoder_start_token_id=BOS, **vocabulary),
        schedule=InverseSquareRoot(peak_lr=1e-3, warmup_steps=2),
        # The key projection's bias has a true gradient of zero (softmax ignores a shift shared by all keys), so its
        # gradient is rounding noise (~1e-9) that differs between one and two processes. Adam with the paper's eps
        # of 1e-9 would turn that noise into full +-lr steps; with 1e-5 it moves weights by < 1e-6 in all.
        eps=1e-5,
        **rdrop,
    )


def global_batches(count: int = STEPS, rows: int = ROWS_PER_BATCH, seed: int = SEED) -> list[dict[str, torch.Tensor]]:
    """Fixed random batches. Sources and targets have different lengths (padding is masked, and ignored in the loss),
    so the shares of a batch hold different numbers of target tokens: the step's loss is per token of the whole step
    only if each share weighs by its tokens."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        lengths = torch.randint(3, MAX_SOURCE_LENGTH + 1, (rows,), generator=generator)
        positions = torch.arange(MAX_SOURCE_LENGTH)
        attention_mask = (positions < lengths[:, None]).long()
        input_ids = torch.randint(EOS + 1, VOCAB_SIZE, (rows, MAX_SOURCE_LENGTH), generator=generator)
        input_ids = input_ids.masked_fill(attention_mask == 0, PAD)
        target_lengths = torch.randint(2, TARGET_LENGTH + 1, (rows,), generator=generator)
        labels = torch.randint(EOS + 1, VOCAB_SIZE, (rows, TARGET_LENGTH), generator=generator)
        labels[torch.arange(rows), target_lengths - 1] = EOS
        labels = labels.masked_fill(torch.arange(TARGET_LENGTH) >= target_lengths[:, None], -100)
        batches.append({"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels})
    return batches


class RankShare(Dataset):
    """Item i * micro_batches + m is micro-batch m of this rank's contiguous share of global batch i: the rows of
    global batch i split into world_size * micro_batches equal parts, rank-major."""

    def __init__(self, batches: list[dict[str, torch.Tensor]], rank: int, world_size: int, micro_batches: int):
        self.batches, self.rank, self.world_size, self.micro_batches = batches, rank, world_size, micro_batches

    def __len__(self) -> int:
        return len(self.batches) * self.micro_batches

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        step, micro = divmod(index, self.micro_batches)
        batch = self.batches[step]
        part = len(batch["labels"]) // (self.world_size * self.micro_batches)
        start = (self.rank * self.micro_batches + micro) * part
        return {name: tensor[start : start + part] for name, tensor in batch.items()}


class SharedBatches(pl.LightningDataModule):
    """Every rank builds the same global batches and keeps its share; the rank is only known once the trainer has
    set up the processes, so the loader is built in `train_dataloader`."""

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        dataset = RankShare(global_batches(), trainer.global_rank, trainer.world_size, trainer.accumulate_grad_batches)
        return DataLoader(dataset, batch_size=None, shuffle=False)  # items are already batches


class RecordSources(pl.Callback):
    """Keeps the source rows every rank trained on, gathered from all ranks at the end of training as a tensor of
    shape [world size, micro-batches, rows per micro-batch, source length]: the test checks the ranks got disjoint
    halves."""

    def __init__(self) -> None:
        self.rows: list[torch.Tensor] = []
        self.gathered: torch.Tensor | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.rows.append(batch["input_ids"].clone())

    def on_train_end(self, trainer, pl_module) -> None:
        gathered = pl_module.all_gather(torch.stack(self.rows))
        self.gathered = gathered if trainer.world_size > 1 else gathered[None]


def state(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().cpu().clone() for name, tensor in state_dict.items()}


def fsdp_strategy() -> Strategy:
    """configs/trainer/fsdp.yaml's strategy, built by jsonargparse as LightningCLI builds it."""
    parser = ArgumentParser()
    parser.add_subclass_arguments(Strategy, "strategy")
    config = yaml.safe_load(FSDP_CONFIG.read_text())["trainer"]["strategy"]
    # instantiate_classes, as LightningCLI 2.6 calls it (jsonargparse 4.49 deprecated it for `instantiate`; the
    # project allows jsonargparse from 4.39)
    return parser.instantiate_classes(parser.parse_object({"strategy": config})).strategy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="where rank 0 saves the initial and trained weights (torch.save)")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per step (accumulate_grad_batches)")
    parser.add_argument("--accelerator", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--strategy", choices=["ddp", "fsdp"], default="ddp", help="ddp: with more than one process")
    parser.add_argument("--gradient-clip-val", type=float, default=None, help="clip the gradients' norm to this")
    parser.add_argument("--rdrop-alpha", type=float, default=0.0, help="R-Drop's weight (0: no R-Drop)")
    args = parser.parse_args()

    # One thread per process: the same summation order in every run, and no oversubscribed CPU cores.
    torch.set_num_threads(1)
    pl.seed_everything(SEED, verbose=False)
    module = ddp_module(args.rdrop_alpha)
    initial = state(module.state_dict())
    distributed = args.devices * args.num_nodes > 1
    strategy = fsdp_strategy() if args.strategy == "fsdp" else "ddp" if distributed else "auto"  # DDP on CPUs: gloo
    sources = RecordSources()
    trainer = pl.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy=strategy,
        max_steps=STEPS,
        accumulate_grad_batches=args.accumulate,
        gradient_clip_val=args.gradient_clip_val,
        use_distributed_sampler=False,  # the data module shards itself
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[sources],
    )
    trainer.fit(module, datamodule=SharedBatches())
    trained = state(trainer.strategy.lightning_module_state_dict())  # FSDP gathers the shards: every rank calls it
    if trainer.is_global_zero:
        result = {
            "world_size": trainer.world_size,
            "steps": trainer.global_step,
            "sources": sources.gathered,
            "initial": initial,
            "trained": trained,
        }
        torch.save(result, args.out)
    if torch.distributed.is_initialized():
        # Leave together: a rank that exits while another still uses the process group aborts in gloo's threads.
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

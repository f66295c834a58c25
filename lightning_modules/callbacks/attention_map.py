"""`AttentionMap`: the attention of one fixed validation sentence after every validation, to watch alignment form."""

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_warn

from hf_transformer.decoding.attention_maps import attention_maps, figure_class, plot_attention
from hf_transformer.errors import MissingExtra


class AttentionMap(pl.Callback):
    """After each validation (not the sanity check), translates one fixed sentence (`sentence`, or the first source
    of the first validation batch) and draws the encoder-decoder attention of `layer` (the last by default) averaged
    over its heads: an image `val/attention` in W&B when a W&B logger is present, otherwise a PNG
    `attention/step{step}.png` in the run's log folder. Needs matplotlib (`pip install 'hf-transformer[plot]'`);
    without it the callback warns once and draws nothing, and training goes on."""

    def __init__(self, sentence: str | None = None, layer: int = -1) -> None:
        super().__init__()
        self.sentence, self.layer = sentence, layer
        self._enabled = True

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        try:
            figure_class()
        except MissingExtra as err:
            rank_zero_warn(f"AttentionMap draws nothing: {err}")
            self._enabled = False

    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.sentence is None and batch.get("source_text"):
            self.sentence = batch["source_text"][0]

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero or not self._enabled or not self.sentence:
            return
        model = pl_module.model
        training = model.training
        model.eval()
        try:
            (maps,) = attention_maps(model, pl_module.tokenizer, [self.sentence])
        finally:
            model.train(training)
        figure = plot_attention(maps, layer=self.layer)
        step = trainer.global_step
        wandb_loggers = [logger for logger in trainer.loggers if isinstance(logger, WandbLogger)]
        for logger in wandb_loggers:
            logger.log_image(
                "val/attention", [_pixels(figure)], step=step, caption=[f"{maps.source} -> {maps.translation}"]
            )
        if not wandb_loggers:
            folder = Path(trainer.log_dir or trainer.default_root_dir) / "attention"
            folder.mkdir(parents=True, exist_ok=True)
            figure.savefig(folder / f"step{step:06d}.png", dpi=120)


def _pixels(figure) -> np.ndarray:
    """The figure as an RGBA array, drawn without pyplot (no window, no global backend)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())

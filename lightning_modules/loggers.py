"""`AutoWandbLogger`: Lightning's W&B logger, online with credentials and offline without."""

import contextlib
import importlib.util
import netrc
import os
import sys
from collections.abc import Iterator
from urllib.parse import urlparse

from lightning.pytorch.loggers import WandbLogger

from hf_transformer.errors import ConfigError


def wandb_credentials_found() -> bool:
    """True when W&B can log in without asking: an API key in the environment or in ~/.netrc (`wandb login`)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


class AutoWandbLogger(WandbLogger):
    """Lightning's `WandbLogger`, online when W&B credentials are found and offline otherwise (the run is written to
    `<save_dir>/wandb/offline-run-*`; upload it later with `wandb sync`). `offline` forces either."""

    def __init__(
        self,
        project: str | None = "hf-transformer",
        name: str | None = None,
        save_dir: str = ".",
        id: str | None = None,
        offline: bool | None = None,
        log_model: bool = False,
        tags: list[str] | None = None,
        group: str | None = None,
    ):
        if importlib.util.find_spec("wandb") is None:
            raise ConfigError(
                "the config asks for W&B logging (AutoWandbLogger, e.g. configs/trainer/wandb.yaml) but wandb is not "
                'installed: pip install "hf-transformer[wandb]" (or pip install wandb), or drop that logger'
            )
        if offline is None:
            # "dryrun" is W&B's older spelling of offline, still accepted by wandb 0.31.
            offline = os.environ.get("WANDB_MODE") in ("offline", "dryrun") or not wandb_credentials_found()
        super().__init__(
            project=project,
            name=name,
            save_dir=save_dir,
            id=id,
            offline=offline,
            log_model=log_model and not offline,
            tags=tags,
            group=group,
        )
        # The choice, readable before the run starts (`experiment.offline` would start it).
        self.offline, self.log_model = offline, log_model and not offline


@contextlib.contextmanager
def wandb_runs_end_with_the_command() -> Iterator[None]:
    """End the W&B run that a command started when the command ends, as the end of its process would. Lightning leaves
    it open, and its `WandbLogger` logs into an open run: a second command in the same Python process (a notebook, a
    sweep script) would otherwise write into the first one's run. A run that was open before is left alone."""
    wandb = sys.modules.get("wandb")
    open_before = wandb.run if wandb is not None else None
    failed = True
    try:
        yield
        failed = False
    finally:
        wandb = sys.modules.get("wandb")
        if wandb is not None and wandb.run is not None and wandb.run is not open_before:
            wandb.finish(exit_code=1 if failed else 0)

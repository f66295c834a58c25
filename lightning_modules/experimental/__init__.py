"""Training variants whose experiment did not pay, kept apart from the main path (docs/contributing.md): each is
chosen by class path in YAML, and the main classes know nothing of it. docs/experiments.md holds what each measured.

- `RDropTranslationModule` (`model.class_path`): R-Drop's loss (`rdrop.py`).
- `InverseSquareRootWithCooldown` (`model.schedule`): a linear cool-down to 0 at the end of the run (`cooldown.py`).
- `BPEDropoutDataModule` (`data.class_path`): BPE-dropout on streamed training pairs (`bpe_dropout.py`).
"""

from .bpe_dropout import BPEDropoutDataModule
from .cooldown import InverseSquareRootWithCooldown
from .rdrop import RDropTranslationModule

__all__ = ["BPEDropoutDataModule", "InverseSquareRootWithCooldown", "RDropTranslationModule"]

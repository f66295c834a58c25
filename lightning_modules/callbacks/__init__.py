"""The callbacks of a training run: exact resume and checkpoints that belong to one run (`resume`), throughput and MFU
(`throughput`), progress lines (`progress`), the attention map at each validation (`attention_map`) and pushes to the
Hugging Face Hub (`push_to_hub`). Configs name them as `lightning_modules.callbacks.<Class>`."""

from .attention_map import AttentionMap
from .progress import LineProgress
from .push_to_hub import PushToHubCallback
from .resume import ExactResume, ResumableCheckpoint
from .throughput import TranslationThroughput

__all__ = [
    "AttentionMap",
    "ExactResume",
    "LineProgress",
    "PushToHubCallback",
    "ResumableCheckpoint",
    "TranslationThroughput",
]

"""`python -m lightning_modules.cli ...` runs `hf-transformer ...` (torchrun starts commands this way)."""

from . import main

main()

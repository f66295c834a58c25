"""The `--help` of `hf-transformer fit/validate/test`, kept as text beside this file so that it prints at once.

Lightning's parser lists every option of the Trainer, the model and the data, and building it imports Lightning and
torch: several seconds, for a text that changes only with this package and Lightning. `hf-transformer COMMAND --help`
prints the kept text; `python -m lightning_modules.cli.help` writes it again from the parser (a test checks that the
kept text is the parser's)."""

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

FOLDER = Path(__file__).with_name("help")
# Where the kept text names this folder's parent (the defaults' files), which is wherever the package is installed.
HERE = str(Path(__file__).parent)
PLACEHOLDER = "<lightning_modules/cli>"
COLUMNS = 80  # a terminal's default, and what fits the column of the documentation site
# The libraries whose options (the Trainer's, the loggers') and wording the help prints: another release of one of them
# prints another text.
HELP_LIBRARIES = ("lightning", "jsonargparse")


def kept_help(command: str) -> str | None:
    """The kept `--help` of a trainer command, naming this installation's files; None where none is kept."""
    path = FOLDER / f"{command}.txt"
    return path.read_text(encoding="utf-8").replace(PLACEHOLDER, HERE) if path.is_file() else None


def parser_help(command: str) -> str:
    """What the parser prints for `hf-transformer COMMAND --help`, `COLUMNS` wide, in a fresh interpreter (the
    trainer commands' help lists the callback classes that are imported, so it depends on what a process imported)."""
    if command in ("fit", "validate", "test"):
        code = "from lightning_modules.cli.training import TranslationCLI\n"
        code += f"TranslationCLI(args=[{command!r}, '--help'])"
    else:
        argv = ["--help"] if command == "hf-transformer" else [command, "--help"]
        code = f"from lightning_modules.cli import main; main({argv!r})"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": str(COLUMNS)},
        check=True,
    )
    return result.stdout.rstrip() + "\n"


def parser_versions() -> dict[str, str]:
    """The releases of the libraries whose options and wording the trainer commands' help prints."""
    return {name: importlib.metadata.version(name) for name in HELP_LIBRARIES}


def kept_versions() -> dict[str, str] | None:
    """The releases `parser_versions` gave when the kept help was written; None where they were not recorded."""
    path = FOLDER / "versions.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def write_kept_help() -> None:
    """Write the kept `--help` of fit, validate and test from the parser, with the releases it was written under."""
    FOLDER.mkdir(exist_ok=True)
    for command in ("fit", "validate", "test"):
        (FOLDER / f"{command}.txt").write_text(parser_help(command).replace(HERE, PLACEHOLDER), encoding="utf-8")
    (FOLDER / "versions.json").write_text(json.dumps(parser_versions(), indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write_kept_help()

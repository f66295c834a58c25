"""`hf-transformer`: LightningCLI's fit/validate/test plus `export`, `push`, `translate`, `attention` and `serve`.

hf-transformer fit --config configs/demo.yaml
hf-transformer test --config configs/demo.yaml --ckpt_path runs/demo/checkpoints/last.ckpt
hf-transformer export runs/demo/checkpoints/last.ckpt exports/demo [--average 5]
hf-transformer translate exports/demo input.txt -o output.txt

Lightning, torch and transformers are imported only by the command that needs them, so that every `--help` answers
at once (that of fit, validate and test is kept as text, `help.py`).
"""

import gc
import importlib
import os
import sys

USAGE = """\
usage: hf-transformer COMMAND [OPTIONS]

Train the Transformer of "Attention Is All You Need", evaluate it, share it on the Hugging Face Hub, and use it.

commands:
  fit        train a model:                hf-transformer fit --config configs/demo.yaml
  validate   loss and BLEU on the validation split of a checkpoint
  test       loss, BLEU and chrF on the test split, with the hypotheses written to a file
  export     write a Hugging Face model folder from a checkpoint (or several, averaged)
  push       upload a checkpoint or an exported folder to the Hugging Face Hub
  translate  translate files or standard input, one sentence per line, with a model or checkpoint
  attention  draw the attention weights of a translation as heatmaps, tokens on the axes
  serve      a web page to try a model and a JSON API (POST /translate) on 127.0.0.1
  shortlist  learn which target tokens each source token may translate to, for faster translate and serve

`hf-transformer COMMAND --help` lists a command's options. Errors print one message; add --traceback (or set
HF_TRANSFORMER_TRACEBACK=1) to see where one came from."""

TRAINER_COMMANDS = ("fit", "validate", "test")
# The module of each other command, imported only when it runs, so that `--help` answers without loading torch.
COMMANDS = {
    "export": ".export",
    "push": ".push",
    "translate": ".translate",
    "attention": ".attention",
    "serve": ".serve",
    "shortlist": ".shortlist",
}
# Commands that are gone, and what does their work now.
REPLACED = {
    "predict": "`hf-transformer test` writes the test split's translations to a file, and `hf-transformer translate "
    "MODEL FILE` translates any file"
}


def run(argv: list[str]) -> None:
    """Run one `hf-transformer` command line (without the program name); errors propagate."""
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    command, *rest = argv
    if command in TRAINER_COMMANDS and rest in (["--help"], ["-h"]):
        from .help import kept_help  # Lightning's parser takes seconds to build; its text is kept

        text = kept_help(command)
        if text is not None:
            print(text, end="")
            raise SystemExit(0)  # as the parser's --help does
    if command in COMMANDS:
        importlib.import_module(COMMANDS[command], __name__).main(rest)
    elif command in TRAINER_COMMANDS or command.startswith("-"):
        from ..loggers import wandb_runs_end_with_the_command
        from .training import TranslationCLI

        from_the_command_line = argv == sys.argv[1:]
        program_arguments = sys.argv
        try:
            # LightningCLI reads sys.argv itself when given None, and warns when given words while sys.argv holds
            # others: those of a notebook's kernel or of pytest, which are not this command's. (The command line less
            # --traceback stays in sys.argv: DDP's launcher starts the other processes with it.)
            if not from_the_command_line and argv != [word for word in sys.argv[1:] if word != "--traceback"]:
                sys.argv = sys.argv[:1]
            with wandb_runs_end_with_the_command():
                TranslationCLI(args=None if from_the_command_line else argv)
        finally:
            sys.argv = program_arguments
    else:
        from hf_transformer.errors import UserError

        if command in REPLACED:
            raise UserError(f"there is no {command} command: {REPLACED[command]}")
        known = ", ".join([*TRAINER_COMMANDS, *COMMANDS])
        raise UserError(f"unknown command {command!r}: choose one of {known}")


def main(argv: list[str] | None = None) -> None:
    """Entry point of `hf-transformer`; `argv` replaces the command line (for calls from Python). A `UserError`
    prints its message alone and exits with status 1; --traceback shows the traceback too."""
    words = sys.argv[1:] if argv is None else argv
    show_traceback = "--traceback" in words or os.environ.get("HF_TRANSFORMER_TRACEBACK", "") not in ("", "0")
    words = [word for word in words if word != "--traceback"]
    try:
        run(words)
        sys.stdout.flush()  # here, where a closed pipe can still be handled, not at exit
        if argv is None:  # the process's own command, which ends here (not a call from a notebook or a test)
            # Python's exit collects the objects of torch, transformers and Lightning module by module, over and
            # over: a second or more of CPU for a short command. Nothing the command leaves needs collecting.
            gc.freeze()
    except BrokenPipeError:
        # The reader of standard output is gone (`| head`): stop quietly, as a Unix filter does. Python's signal docs:
        # point standard output at devnull so that the flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None
    except Exception as err:
        # Imported here: a command that raises a UserError has loaded the package already, and --help never does.
        from hf_transformer.errors import UserError

        if show_traceback or not isinstance(err, UserError):
            raise
        command = f"hf-transformer {words[0]}" if words else "hf-transformer"
        print(f"{command}: error: {err}", file=sys.stderr)
        raise SystemExit(1) from None

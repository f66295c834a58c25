"""`hf-transformer shortlist FOLDER --source FILE --target FILE`: learn a lexical shortlist (`hf_transformer.decoding.
shortlist`) from parallel text, the model's training data, and save it into the exported FOLDER, where `translate` and
`serve` use it (`--no-shortlist` turns it off)."""

import argparse
import statistics
from itertools import islice
from pathlib import Path

from hf_transformer.errors import DataError, UserError

from .arguments import positive_int

# Pairs read by default: a lexical table learnt from half a million pairs holds the translations that matter, and the
# token ids of more take memory for little gain.
DEFAULT_MAX_PAIRS = 500_000


def main(argv: list[str]) -> None:
    """`hf-transformer shortlist FOLDER --source FILE --target FILE [...]`."""
    args = _parser().parse_args(argv)
    folder = Path(args.folder)
    if not (folder / "config.json").is_file():
        raise UserError(
            f"{folder} is no exported model folder (no config.json): export the checkpoint first "
            "(`hf-transformer export CHECKPOINT FOLDER`), then build its shortlist"
        )
    sources, targets = read_lines(Path(args.source), args.max_pairs), read_lines(Path(args.target), args.max_pairs)
    if len(sources) != len(targets):
        cut = f" (read up to --max-pairs {args.max_pairs:,})" if args.max_pairs in (len(sources), len(targets)) else ""
        raise DataError(
            f"{args.source} has {len(sources):,} lines and {args.target} {len(targets):,}{cut}: a shortlist is "
            "learnt from parallel text, line i of --target translating line i of --source"
        )
    # Imported once the arguments are checked: they load torch and transformers.
    from transformers import AutoConfig, PreTrainedTokenizerFast

    from hf_transformer.decoding.shortlist import build_shortlist
    from hf_transformer.model_folder import check_tokenizer_files

    check_tokenizer_files(folder)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    config = AutoConfig.from_pretrained(folder)
    source_ids = tokenizer(sources, add_special_tokens=False).input_ids
    target_ids = tokenizer(targets, add_special_tokens=False).input_ids
    shortlist = build_shortlist(
        list(zip(source_ids, target_ids, strict=True)),
        config.vocab_size,
        per_source=args.per_source,
        frequent=args.frequent,
        always=[config.eos_token_id],
    )
    path = shortlist.save_pretrained(folder)
    sample = source_ids[:1000]
    sizes = [len(shortlist.listed(ids)) for ids in sample]
    print(
        f"Learnt from {len(sources):,} pairs: {args.per_source} translations per source token and "
        f"{len(shortlist.always)} tokens always listed; a sentence's list holds {statistics.median(sizes):.0f} of the "
        f"{config.vocab_size:,} tokens (median of the first {len(sizes):,} sources)"
    )
    print(f"Saved to {path}")


def read_lines(path: Path, limit: int) -> list[str]:
    """The first `limit` lines of a UTF-8 text file (gzipped where it ends in .gz), read as training reads its text
    files (`text_lines`: lines end at "\n" only, so that line i of each file stays a pair), without their line ends."""
    if not path.is_file():
        raise UserError(f"{path}: no such file (--source and --target are text files, one sentence per line)")
    from lightning_modules.data.sources import text_lines  # loads datasets: once the arguments are checked

    return list(islice(text_lines(path), limit))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-transformer shortlist",
        description="Learn a lexical shortlist from parallel text (the model's training data: the target tokens each "
        "source token may translate to, IBM Model 1) and save it into an exported model folder, where translate and "
        "serve score each sentence's listed tokens only.",
    )
    parser.add_argument("folder", metavar="FOLDER", help="a model folder written by `hf-transformer export`")
    parser.add_argument("--source", required=True, metavar="FILE", help="source sentences, one per line (.gz too)")
    parser.add_argument("--target", required=True, metavar="FILE", help="their translations, line by line")
    parser.add_argument(
        "--max-pairs",
        type=positive_int,
        default=DEFAULT_MAX_PAIRS,
        metavar="N",
        help=f"learn from the first N pairs (default {DEFAULT_MAX_PAIRS:,})",
    )
    parser.add_argument(
        "--per-source",
        type=positive_int,
        default=50,
        metavar="K",
        help="translations kept per source token (default 50)",
    )
    parser.add_argument(
        "--frequent",
        type=positive_int,
        default=100,
        metavar="N",
        help="the most frequent target tokens, in every sentence's list (default 100)",
    )
    return parser

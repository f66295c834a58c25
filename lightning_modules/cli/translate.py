"""`hf-transformer translate MODEL [MODEL ...] [FILE ...]`: translate files or standard input line by line, as
fairseq-interactive, onmt_translate and marian-decoder do, with `translate()`: with one model, or with several as an
ensemble (the folders and .ckpt files before the first FILE)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from hf_transformer.errors import DataError, UserError

from .arguments import add_model_arguments, load_engines

if TYPE_CHECKING:  # torch and the model are imported where used, so that `--help` answers at once
    from hf_transformer.decoding.engine import TranslationEngine
    from hf_transformer.decoding.search import Translation

# Lines translated together: enough for full token-budget batches, few enough for regular progress lines.
CHUNK_LINES = 1000


def main(argv: list[str]) -> None:
    """`hf-transformer translate MODEL [MODEL ...] [FILE ...] [...]`."""
    args = _parser().parse_args(argv)
    more_models, files = split_models(args.files)
    sources = [Path(name) for name in files]
    for source in sources:
        if source.is_dir():
            raise UserError(
                f"{source} is a folder, after the text file {files[0]}: the models of an ensemble come first "
                "(MODEL [MODEL ...] [FILE ...])"
            )
        if not source.is_file():
            raise UserError(
                f"{source}: no such file (FILE arguments are text files, one sentence per line; the models of an "
                "ensemble before them are folders or .ckpt files)"
            )
    line_count = sum(_count_lines(source) for source in sources)  # a file not in UTF-8 stops here, before any work
    if args.output:
        _check_output(Path(args.output), [*sources, *([Path(args.reference)] if args.reference else [])])
    with ExitStack() as stack:
        output = stack.enter_context(_output_file(Path(args.output))) if args.output else sys.stdout
        references = _read_references(args.reference) if args.reference else None
        if references is not None and sources:
            _check_references(references, line_count, args.reference)
        engine = load_engines(
            [args.model, *more_models], args.average, args.device, args.ensemble_average, args.int8, args.shortlist
        )
        engine.check_settings(args.num_beams, args.length_penalty, args.n_best)
        if args.alignments:
            engine.require_one_model("alignments")
        hypotheses = translate_lines(engine, sources, output, args)
    if references is not None:
        print_scores(hypotheses, references, args.reference, args.target_lang or reference_language(args.reference))


def split_models(names: list[str]) -> tuple[list[str], list[str]]:
    """The models that lead `names`, the arguments after MODEL (folders, and .ckpt files), and the text files after
    them: a text file is neither, so the first one ends the models."""
    count = 0
    while count < len(names) and (Path(names[count]).is_dir() or names[count].endswith(".ckpt")):
        count += 1
    return names[:count], names[count:]


def reference_language(path: str) -> str:
    """The language of a reference file named as corpora name theirs (`test_2016_flickr.de`, `newstest2014.de`): its
    extension where the Moses tokenizer knows that language, else English, tokenizer.perl's default."""
    from sacremoses.corpus import NonbreakingPrefixes

    extension = Path(path).suffix.lstrip(".").lower()
    return extension if extension in NonbreakingPrefixes().available_langs.values() else "en"


def _check_output(output: Path, inputs: list[Path]) -> None:
    """Refuse an output that is a folder, or one of the files read (which the translations would replace)."""
    if output.is_dir():
        raise UserError(f"-o {output} is a folder: give the path of a file to write the translations to")
    for path in inputs:
        if output.exists() and path.exists() and os.path.samefile(output, path):
            raise UserError(
                f"-o {output} is {path}, an input of this run: the translations would replace it. Write them to "
                "another file"
            )


@contextmanager
def _output_file(path: Path) -> Iterator[TextIO]:
    """The file to write the translations into: a temporary file beside `path` that takes its place when the block
    ends without an error, so that a run that fails or is killed leaves an earlier `path` as it was. A device or a pipe
    (/dev/null) is written directly."""
    from hf_transformer.model_folder import umask_mode

    target = Path(os.path.realpath(path))  # through a symbolic link, as open() writes
    try:
        if target.is_file() or not target.exists():
            descriptor, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        else:
            descriptor, temporary = os.open(target, os.O_WRONLY | os.O_TRUNC), None
    except OSError as err:
        raise UserError(
            f"-o {path}: cannot write there ({err.strerror}). Give a file in an existing folder you can write to"
        ) from err
    try:
        with open(descriptor, "w", encoding="utf-8") as file:
            yield file
        if temporary:
            if target.exists():
                shutil.copymode(target, temporary)  # the permissions of the file replaced
            else:
                os.chmod(temporary, umask_mode())  # not mkstemp's -rw-------
            os.replace(temporary, target)
    finally:
        if temporary:
            Path(temporary).unlink(missing_ok=True)


def translate_lines(
    engine: TranslationEngine, sources: list[Path], output: TextIO, args: argparse.Namespace
) -> list[str]:
    """Translate every line of `sources` (standard input when empty) in order, writing each chunk as it is done;
    returns the best translation of each line."""
    from hf_transformer.decoding.search import DECODING_MAX_TOKENS, SourceTruncatedWarning, truncation_message

    interactive = not sources and sys.stdin.isatty()
    total = sum(_count_lines(source) for source in sources)
    best, done, started = [], 0, time.perf_counter()
    for chunk in _chunks(sources, 1 if interactive else CHUNK_LINES):
        names = [f"line {number} of {name}" for name, number, _ in chunk]
        lines = [line for _, _, line in chunk]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", SourceTruncatedWarning)
            translations = engine.translate(
                lines,
                num_beams=args.num_beams,
                length_penalty=args.length_penalty,
                max_tokens=DECODING_MAX_TOKENS if args.max_tokens is None else args.max_tokens,
                num_return_sequences=args.n_best,
            )
        for warning in caught:
            if isinstance(warning.message, SourceTruncatedWarning):
                cut = [names[index] for index in warning.message.indices]
                message = truncation_message(cut, len(lines), warning.message.max_length)
                print(f"hf-transformer translate: warning: {message}", file=sys.stderr)
        alignments = _alignments(engine, lines, translations) if args.alignments else None
        for offset, hypotheses in enumerate(translations):
            for rank, hypothesis in enumerate(hypotheses):
                fields = [hypothesis.text]
                if args.n_best > 1:
                    fields = [str(done + offset), hypothesis.text, f"{hypothesis.score:.4f}"]
                if alignments is not None and lines[offset].strip():
                    fields.append(alignments[offset][rank])
                output.write(" ||| ".join(fields) + "\n")
        output.flush()
        best += [hypotheses[0].text for hypotheses in translations]
        done += len(chunk)
        if sources:
            rate = done / (time.perf_counter() - started)
            print(f"translated {done:,}/{total:,} lines, {rate:,.1f} sentences/s", file=sys.stderr, flush=True)
    return best


def print_scores(hypotheses: list[str], references: list[str], path: str, target_lang: str) -> None:
    """Every score of `hypotheses` against `references`, each labelled with how it was computed, on stderr."""
    from hf_transformer.scoring import format_scores, translation_scores

    _check_references(references, len(hypotheses), path)
    print(format_scores(translation_scores(hypotheses, references, target_lang)), file=sys.stderr)


def _check_references(references: list[str], lines: int, path: str) -> None:
    if len(references) != lines:
        raise UserError(
            f"--reference {path} has {len(references)} lines for {lines} translated lines: pass the reference of the "
            "same text, one line per source line"
        )


def _alignments(engine: TranslationEngine, lines: list[str], translations: list[list[Translation]]) -> list[list[str]]:
    """The alignment of every hypothesis of every non-empty line, fairseq's format."""
    from hf_transformer.decoding.attention_maps import alignment, format_alignment

    todo = [
        (index, rank) for index, line in enumerate(lines) if line.strip() for rank in range(len(translations[index]))
    ]
    maps = engine.attention(
        [lines[index] for index, _ in todo], [translations[index][rank].token_ids for index, rank in todo]
    )
    result = [[""] * len(hypotheses) for hypotheses in translations]
    for (index, rank), sentence_maps in zip(todo, maps, strict=True):
        result[index][rank] = format_alignment(alignment(sentence_maps))
    return result


def _chunks(sources: list[Path], size: int) -> Iterator[list[tuple[str, int, str]]]:
    """(file name, line number, line) in chunks of `size` lines, over the files in order or standard input."""
    chunk = []
    for name, number, line in _lines(sources):
        chunk.append((name, number, line))
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _lines(sources: list[Path]) -> Iterator[tuple[str, int, str]]:
    if not sources:
        # The bytes of standard input, decoded here as the files are; a text stream (io.StringIO) as it is.
        yield from _decoded("standard input", getattr(sys.stdin, "buffer", sys.stdin))
        return
    for source in sources:
        with open(source, "rb") as file:
            yield from _decoded(str(source), file)


def _decoded(name: str, lines: Iterable[bytes | str]) -> Iterator[tuple[str, int, str]]:
    """(name, line number, line) for each of `lines`, decoded from UTF-8 line by line (to name the line that is not)
    and without its line end."""
    for number, line in enumerate(lines, 1):
        if isinstance(line, bytes):
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(
                    f"line {number} of {name} is not UTF-8 text (byte {err.start + 1} is 0x{line[err.start]:02x}): "
                    "translate reads plain UTF-8 text, one sentence per line. Convert it first (iconv -f latin1 -t "
                    "utf-8 for Latin-1 text, gunzip for a .gz file)"
                ) from None
        yield name, number, line.rstrip("\r\n")


def _count_lines(source: Path) -> int:
    return sum(1 for _ in _lines([source]))


def _read_references(path: str) -> list[str]:
    try:
        return Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise UserError(f"--reference {path}: cannot be read ({err.strerror})") from err


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-transformer translate",
        usage="%(prog)s [options] MODEL [MODEL ...] [FILE ...]",
        description="Translate text files, or standard input, one sentence per line: one output line per input line, "
        "in order (empty lines stay empty), with beam search as `hf_transformer.translate()` does it. A sentence "
        "longer than the model's positions is cut to them, with a warning naming its line. Several models (sharing one "
        "tokenizer) translate as an ensemble: at each step of the search their next-token distributions are averaged.",
        allow_abbrev=False,
    )
    add_model_arguments(
        parser,
        ensembles="More models after it (folders or .ckpt files, before the FILEs; a Hub model: download it first) "
        "translate with it as an ensemble",
    )
    parser.add_argument("files", nargs="*", metavar="FILE", help="text files to translate (default: standard input)")
    parser.add_argument("-o", "--output", help="write the translations here (default: standard output)")
    parser.add_argument(
        "--num-beams", "--beam-size", type=int, help="beams of the beam search; 1 is greedy (default: the model's, 4)"
    )
    parser.add_argument("--length-penalty", type=float, help="alpha of the length penalty (default: the model's, 0.6)")
    parser.add_argument(
        "--n-best",
        type=int,
        default=1,
        metavar="K",
        help="write the K best translations of each line, best first, as 'LINE ||| TRANSLATION ||| SCORE' (LINE "
        "counts from 0; SCORE: summed log-probabilities / length ** length penalty)",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        # None: translate()'s own budget, hf_transformer.decoding.DECODING_MAX_TOKENS (its module loads torch, which
        # --help does not)
        default=None,
        help="token budget of a batch: source tokens x beams (default: translate()'s, DECODING_MAX_TOKENS of "
        "hf_transformer.decoding)",
    )
    parser.add_argument(
        "--reference",
        metavar="FILE",
        help="the reference translations, one per line: print sacreBLEU (with its signature), lowercased sacreBLEU, "
        "chrF and the tokenized BLEU of papers on standard error",
    )
    parser.add_argument(
        "--target-lang",
        metavar="LANG",
        help="the references' language, for the Moses tokenization of the tokenized BLEU (de adds the compound-split "
        "BLEU of WMT14 en-de papers; default: the reference file's extension where it names a language, as in "
        "test_2016_flickr.de, else en)",
    )
    parser.add_argument(
        "--alignments",
        action="store_true",
        help="append ' ||| ' and the hard alignment read from the encoder-decoder attention (last layer, mean of the "
        "heads) as fairseq's --print-alignment writes it: source-target token index pairs, '0-0 1-2 2-1'",
    )
    return parser

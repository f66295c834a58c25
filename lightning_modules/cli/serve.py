"""`hf-transformer serve MODEL [MODEL ...]`: a web page to try a model (or an ensemble) and a JSON API, on 127.0.0.1
unless told otherwise."""

import argparse
import warnings

from hf_transformer.errors import MissingExtra

from .arguments import add_model_arguments, load_engines, positive_int, whole_number


def main(argv: list[str]) -> None:
    """`hf-transformer serve MODEL [MODEL ...] [--host H] [--port P] [...]`."""
    args = _parser().parse_args(argv)
    try:
        from hf_transformer.serving import serve
    except ImportError as err:
        if isinstance(err, MissingExtra):
            raise
        raise MissingExtra(f"serving needs FastAPI and uvicorn: pip install 'hf-transformer[serve]' ({err})") from err
    from hf_transformer.decoding.search import SourceTruncatedWarning

    engine = load_engines(
        [args.model, *args.more_models], args.average, args.device, args.ensemble_average, args.int8, args.shortlist
    )
    # The server answers a cut sentence with a warning of its own (and logs it): not a second one per batch.
    warnings.filterwarnings("ignore", category=SourceTruncatedWarning)
    name = f"{engine.name} (int8)" if engine.int8 else engine.name
    print(f"Serving {name} on http://{args.host}:{args.port}/ (API: /translate, /docs)", flush=True)
    serve(engine, host=args.host, port=args.port, max_sentences=args.max_sentences)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-transformer serve",
        usage="%(prog)s [options] MODEL [MODEL ...]",
        description='Serve a model, or several as an ensemble: a page to try it at /, POST /translate with {"text": '
        '["...", ...]} answering {"translations": [...]}, POST /attention (one model only), GET /health, and the '
        "OpenAPI description at /openapi.json (/docs shows it). Requests that arrive together are translated in one "
        "batch. Needs pip install 'hf-transformer[serve]'.",
        allow_abbrev=False,
    )
    add_model_arguments(parser, ensembles="More MODELs after it are served with it as an ensemble")
    parser.add_argument("more_models", nargs="*", metavar="MODEL", help=argparse.SUPPRESS)
    parser.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default: 127.0.0.1, this machine only)"
    )
    parser.add_argument("--port", type=_port, default=8000, help="the port, 0 to 65535 (default: 8000)")
    parser.add_argument(
        "--max-sentences", type=positive_int, default=64, help="the most sentences one request may hold (default: 64)"
    )
    return parser


def _port(text: str) -> int:
    number = whole_number(text)
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"ports are 0 to 65535, got {number}: choose one in that range, e.g. 8000")
    return number

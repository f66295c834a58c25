"""`hf-transformer attention MODEL SENTENCE -o map.png`: the attention weights of a translation as heatmaps."""

import argparse
from pathlib import Path

from hf_transformer.errors import UserError

from .arguments import add_model_arguments, load_engines


def main(argv: list[str]) -> None:
    """`hf-transformer attention MODEL SENTENCE [-o map.png] [...]`."""
    args = _parser().parse_args(argv)
    # Imported once --help has answered: they load torch.
    from hf_transformer.decoding.attention_maps import alignment, format_alignment, plot_attention, plot_attention_heads

    output = Path(args.output)
    _check_image_type(output)
    engine = load_engines([args.model], args.average, args.device, int8=args.int8, shortlist=False)
    engine.require_one_model("attention weights")
    engine.check_settings(args.num_beams)
    config = engine.model.config
    layers = config.encoder_layers if args.kind == "encoder" else config.decoder_layers
    if not -layers <= args.layer < layers:
        raise UserError(f"--layer {args.layer}: the model has {layers} layers, 0 to {layers - 1} (-1 is the last)")
    (maps,) = engine.attention([args.sentence], num_beams=args.num_beams)
    figure = plot_attention_heads(maps, args.kind) if args.heads else plot_attention(maps, args.kind, args.layer)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(output, dpi=args.dpi)
    except OSError as err:
        raise UserError(f"-o {output}: cannot write there ({err.strerror}). Give a path you can write to") from err
    print(f"translation: {maps.translation}")
    # The alignment is the encoder-decoder attention's: of the drawn layer, or the last (fairseq's) for the others.
    print(f"alignment:   {format_alignment(alignment(maps, args.layer if args.kind == 'cross' else -1))}")
    print(f"Wrote {output}")


def _check_image_type(output: Path) -> None:
    """Refuse, before the model loads, an image type that matplotlib has no writer for (it says so only when saving)."""
    from hf_transformer.decoding.attention_maps import figure_class

    types = figure_class()().canvas.get_supported_filetypes()
    if output.suffix and output.suffix[1:].lower() not in types:
        raise UserError(
            f"-o {output}: matplotlib writes no {output.suffix} images. End the name with one of "
            f"{', '.join('.' + name for name in sorted(types))}"
        )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-transformer attention",
        description="Translate one sentence and draw the attention weights of the translation, computed teacher-forced "
        "over the output: by default the encoder-decoder attention of the last layer averaged over its heads, source "
        "tokens across and target tokens down. Prints the translation and its hard alignment. Needs matplotlib: pip "
        "install 'hf-transformer[plot]'.",
        allow_abbrev=False,
    )
    add_model_arguments(parser, shortlist=False)
    parser.add_argument("sentence", help="the sentence to translate")
    parser.add_argument("-o", "--output", default="attention.png", help="the image to write (default: attention.png)")
    parser.add_argument(
        "--kind",
        choices=["cross", "encoder", "decoder"],
        default="cross",
        help="cross: the encoder-decoder attention (target x source); encoder: the encoder's self-attention; decoder: "
        "the decoder's masked self-attention",
    )
    parser.add_argument("--layer", type=int, default=-1, help="the layer to draw, from 0 (default: -1, the last)")
    parser.add_argument("--heads", action="store_true", help="draw every layer and head in a grid instead")
    parser.add_argument("--num-beams", type=int, help="beams of the beam search (default: the model's)")
    parser.add_argument("--dpi", type=int, default=150, help="resolution of the image (default: 150)")
    return parser

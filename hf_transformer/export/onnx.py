"""Convert a trained model into ONNX programs that ONNX Runtime runs, through transformers' own exporter.

transformers' `OnnxExporter` traces a real `generate()` with `torch.export` and converts each program with torch's
own ONNX exporter: the decoder's first step (`prefill`) and its later steps (`decode`), plus the encoder, which
`generate()` runs before them. A static key/value cache of `max_length` positions holds the decoder's keys and values,
so the programs have fixed shapes where the cache is concerned: the tree of the cache records the batch size and the
source length (transformers 5.24), and the programs take batches of exactly the traced `batch_size` sources padded
to `source_length` tokens (shorter sources are padded, with attention_mask 0 on the padding).

The folder is what `transformers.exporters.ExportedModel.from_pretrained` loads (`export.json` names each program and
the inputs it was traced with), with the model config, its generation config and the tokenizer.

Needs the optional `onnx` extra: `pip install 'hf-transformer[onnx]'` (onnx, onnxscript, onnxruntime).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase

from ..model import TransformerForConditionalGeneration

try:
    import onnxruntime  # noqa: F401  (the runtime that runs the programs; checked here, not at first use)
    import onnxscript  # noqa: F401
except ImportError as err:
    raise ImportError(
        "The ONNX export needs the onnx extra: pip install 'hf-transformer[onnx]' (onnx, onnxscript, onnxruntime)."
    ) from err
try:
    from transformers.exporters import ExportedModel, OnnxConfig, OnnxExporter
except ImportError as err:  # a transformers before 5.23, or exporters that need a newer torch
    raise ImportError(
        f"The ONNX export needs transformers' exporters at the transformers and torch releases the onnx extra asks "
        f"for ({err}): pip install -U 'hf-transformer[onnx]'"
    ) from err

__all__ = ["to_onnx"]

# The programs, in the order generate() runs them: the encoder, the decoder's first step, its later steps.
PROGRAMS = ("encoder", "prefill", "decode")


def to_onnx(
    model: TransformerForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    folder: str | Path,
    *,
    batch_size: int = 1,
    source_length: int | None = None,
    max_length: int | None = None,
) -> Path:
    """Write ONNX programs of `model` (encoder, prefill, decode) into `folder`, with the configs and the tokenizer.
    They take `batch_size` sources of `source_length` tokens (default: the model's number of positions) and decode at
    most `max_length` tokens counting the start token (default: the same). Raises ValueError for lengths the model
    cannot take."""
    positions = model.config.max_position_embeddings
    source_length = positions if source_length is None else source_length
    max_length = positions if max_length is None else max_length
    for name, value in (("source_length", source_length), ("max_length", max_length)):
        if not 2 <= value <= positions:
            raise ValueError(f"{name}={value}: the model takes 2 to {positions} tokens (max_position_embeddings)")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: must be at least 1")
    model = model.eval()
    # Greedy search (the programs hold no beam search) over the static cache, whose size the programs take. A config
    # of its own: one marked as derived from the model config (`_from_model_config`, as the model's is) is replaced
    # by the model's own when generate() gets it unchanged after loading, and with it the static cache.
    settings = {
        name: value for name, value in model.generation_config.to_diff_dict().items() if name != "_from_model_config"
    }
    settings.update(
        num_beams=1, length_penalty=1.0, cache_implementation="static", max_cache_len=max_length, max_length=max_length
    )
    generation_config = GenerationConfig(**settings)
    sample = sample_sources(model, batch_size, source_length)
    exporter, config = OnnxExporter(), OnnxConfig(dynamic=True)
    with torch.no_grad():
        decoder = exporter.export_for_generation(model, sample, config, generation_config=generation_config)
        encoder = exporter.export(model.get_encoder(), sample, config)
    components = {"encoder": encoder.components["model"], **decoder.components}
    exported = ExportedModel(
        {name: components[name] for name in PROGRAMS},
        decoder.export_format,
        config=model.config,
        generation_config=generation_config,
    )
    folder = Path(folder)
    exported.save_pretrained(folder)
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.model_max_length = source_length  # the programs' source length: the tokenizer cuts to it
    tokenizer.save_pretrained(folder)
    return folder


def sample_sources(
    model: TransformerForConditionalGeneration, batch_size: int, source_length: int
) -> dict[str, torch.Tensor]:
    """Sources to trace with: ordinary token ids ending with </s>, right-padded to `source_length` (rows of different
    lengths, so that the traced programs are those of a padded batch)."""
    config = model.config
    generator = torch.Generator().manual_seed(0)
    special_ids = (config.pad_token_id, config.eos_token_id, config.bos_token_id, config.decoder_start_token_id)
    special = max(token_id for token_id in special_ids if token_id is not None)
    ids = torch.randint(special + 1, config.vocab_size, (batch_size, source_length), generator=generator)
    lengths = torch.linspace(source_length, 2, batch_size).long() if batch_size > 1 else torch.tensor([source_length])
    positions = torch.arange(source_length)
    ids[torch.arange(batch_size), lengths - 1] = config.eos_token_id
    attention_mask = (positions < lengths[:, None]).long()
    input_ids = ids.masked_fill(attention_mask == 0, config.pad_token_id)
    return {"input_ids": input_ids.to(model.device), "attention_mask": attention_mask.to(model.device)}

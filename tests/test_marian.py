"""`to_marian`: the exported stock MarianMTModel computes the same logits and decodes the same tokens as our model; and
`export_model`, the registry's entry point, refuses a format or option it does not know."""

import dataclasses
import json

import pytest
import torch
from conftest import (
    copy_task_batch,
    equal_fraction,
    output_rows,
    parts_only_at_near_ties,
    trained_model,
    word_tokenizer,
)
from transformers import AutoModelForSeq2SeqLM, GenerationConfig, MarianMTModel
from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

from hf_transformer import TransformerForConditionalGeneration
from hf_transformer.errors import UserError
from hf_transformer.export import FORMATS, export_model
from hf_transformer.export.marian import marian_permutation, to_marian
from hf_transformer.model.modeling_transformer import SinusoidalPositionalEncoding

# Each case changes the tiny config so that a mix-up would show: encoder and decoder of different depths and FFN widths
# (a swapped stack or fc1/fc2 fails to load), untied embeddings (three matrices), an odd d_model (one more sine than
# cosines in the positional encoding).
CASES = {
    "tied": {},
    "unequal-stacks-untied": dict(encoder_layers=3, decoder_layers=2, encoder_ffn_dim=48, decoder_ffn_dim=80),
    "odd-d_model": dict(d_model=33, encoder_attention_heads=3, decoder_attention_heads=11),
}
CASES["unequal-stacks-untied"]["tie_word_embeddings"] = False


def export_and_reload(model: TransformerForConditionalGeneration, folder) -> MarianMTModel:
    """Save `to_marian(model)` and load it back with the stock class, no remote code."""
    to_marian(model).save_pretrained(folder)
    return MarianMTModel.from_pretrained(folder).eval()


@pytest.mark.parametrize("case", CASES)
def test_stock_marian_matches_ours(case, tiny_config, tmp_path):
    config = dataclasses.replace(tiny_config, **CASES[case])
    ours = trained_model(config)
    marian = export_and_reload(ours, tmp_path / "marian")

    source, attention_mask, _ = copy_task_batch(6, config.vocab_size, torch.Generator().manual_seed(1))
    assert (attention_mask == 0).any(dim=1).sum() >= 2, "the batch should pad some rows"
    decoder_input_ids = torch.randint(3, config.vocab_size, (6, 7), generator=torch.Generator().manual_seed(2))
    decoder_input_ids[:, 0] = config.decoder_start_token_id
    with torch.no_grad():
        expected = ours(input_ids=source, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
        actual = marian(input_ids=source, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)

    # Marian sums the permuted model dimension in another order: greedy outputs may part only at near ties.
    greedy = ours.generate(source, attention_mask=attention_mask, num_beams=1)
    assert greedy.unique().numel() >= 8, f"outputs too uniform to tell anything: {greedy.tolist()}"
    assert (greedy[:, -1] == config.pad_token_id).any(), "some rows should end with </s> before the others"
    their_greedy = marian.generate(source, attention_mask=attention_mask, num_beams=1)
    sources = [row[mask.bool()].tolist() for row, mask in zip(source, attention_mask, strict=True)]
    eos = config.eos_token_id
    for row, our_output, their_output in zip(
        sources, output_rows(greedy, eos), output_rows(their_greedy, eos), strict=True
    ):
        assert parts_only_at_near_ties(ours, row, our_output, their_output), (row, our_output, their_output)

    # Beam 4 and length penalty 0.6 from the saved generation_config.json; beam search ranks hypotheses by their
    # scores at every step, so a near tie may reorder them: all but one row agree.
    assert (marian.generation_config.num_beams, marian.generation_config.length_penalty) == (4, 0.6)
    beams = output_rows(ours.generate(source, attention_mask=attention_mask), eos)
    assert equal_fraction(output_rows(marian.generate(source, attention_mask=attention_mask), eos), beams) >= 5 / 6

    # Rows cut before </s>: Marian's default forced_eos_token_id (0, our <pad>) would replace their last token.
    cut = ours.generate(source, attention_mask=attention_mask, max_new_tokens=3, num_beams=1)
    assert (cut[:, -1] != config.eos_token_id).any()
    their_cut = marian.generate(source, attention_mask=attention_mask, max_new_tokens=3, num_beams=1)
    for row, our_output, their_output in zip(sources, output_rows(cut, eos), output_rows(their_cut, eos), strict=True):
        assert parts_only_at_near_ties(ours, row, our_output, their_output), (row, our_output, their_output)


def test_export_is_a_stock_marian_folder(tiny_config, tmp_path):
    ours = TransformerForConditionalGeneration(tiny_config).eval()
    to_marian(ours).save_pretrained(tmp_path)
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "marian" and "auto_map" not in saved
    assert saved["forced_eos_token_id"] is None
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert type(loaded) is MarianMTModel
    # Without generation_config.json, Marian derives one from config.json: it must not force a token either.
    assert GenerationConfig.from_model_config(loaded.config).forced_eos_token_id is None
    generation = loaded.generation_config
    assert (generation.max_length, generation.forced_eos_token_id, generation.bad_words_ids) == (64, None, None)
    assert (generation.decoder_start_token_id, generation.eos_token_id, generation.pad_token_id) == (1, 2, 0)


def test_converts_half_precision_to_fp32(tiny_config):
    ours = TransformerForConditionalGeneration(tiny_config)
    from_fp32 = to_marian(ours)
    from_bf16 = to_marian(ours.to(torch.bfloat16))
    assert {parameter.dtype for parameter in from_bf16.parameters()} == {torch.float32}
    weight = from_bf16.model.shared.weight
    torch.testing.assert_close(weight, from_fp32.model.shared.weight.to(torch.bfloat16).float(), atol=0, rtol=0)


@pytest.mark.parametrize("d_model", [32, 33, 512])
def test_permutation_maps_our_sinusoids_onto_marians(d_model):
    """The assumption the conversion rests on: our interleaved encodings, permuted, are Marian's (up to our
    table's float32 rounding; Marian computes its own in float64)."""
    ours = SinusoidalPositionalEncoding.sinusoids(64, d_model)[:, marian_permutation(d_model)]
    marian = MarianSinusoidalPositionalEmbedding(64, d_model).create_weight()
    torch.testing.assert_close(ours, marian, atol=1e-5, rtol=0)


def test_pre_ln_cannot_be_exported(tiny_config):
    model = TransformerForConditionalGeneration(dataclasses.replace(tiny_config, normalize_before=True))
    with pytest.raises(ValueError, match=r"pre-LN.*post-LN only.*trust_remote_code=True"):
        to_marian(model)


def test_a_field_marian_has_no_counterpart_for_is_refused_naming_it_and_its_value(tiny_config):
    """The check allows what Marian expresses: a field it does not know (a later position scheme, say) stops the
    export, named with its value, rather than exporting a model that computes something else."""
    tiny_config.position_scheme = "rotary"
    with pytest.raises(ValueError, match=r"position_scheme='rotary', which MarianMTModel has no counterpart for"):
        to_marian(TransformerForConditionalGeneration(tiny_config))
    no_start = TransformerForConditionalGeneration(dataclasses.replace(tiny_config, decoder_start_token_id=None))
    with pytest.raises(ValueError, match="MarianConfig needs a decoder_start_token_id"):
        to_marian(no_start)


@pytest.mark.parametrize(
    "format, options, message",
    [
        ("mariann", {}, "Unknown export format 'mariann': the formats are " + ", ".join(FORMATS)),
        ("marian", {"quantization": "int8"}, "The marian export does not take quantization: it takes no options"),
        (
            "ctranslate2",
            {"batch_size": 2},
            "The ctranslate2 export does not take batch_size: it takes only quantization",
        ),
    ],
)
def test_export_model_refuses_a_format_or_option_it_does_not_know_naming_those_there_are(
    tiny_config, tmp_path, format, options, message
):
    """The command's choices guard `--format` and its options; the Python API gave a bare KeyError or TypeError."""
    model = TransformerForConditionalGeneration(tiny_config)
    with pytest.raises(UserError) as refused:
        export_model(model, word_tokenizer(tiny_config.vocab_size), tmp_path / "out", format, **options)
    assert str(refused.value).startswith(message)
    assert not (tmp_path / "out").exists()  # refused before anything is written

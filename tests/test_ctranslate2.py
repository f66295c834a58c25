"""`to_ctranslate2`: the CTranslate2 model decodes what our model decodes, and `export --format ctranslate2`.

CTranslate2 computes the same model with its own kernels, in another summation order: where two candidates score
within rounding of each other, either may win. So greedy outputs must be equal except where they part at such a near
tie, and beam search, whose ranking of hypotheses compares scores at every step, must agree on a stated share of the
sentences (95% where the stopping rules are the same)."""

import dataclasses

import pytest
import torch
from conftest import (
    DEMO,
    copy_task_batch,
    equal_fraction,
    make_tiny_config,
    parts_only_at_near_ties,
    trained_model,
    word_tokenizer,
)

from hf_transformer import TransformerForConditionalGeneration, translate
from hf_transformer.decoding.search import beam_search
from hf_transformer.errors import ConfigError
from lightning_modules.checkpoint import load_checkpoint, model_from_checkpoint, tokenizer_from_checkpoint
from lightning_modules.cli import main

pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed: pip install 'hf-transformer[ctranslate2]'")
from hf_transformer.decoding.ctranslate2 import CTranslate2Translator  # noqa: E402
from hf_transformer.export.ctranslate2 import to_ctranslate2  # noqa: E402

MAX_LENGTH_OFFSET = 5  # short enough that some outputs of the copy task run into the limit


@pytest.fixture(scope="module")
def model_and_tokenizer():
    """Trained once for the module (seeded: the same model every run); no test changes it."""
    torch.manual_seed(0)
    config = make_tiny_config()
    return trained_model(config, steps=200), word_tokenizer(config.vocab_size)


@pytest.fixture
def sources():
    source, attention_mask, _ = copy_task_batch(100, 64, torch.Generator().manual_seed(1))
    return source, attention_mask, [row[mask.bool()].tolist() for row, mask in zip(source, attention_mask, strict=True)]


def test_greedy_equals_ours_but_at_near_ties(model_and_tokenizer, sources, tmp_path):
    model, tokenizer = model_and_tokenizer
    source, attention_mask, rows = sources
    translator = CTranslate2Translator(to_ctranslate2(model, tokenizer, tmp_path / "ct2"))
    found = beam_search(model, source, attention_mask, num_beams=1, max_length_offset=MAX_LENGTH_OFFSET)
    ours = [best[0].token_ids for best in found]
    theirs = [
        [model.config.decoder_start_token_id, *row]
        for row in translator.generate(rows, num_beams=1, max_length_offset=MAX_LENGTH_OFFSET)
    ]
    for row, our_output, their_output in zip(rows, ours, theirs, strict=True):
        assert parts_only_at_near_ties(model, row, our_output, their_output), (row, our_output, their_output)
    assert equal_fraction(ours, theirs) >= 0.95
    assert len({tuple(row) for row in theirs}) > 50, "outputs too uniform to tell anything"
    assert sum(row[-1] != tokenizer.eos_token_id for row in theirs) >= 1, "some outputs should reach the limit"

    sentences = [tokenizer.decode(row[:-1]) for row in rows]  # the same sources as text
    assert (
        equal_fraction(translator(sentences, num_beams=1), translate(model, tokenizer, sentences, num_beams=1)) >= 0.95
    )


@pytest.mark.parametrize("length_penalty", [0.6, 1.0, -0.5])
def test_beam_search_agrees_with_generate_with_early_stopping(model_and_tokenizer, sources, tmp_path, length_penalty):
    """CTranslate2's beam search ends a sentence once it has num_beams finished hypotheses: Hugging Face's
    `early_stopping=True`. Outputs agree with `generate()` on each sentence alone with the same output limit."""
    model, tokenizer = model_and_tokenizer
    rows = sources[2][:40]  # generate() one sentence at a time is slow
    translator = CTranslate2Translator(to_ctranslate2(model, tokenizer, tmp_path / "ct2"))
    assert (translator.generation_config.num_beams, translator.generation_config.length_penalty) == (4, 0.6)
    theirs = translator.generate(rows, length_penalty=length_penalty, max_length_offset=MAX_LENGTH_OFFSET)
    expected = []
    for row in rows:
        output = model.generate(
            torch.tensor([row]),
            length_penalty=length_penalty,
            early_stopping=True,
            max_length=len(row) + MAX_LENGTH_OFFSET + 1,
        )[0, 1:].tolist()
        expected.append(output[: output.index(2) + 1 if 2 in output else None])
    assert equal_fraction(theirs, expected) >= 0.95


def test_beam_4_agrees_with_ours_on_the_trained_model(model_and_tokenizer, sources, tmp_path):
    """With the paper's beam 4 and length penalty 0.6, `translate()` follows Hugging Face's default stopping rule,
    which may search a little longer than CTranslate2's: most sentences, not all, come out the same."""
    model, tokenizer = model_and_tokenizer
    source, attention_mask, rows = sources
    translator = CTranslate2Translator(to_ctranslate2(model, tokenizer, tmp_path / "ct2"))
    ours = [
        best[0].token_ids for best in beam_search(model, source, attention_mask, max_length_offset=MAX_LENGTH_OFFSET)
    ]
    theirs = translator.generate(rows, max_length_offset=MAX_LENGTH_OFFSET)
    assert equal_fraction(theirs, [row[1:] for row in ours]) >= 0.9


def log_probability(model: TransformerForConditionalGeneration, source: list[int], output: list[int]) -> float:
    """The summed log-probability of `output` (token ids after the decoder start) given `source` under `model`."""
    with torch.no_grad():
        decoder_input_ids = torch.tensor([[model.config.decoder_start_token_id, *output[:-1]]])
        logits = model(input_ids=torch.tensor([source]), decoder_input_ids=decoder_input_ids).logits
    return float(logits[0].log_softmax(-1).gather(-1, torch.tensor(output)[:, None]).sum())


def test_int8_quantization_translates_nearly_as_the_float32_model(model_and_tokenizer, sources, tmp_path):
    """int8 rounds every weight (CTranslate2's int8 kernels differ from CPU to CPU too): where the model's best two
    tokens are close, the int8 model may take the other one. So most sentences, not all, come out as our greedy
    search's, and the int8 outputs score under our float32 model nearly as well as ours do: a mean of 0.1 nats per
    sentence leaves room for the near ties and none for a weight that went wrong."""
    model, tokenizer = model_and_tokenizer
    source, attention_mask, rows = sources
    float32 = to_ctranslate2(model, tokenizer, tmp_path / "float32")
    int8 = to_ctranslate2(model, tokenizer, tmp_path / "int8", quantization="int8")
    # int8 weights take a quarter of float32's (plus one scale per row).
    assert (int8 / "model.bin").stat().st_size < 0.4 * (float32 / "model.bin").stat().st_size
    found = beam_search(model, source, attention_mask, num_beams=1, max_length_offset=MAX_LENGTH_OFFSET)
    ours = [best[0].token_ids[1:] for best in found]
    theirs = CTranslate2Translator(int8).generate(rows, num_beams=1, max_length_offset=MAX_LENGTH_OFFSET)
    assert equal_fraction(theirs, ours) >= 0.75
    gaps = [
        log_probability(model, row, our_output) - log_probability(model, row, their_output)
        for row, our_output, their_output in zip(rows, ours, theirs, strict=True)
    ]
    assert sum(gaps) / len(gaps) < 0.1, sorted(gaps)[-5:]
    sentences = [tokenizer.decode(row[:-1]) for row in rows]  # the same sources as text, through translate()
    expected = translate(model, tokenizer, sentences, num_beams=1, max_length_offset=MAX_LENGTH_OFFSET)
    translations = CTranslate2Translator(int8)(sentences, num_beams=1, max_length_offset=MAX_LENGTH_OFFSET)
    assert equal_fraction(translations, expected) >= 0.75
    with pytest.raises(ValueError, match="Unknown quantization 'int4'"):
        to_ctranslate2(model, tokenizer, tmp_path / "int4", quantization="int4")


def test_refuses_what_it_cannot_convert(tiny_config, tmp_path):
    pre_ln = TransformerForConditionalGeneration(dataclasses.replace(tiny_config, normalize_before=True))
    with pytest.raises(ValueError, match="pre-LN") as refused:
        to_ctranslate2(pre_ln, word_tokenizer(tiny_config.vocab_size), tmp_path / "pre-ln")
    assert "without --format ctranslate2" in str(refused.value) and "--format marian" not in str(refused.value)
    larger_vocabulary = TransformerForConditionalGeneration(dataclasses.replace(tiny_config, vocab_size=80))
    with pytest.raises(ValueError, match="pass the tokenizer the model was trained with"):
        to_ctranslate2(larger_vocabulary, word_tokenizer(tiny_config.vocab_size), tmp_path / "mismatch")
    tiny_config.position_scheme = "rotary"  # a field that Marian, which the export goes through, cannot express
    with pytest.raises(ValueError, match=r"position_scheme='rotary'"):
        to_ctranslate2(TransformerForConditionalGeneration(tiny_config), word_tokenizer(64), tmp_path / "rotary")


def test_export_command_writes_a_ctranslate2_model_from_a_checkpoint_or_a_folder(run_dir, capsys):
    main(["fit", "--config", str(DEMO), "--config", "tiny.yaml", "--trainer.max_steps=6"])
    checkpoint_path = str(run_dir / "runs/demo/checkpoints/last.ckpt")
    main(["export", checkpoint_path, "exported"])
    main(["export", checkpoint_path, "from-checkpoint", "--format", "ctranslate2"])
    main(["export", "exported", "from-folder-int8", "--format", "ctranslate2", "--quantization", "int8"])

    checkpoint = load_checkpoint(checkpoint_path)
    model, tokenizer = model_from_checkpoint(checkpoint), tokenizer_from_checkpoint(checkpoint)
    sentences = ["4821", "17", "300000"]
    # The same weights through the same engine: the same translations as converting in Python.
    expected = CTranslate2Translator(to_ctranslate2(model, tokenizer, run_dir / "in-python"))(sentences)
    assert CTranslate2Translator(run_dir / "from-checkpoint")(sentences) == expected
    # The folder's weights are the checkpoint's: its int8 model is the one converting the checkpoint's model gives.
    int8 = CTranslate2Translator(to_ctranslate2(model, tokenizer, run_dir / "int8-in-python", quantization="int8"))
    assert CTranslate2Translator(run_dir / "from-folder-int8")(sentences) == int8(sentences)
    assert (run_dir / "from-folder-int8/model.bin").read_bytes() == (run_dir / "int8-in-python/model.bin").read_bytes()

    with pytest.raises(SystemExit):
        main(["export", checkpoint_path, "marian", "--format", "marian", "--quantization", "int8"])
    assert "--quantization applies to --format ctranslate2 only" in capsys.readouterr().err


def test_a_shortlist_goes_along_as_the_vocabulary_map_and_bounds_the_outputs(model_and_tokenizer, sources, tmp_path):
    """Exported with a shortlist, CTranslate2 decodes with it as its vocabulary map (`use_vmap`, where the folder has
    one): each output holds only tokens of its source's list, when each source is its own batch."""
    from hf_transformer.decoding import Shortlist
    from hf_transformer.decoding.engine import TranslationEngine
    from hf_transformer.export import export_folder

    model, tokenizer = model_and_tokenizer
    _, _, rows = sources
    tokens = torch.arange(model.config.vocab_size)
    # Each token translates to the next one; </s> and tokens 3-10 are always listed.
    shortlist = Shortlist(((tokens + 1) % len(tokens))[:, None], torch.tensor([2, *range(3, 11)]))
    folder = to_ctranslate2(model, tokenizer, tmp_path / "ct2", shortlist=shortlist)
    assert (folder / "vmap.txt").is_file()
    translator = CTranslate2Translator(folder)
    assert translator.vocabulary_map
    # CTranslate2 always adds <unk>, <s> and </s> to a vocabulary map's candidates.
    special = {tokenizer.unk_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}
    for row in rows[:20]:
        (output,) = translator.generate([row], num_beams=2)
        assert set(output) <= set(shortlist.listed(row).tolist()) | special
    assert not TranslationEngine.from_pretrained(folder, shortlist=False).ctranslate2.vocabulary_map
    # Converting a folder that holds a shortlist carries it along.
    model.save_pretrained(tmp_path / "ours")
    tokenizer.save_pretrained(tmp_path / "ours")
    shortlist.save_pretrained(tmp_path / "ours")
    converted = export_folder(tmp_path / "ours", tmp_path / "converted", "ctranslate2")
    assert (converted / "vmap.txt").read_text() == (folder / "vmap.txt").read_text()
    with pytest.raises(ConfigError, match="has no vocabulary map"):
        CTranslate2Translator(to_ctranslate2(model, tokenizer, tmp_path / "plain"), vocabulary_map=True)

"""`to_ctranslate2`: the CTranslate2 model decodes the same tokens as our model, and `export --format ctranslate2`."""

import dataclasses
from pathlib import Path

import pytest
import torch
from conftest import copy_task_batch, make_tiny_config, trained_model
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from hf_transformer import TransformerForConditionalGeneration, translate
from hf_transformer.translate import beam_search
from lightning_modules.checkpoint import load_checkpoint, model_from_checkpoint, tokenizer_from_checkpoint
from lightning_modules.cli import main

pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed: pip install 'hf-transformer[ctranslate2]'")
from hf_transformer.ctranslate2 import CTranslate2Translator, to_ctranslate2  # noqa: E402

DEMO = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"
MAX_LENGTH_OFFSET = 5  # short enough that some outputs of the copy task run into the limit


def word_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """One token per id (<pad> 0, <s> 1, </s> 2, <unk> 3, then w4, w5, ...), appending </s>: ids and text convert
    into each other exactly, so the copy task's token sequences can go through text."""
    vocab = {token: index for index, token in enumerate(["<pad>", "<s>", "</s>", "<unk>"])}
    vocab.update({f"w{index}": index for index in range(4, vocab_size)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


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


def test_greedy_equals_ours_token_for_token(model_and_tokenizer, sources, tmp_path):
    model, tokenizer = model_and_tokenizer
    source, attention_mask, rows = sources
    translator = CTranslate2Translator(to_ctranslate2(model, tokenizer, tmp_path / "ct2"))
    ours = beam_search(model, source, attention_mask, num_beams=1, max_length_offset=MAX_LENGTH_OFFSET)
    theirs = translator.generate(rows, num_beams=1, max_length_offset=MAX_LENGTH_OFFSET)
    assert theirs == [hypothesis[1:] for hypothesis in ours]  # ours starts with the decoder start token
    assert len({tuple(row) for row in theirs}) > 50, "outputs too uniform to tell anything"
    assert sum(row[-1] != tokenizer.eos_token_id for row in theirs) >= 1, "some outputs should reach the limit"

    sentences = [tokenizer.decode(row[:-1]) for row in rows]  # the same sources as text
    assert translator(sentences, num_beams=1) == translate(model, tokenizer, sentences, num_beams=1)


@pytest.mark.parametrize("length_penalty", [0.6, 1.0, -0.5])
def test_beam_search_equals_generate_with_early_stopping(model_and_tokenizer, sources, tmp_path, length_penalty):
    """CTranslate2's beam search ends a sentence once it has num_beams finished hypotheses: Hugging Face's
    `early_stopping=True`. Each output equals `generate()` on that sentence alone with the same output limit."""
    model, tokenizer = model_and_tokenizer
    rows = sources[2][:40]  # generate() one sentence at a time is slow
    translator = CTranslate2Translator(to_ctranslate2(model, tokenizer, tmp_path / "ct2"))
    assert (translator.generation_config.num_beams, translator.generation_config.length_penalty) == (4, 0.6)
    theirs = translator.generate(rows, length_penalty=length_penalty, max_length_offset=MAX_LENGTH_OFFSET)
    for row, output in zip(rows, theirs, strict=True):
        expected = model.generate(
            torch.tensor([row]),
            length_penalty=length_penalty,
            early_stopping=True,
            max_length=len(row) + MAX_LENGTH_OFFSET + 1,
        )[0, 1:].tolist()
        assert output == expected[: expected.index(2) + 1 if 2 in expected else None], row


def test_beam_4_equals_ours_on_the_trained_model(model_and_tokenizer, sources, tmp_path):
    """With the paper's beam 4 and length penalty 0.6, `translate()` (Hugging Face's default stopping rule, which
    may search a little longer) and CTranslate2 agree on every sentence of this model."""
    model, tokenizer = model_and_tokenizer
    source, attention_mask, rows = sources
    translator = CTranslate2Translator(to_ctranslate2(model, tokenizer, tmp_path / "ct2"))
    ours = beam_search(model, source, attention_mask, max_length_offset=MAX_LENGTH_OFFSET)
    assert translator.generate(rows, max_length_offset=MAX_LENGTH_OFFSET) == [row[1:] for row in ours]


def test_int8_quantization_passes_through(model_and_tokenizer, sources, tmp_path):
    model, tokenizer = model_and_tokenizer
    float32 = to_ctranslate2(model, tokenizer, tmp_path / "float32")
    int8 = to_ctranslate2(model, tokenizer, tmp_path / "int8", quantization="int8")
    # int8 weights take a quarter of float32's (plus one scale per row).
    assert (int8 / "model.bin").stat().st_size < 0.4 * (float32 / "model.bin").stat().st_size
    outputs = CTranslate2Translator(int8).generate(sources[2][:8], num_beams=1)
    assert all(row and row[-1] in (tokenizer.eos_token_id, *range(4, 64)) for row in outputs)
    with pytest.raises(ValueError, match="Unknown quantization 'int4'"):
        to_ctranslate2(model, tokenizer, tmp_path / "int4", quantization="int4")


def test_refuses_what_it_cannot_convert(tiny_config, tmp_path):
    pre_ln = TransformerForConditionalGeneration(dataclasses.replace(tiny_config, normalize_before=True))
    with pytest.raises(ValueError, match="pre-LN"):
        to_ctranslate2(pre_ln, word_tokenizer(tiny_config.vocab_size), tmp_path / "pre-ln")
    larger_vocabulary = TransformerForConditionalGeneration(dataclasses.replace(tiny_config, vocab_size=80))
    with pytest.raises(ValueError, match="pass the tokenizer the model was trained with"):
        to_ctranslate2(larger_vocabulary, word_tokenizer(tiny_config.vocab_size), tmp_path / "mismatch")


def test_export_command_writes_a_ctranslate2_model_from_a_checkpoint_or_a_folder(run_dir, capsys):
    main(["fit", "--config", str(DEMO), "--config", "tiny.yaml", "--trainer.max_steps=6"])
    checkpoint_path = str(run_dir / "runs/demo/checkpoints/last.ckpt")
    main(["export", checkpoint_path, "exported"])
    main(["export", checkpoint_path, "from-checkpoint", "--format", "ctranslate2"])
    main(["export", "exported", "from-folder-int8", "--format", "ctranslate2", "--quantization", "int8"])

    checkpoint = load_checkpoint(checkpoint_path)
    model, tokenizer = model_from_checkpoint(checkpoint), tokenizer_from_checkpoint(checkpoint)
    sentences = ["4821", "17", "300000"]
    expected = translate(model, tokenizer, sentences, num_beams=1)
    assert CTranslate2Translator(run_dir / "from-checkpoint")(sentences, num_beams=1) == expected
    assert len(CTranslate2Translator(run_dir / "from-folder-int8")(sentences)) == 3

    with pytest.raises(SystemExit):
        main(["export", checkpoint_path, "marian", "--format", "marian", "--quantization", "int8"])
    assert "--quantization applies to --format ctranslate2 only" in capsys.readouterr().err

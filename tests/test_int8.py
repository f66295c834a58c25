"""int8 decoding (`hf_transformer.decoding.int8`): its outputs stay close to float32's on a trained model, it never
changes the model it is given, and the one switch (`int8`) reaches `translate()`, `TranslationEngine`, the commands and
a folder exported with `--int8`, which loads back in int8 here and as a plain float32 model elsewhere.

int8 and float32 are different computations whose rounding differs from CPU to CPU: they are compared on bounds with a
wide margin (measured: probabilities within 0.03, 85% of translations equal), never token for token."""

import json

import pytest
import torch
from conftest import (
    copy_task_batch,
    equal_fraction,
    make_tiny_config,
    trained_model,
    word_tokenizer,
    write_checkpoint,
)
from safetensors.torch import load_file

from hf_transformer import TransformerForConditionalGeneration, translate
from hf_transformer.decoding import Ensemble
from hf_transformer.decoding.engine import TranslationEngine
from hf_transformer.decoding.int8 import INT8_KEY, is_int8, quantize_int8
from hf_transformer.errors import ConfigError
from hf_transformer.export import export_model
from lightning_modules.cli import main


@pytest.fixture(scope="module")
def model_and_tokenizer():
    """A model trained briefly on the copy task: its next-token distributions are peaked, as a trained one's are."""
    torch.manual_seed(0)
    config = make_tiny_config()
    return trained_model(config), word_tokenizer(config.vocab_size)


@pytest.fixture(scope="module")
def sentences(model_and_tokenizer) -> list[str]:
    model, tokenizer = model_and_tokenizer
    source, mask, _ = copy_task_batch(64, model.config.vocab_size, torch.Generator().manual_seed(1))
    return [tokenizer.decode(row[keep.bool()][:-1]) for row, keep in zip(source, mask, strict=True)]


def test_int8_next_token_probabilities_stay_close_to_float32(model_and_tokenizer):
    model, _ = model_and_tokenizer
    int8 = quantize_int8(model)
    source, mask, labels = copy_task_batch(64, model.config.vocab_size, torch.Generator().manual_seed(2))
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    with torch.inference_mode():
        probabilities = [
            each(input_ids=source, attention_mask=mask, decoder_input_ids=decoder_input_ids).logits.softmax(-1)
            for each in (model, int8)
        ]
    real = mask.bool()
    difference = (probabilities[0] - probabilities[1])[real].abs()
    assert difference.max() < 0.1
    assert difference.mean() < 0.01
    # A model that is not the same (untrained) is far: the bound tells the two apart.
    untrained = TransformerForConditionalGeneration(model.config).eval()
    with torch.inference_mode():
        other = untrained(input_ids=source, attention_mask=mask, decoder_input_ids=decoder_input_ids).logits.softmax(-1)
    assert (probabilities[0] - other)[real].abs().max() > 0.1


def test_int8_translations_mostly_equal_float32s(model_and_tokenizer, sentences):
    model, tokenizer = model_and_tokenizer
    float32 = translate(model, tokenizer, sentences)
    assert equal_fraction(translate(model, tokenizer, sentences, int8=True), float32) >= 0.6
    assert (
        equal_fraction(
            translate(model, tokenizer, sentences, num_beams=1, int8=True),
            translate(model, tokenizer, sentences, num_beams=1),
        )
        >= 0.6
    )


def test_quantizing_copies_the_model_and_leaves_an_int8_one_as_it_is(model_and_tokenizer, sentences):
    model, tokenizer = model_and_tokenizer
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    int8 = quantize_int8(model)
    assert is_int8(int8) and not is_int8(model)
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())
    assert quantize_int8(int8) is int8
    # It decodes only: a loss is refused in one line that says what to do.
    source, mask, labels = copy_task_batch(2, model.config.vocab_size, torch.Generator().manual_seed(3))
    with pytest.raises(ConfigError, match="computes no loss: pass labels to the float32 model"):
        int8(input_ids=source, attention_mask=mask, labels=labels)
    # translate(int8=True) decodes as the int8 copy does; given an int8 model, int8=True changes nothing.
    assert translate(model, tokenizer, sentences, int8=True) == translate(int8, tokenizer, sentences)
    assert translate(int8, tokenizer, sentences, int8=True) == translate(int8, tokenizer, sentences)
    # An ensemble quantizes each member, keeping its average.
    ensemble = quantize_int8(Ensemble([model, model], average="log-probabilities"))
    assert all(is_int8(member) for member in ensemble.models) and ensemble.average == "log-probabilities"
    assert translate(ensemble, tokenizer, sentences[:10]) == translate(int8, tokenizer, sentences[:10])


def test_a_folder_exported_with_int8_loads_back_in_int8_and_elsewhere_as_float32(
    model_and_tokenizer, sentences, tmp_path, capsys
):
    model, tokenizer = model_and_tokenizer
    export_model(model, tokenizer, tmp_path / "int8", int8=True)
    export_model(model, tokenizer, tmp_path / "float32")
    assert not hasattr(model.generation_config, INT8_KEY)  # the model exported is as it was
    assert json.loads((tmp_path / "int8" / "generation_config.json").read_text())[INT8_KEY] is True

    # Here: int8 as the folder asks, unless told otherwise; a float32 folder in int8 when asked.
    engine = TranslationEngine.from_pretrained(tmp_path / "int8")
    assert engine.int8
    assert not TranslationEngine.from_pretrained(tmp_path / "int8", int8=False).int8
    assert TranslationEngine.from_pretrained(tmp_path / "float32", int8=True).int8
    assert not TranslationEngine.from_pretrained(tmp_path / "float32").int8
    expected = translate(model, tokenizer, sentences, int8=True)
    assert [best[0].text for best in engine.translate(sentences)] == expected
    # The attention maps of the int8 model's translations: distributions over the source tokens.
    (maps,) = engine.attention(sentences[:1])
    assert torch.allclose(maps.cross_attentions.sum(-1), torch.ones(()), atol=1e-4)

    # Elsewhere: float32 weights that transformers loads as any model's, and decodes with generate().
    weights = load_file(tmp_path / "int8" / "model.safetensors")
    assert all(tensor.dtype == torch.float32 for tensor in weights.values())
    loaded = TransformerForConditionalGeneration.from_pretrained(tmp_path / "int8")
    assert not is_int8(loaded)
    assert translate(loaded, tokenizer, sentences) == translate(model, tokenizer, sentences)

    # The commands: the folder's choice, --int8 and --no-int8.
    (tmp_path / "in.txt").write_text("\n".join(sentences) + "\n")
    main(["translate", str(tmp_path / "int8"), str(tmp_path / "in.txt")])
    assert capsys.readouterr().out.splitlines() == expected
    main(["translate", str(tmp_path / "float32"), str(tmp_path / "in.txt"), "--int8"])
    assert capsys.readouterr().out.splitlines() == expected
    main(["translate", str(tmp_path / "int8"), str(tmp_path / "in.txt"), "--no-int8"])
    assert capsys.readouterr().out.splitlines() == translate(model, tokenizer, sentences)

    # A CTranslate2 folder: --int8 is CTranslate2's int8 compute type; without it, the type it was exported in.
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed: pip install 'hf-transformer[ctranslate2]'")
    main(["export", str(tmp_path / "float32"), str(tmp_path / "ct2"), "--format", "ctranslate2"])
    assert not TranslationEngine.from_pretrained(tmp_path / "ct2").int8
    assert TranslationEngine.from_pretrained(tmp_path / "ct2", int8=True).int8


def test_a_folder_that_asks_for_int8_decodes_in_float32_on_another_device(model_and_tokenizer, tmp_path):
    """`export --int8` asks for int8 where int8 kernels run, the CPU: the same folder served on a GPU loads in float32
    rather than failing; int8 asked for by the caller on another device is refused, naming the fix. (The meta device
    stands for a GPU: the loading path is the same, and no kernel runs.)"""
    model, tokenizer = model_and_tokenizer
    export_model(model, tokenizer, tmp_path / "int8", int8=True)
    engine = TranslationEngine.from_pretrained(tmp_path / "int8", device="meta")
    assert not engine.int8 and engine.model.device.type == "meta"
    with pytest.raises(ConfigError, match="int8 decoding runs on the CPU"):
        TranslationEngine.from_pretrained(tmp_path / "int8", device="meta", int8=True)


def test_serve_and_export_take_the_switch(model_and_tokenizer, tmp_path, monkeypatch, capsys):
    pytest.importorskip("fastapi", reason="serving needs FastAPI: pip install 'hf-transformer[serve]'")
    model, tokenizer = model_and_tokenizer
    export_model(model, tokenizer, tmp_path / "float32")
    served = []
    monkeypatch.setattr("hf_transformer.serving.serve", lambda engine, **settings: served.append(engine))
    main(["serve", str(tmp_path / "float32"), "--int8"])
    assert served[0].int8
    assert f"Serving {tmp_path / 'float32'} (int8) on http://127.0.0.1:8000/" in capsys.readouterr().out

    # `export --int8` writes the request into the folder, for the hf-transformer format only.
    checkpoint = write_checkpoint(model, tokenizer, tmp_path / "model.ckpt")
    main(["export", str(checkpoint), str(tmp_path / "exported"), "--int8"])
    assert TranslationEngine.from_pretrained(tmp_path / "exported").int8
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["export", str(checkpoint), str(tmp_path / "marian"), "--format", "marian", "--int8"])
    assert "--int8 applies to --format hf-transformer only" in capsys.readouterr().err

"""Using a trained model: n-best lists and cut sources in `translate()`, attention weights and alignments, and the
`translate` and `attention` commands, which must give what `translate()` gives, and `export`, which writes the folder
they read whole."""

import errno
import io
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import DEMO, make_tiny_config, word_tokenizer, write_checkpoint

from hf_transformer import TransformerConfig, TransformerForConditionalGeneration, TranslationPipeline, translate
from hf_transformer.decoding import SourceTruncatedWarning, beam_search, translate_hypotheses
from hf_transformer.decoding.attention_maps import alignment, attention_maps, format_alignment
from hf_transformer.decoding.engine import TranslationEngine
from hf_transformer.errors import TranslationInputError
from lightning_modules.cli import main

SENTENCES = ["two men play music on the grass", "a dog", "ein hund rennt", "a dog runs on the grass"]


def tiny_model(tokenizer, **overrides) -> TransformerForConditionalGeneration:
    config = TransformerConfig(**{**make_tiny_config().to_dict(), "vocab_size": len(tokenizer), **overrides})
    return TransformerForConditionalGeneration(config).eval()


# --- translate(): n-best, empty sentences, cut sources, wrong input --------------------------------------------


def test_n_best_equals_generate_with_num_return_sequences(tiny_tokenizer):
    model = tiny_model(tiny_tokenizer).double()  # float64: one algorithm on both sides, no near ties
    results = translate(
        model, tiny_tokenizer, SENTENCES[1:], num_beams=4, num_return_sequences=3, max_length_offset=6, max_tokens=40
    )
    for sentence, hypotheses in zip(SENTENCES[1:], results, strict=True):
        inputs = tiny_tokenizer(sentence, return_tensors="pt")
        expected = model.generate(
            **inputs,
            num_beams=4,
            num_return_sequences=3,
            max_length=inputs["input_ids"].shape[1] + 6 + 1,
            output_scores=True,
            return_dict_in_generate=True,
        )
        assert [hypothesis.token_ids for hypothesis in hypotheses] == [
            row[: row.index(2, 1) + 1] if 2 in row[1:] else row for row in expected.sequences.tolist()
        ]
        assert torch.allclose(torch.tensor([h.score for h in hypotheses]), expected.sequences_scores.float(), atol=1e-5)
        assert [h.score for h in hypotheses] == sorted((h.score for h in hypotheses), reverse=True)
    assert [best[0].text for best in results] == translate(
        model, tiny_tokenizer, SENTENCES[1:], num_beams=4, max_length_offset=6, max_tokens=40
    )


def test_empty_sentences_translate_to_empty_strings_in_place(tiny_tokenizer):
    model = tiny_model(tiny_tokenizer)
    with_blanks = ["", SENTENCES[0], "   ", SENTENCES[1]]
    result = translate(model, tiny_tokenizer, with_blanks, max_length_offset=4)
    assert result[0] == result[2] == ""
    assert result[1::2] == translate(model, tiny_tokenizer, SENTENCES[:2], max_length_offset=4)
    assert translate(model, tiny_tokenizer, [""]) == [""]


def test_a_source_longer_than_the_positions_is_cut_with_a_warning_naming_it(tiny_tokenizer):
    model = tiny_model(tiny_tokenizer, max_position_embeddings=8)
    with pytest.warns(SourceTruncatedWarning, match=r"1 of 2 sentences .* 8 positions .* cut to 8 tokens.*sentence 1"):
        translate(model, tiny_tokenizer, ["a dog", "two men play music on the grass a dog runs"], max_length_offset=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # sources that fit give no warning
        translate(model, tiny_tokenizer, ["a dog"], max_length_offset=2)


def test_the_pipeline_and_translate_bound_a_long_inputs_translation_alike(tiny_tokenizer):
    """One output-length rule, section 6.1's (`max_new_tokens`): `generate()`, and so the pipeline, stopped a model
    that never ends its output at a saved min(256, positions) - 1 tokens whatever the source, `translate()` at the
    source's length + 50, so on a long input their translations differed."""
    from hf_transformer.model.configuration_transformer import MAX_LENGTH_OFFSET, max_new_tokens

    model = tiny_model(tiny_tokenizer, max_position_embeddings=512)
    never_eos = torch.tensor([model.config.eos_token_id])
    model.lm_head.register_forward_hook(lambda module, args, logits: logits.index_fill(-1, never_eos, float("-inf")))
    sentence = " ".join([SENTENCES[0]] * 16)  # 209 tokens
    source_length = len(tiny_tokenizer(sentence)["input_ids"])
    assert max_new_tokens(source_length, 512) == source_length + MAX_LENGTH_OFFSET > 255
    (best,) = translate(model, tiny_tokenizer, [sentence], num_beams=1, num_return_sequences=1)[0]
    assert len(best.token_ids) - 1 == source_length + MAX_LENGTH_OFFSET  # - 1: the start token
    (piped,) = TranslationPipeline(model=model, tokenizer=tiny_tokenizer)([sentence], num_beams=1)
    assert piped["translation_text"] == best.text


def test_wrong_input_gives_a_clear_error_or_a_sensible_result(tiny_tokenizer):
    model = tiny_model(tiny_tokenizer)
    with pytest.raises(TranslationInputError, match=r"not one string: pass \['4821'\]"):
        translate(model, tiny_tokenizer, "4821")
    with pytest.raises(TranslationInputError, match="sentence 1 is a int"):
        translate(model, tiny_tokenizer, ["a dog", 17])
    with pytest.raises(
        TranslationInputError, match=r"num_return_sequences=3 \(the n-best list\) must be between 1 and num_beams=2"
    ):
        translate(model, tiny_tokenizer, ["a dog"], num_beams=2, num_return_sequences=3)
    pipeline = TranslationPipeline(model=model, tokenizer=tiny_tokenizer)
    assert pipeline([]) == []
    with pytest.warns(UserWarning, match="cut to 5 tokens"):
        pipeline(["two men play music on the grass"], max_source_length=5, max_new_tokens=2)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"num_beams": 0}, "num_beams=0 must be (at least 1|between 1 and 16)"),
        ({"num_beams": -1}, "num_beams=-1 must be (at least 1|between 1 and 16)"),
        ({"num_return_sequences": 0}, r"num_return_sequences=0 \(the n-best list\) must be between 1 and num_beams=4"),
        ({"num_beams": 2, "num_return_sequences": 3}, "num_return_sequences=3 .* between 1 and num_beams=2"),
    ],
)
def test_translate_refuses_settings_that_cannot_work_as_the_commands_do(tiny_tokenizer, settings, message):
    """0 beams fell back to the model's (`0 or ...`), -1 was blamed on num_return_sequences, an n-best of 0 gave one
    translation: translate(), beam_search and the engine of the commands now refuse alike."""
    model = tiny_model(tiny_tokenizer)
    assert model.generation_config.num_beams == 4  # the default that 0 beams fell back to
    engine = TranslationEngine(tiny_tokenizer, model=model)
    inputs = tiny_tokenizer(["a dog"], return_tensors="pt")
    calls = {
        "translate": lambda: translate(model, tiny_tokenizer, ["a dog"], **settings),
        "beam_search": lambda: beam_search(model, inputs["input_ids"], inputs["attention_mask"], **settings),
        "engine": lambda: engine.translate(["a dog"], **settings),
    }
    for name, call in calls.items():
        with pytest.raises(TranslationInputError, match=message):
            call()
            pytest.fail(f"{name} accepted {settings}")


def test_the_commands_refuse_more_beams_than_they_take_where_the_library_does_not(tiny_tokenizer):
    """The commands and the server cap the beams and the length penalty (a request's cost); translate() does not."""
    model = tiny_model(tiny_tokenizer, max_position_embeddings=24)
    engine = TranslationEngine(tiny_tokenizer, model=model)
    for settings, message in (({"num_beams": 17}, "between 1 and 16"), ({"length_penalty": 11.0}, "-10 and 10")):
        with pytest.raises(TranslationInputError, match=message):
            engine.translate(["a dog"], **settings)
        assert len(translate(model, tiny_tokenizer, ["a dog"], **settings)) == 1


def test_the_names_of_0_3_still_work_and_warn(tiny_tokenizer):
    """translate_hypotheses() and hf_transformer.attention were renamed in 0.4: they still work, with a warning that
    names the new place."""
    model = tiny_model(tiny_tokenizer)
    with pytest.warns(FutureWarning, match=r"translate\(model, tokenizer, sentences, num_return_sequences=n\)"):
        old = translate_hypotheses(model, tiny_tokenizer, SENTENCES, num_beams=2, num_return_sequences=2)
    assert old == translate(model, tiny_tokenizer, SENTENCES, num_beams=2, num_return_sequences=2)
    sys.modules.pop("hf_transformer.attention", None)
    with pytest.warns(FutureWarning, match="hf_transformer.attention moved to hf_transformer.decoding"):
        from hf_transformer.attention import attention_maps as old_attention_maps
    assert old_attention_maps is attention_maps


# --- attention weights ------------------------------------------------------------------------------------------


def test_attention_maps_are_distributions_over_real_tokens_with_the_future_masked(tiny_tokenizer):
    model = tiny_model(tiny_tokenizer)
    config = model.config
    maps = attention_maps(model, tiny_tokenizer, SENTENCES, num_beams=2, max_length_offset=5)
    translations = translate(model, tiny_tokenizer, SENTENCES, num_beams=2, max_length_offset=5, num_return_sequences=1)
    for sentence, sentence_maps, best in zip(SENTENCES, maps, translations, strict=True):
        source = tiny_tokenizer(sentence)["input_ids"]
        target = len(best[0].token_ids) - 1  # the produced tokens: all but the start token
        assert sentence_maps.translation == best[0].text
        assert sentence_maps.cross_attentions.shape == (config.decoder_layers, 4, target, len(source))
        assert sentence_maps.encoder_attentions.shape == (config.encoder_layers, 4, len(source), len(source))
        assert sentence_maps.decoder_attentions.shape == (config.decoder_layers, 4, target, target)
        assert len(sentence_maps.source_tokens) == len(source) and len(sentence_maps.target_tokens) == target
        # Cut to the real tokens of this sentence, each row still sums to 1: padding got no weight in the batch.
        for kind in ("cross", "encoder", "decoder"):
            weights = sentence_maps.weights(kind)
            assert torch.allclose(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-5), kind
        future = torch.ones(target, target, dtype=torch.bool).triu(1)
        assert (sentence_maps.decoder_attentions[:, :, future] == 0).all()
    # Batched with padding or alone: the same weights.
    (alone,) = attention_maps(model, tiny_tokenizer, SENTENCES[1:2], num_beams=2, max_length_offset=5)
    assert torch.allclose(alone.cross_attentions, maps[1].cross_attentions, atol=1e-5)


def test_attention_maps_equal_the_models_own_output_attentions(tiny_tokenizer):
    model = tiny_model(tiny_tokenizer)
    output_ids = [[1, 10, 11, 12, 2]]
    (maps,) = attention_maps(model, tiny_tokenizer, ["a dog"], output_ids)
    inputs = tiny_tokenizer(["a dog"], return_tensors="pt")
    with torch.no_grad():
        expected = model(**inputs, decoder_input_ids=torch.tensor([[1, 10, 11, 12]]), output_attentions=True)
    assert torch.allclose(maps.cross_attentions, torch.stack(expected.cross_attentions)[:, 0])
    assert maps.target_tokens == tiny_tokenizer.convert_ids_to_tokens([10, 11, 12, 2])
    assert maps.decoder_input_tokens == tiny_tokenizer.convert_ids_to_tokens([1, 10, 11, 12])


def test_alignment_pairs_each_target_token_with_its_most_attended_source_token(tiny_tokenizer):
    model = tiny_model(tiny_tokenizer)
    (maps,) = attention_maps(model, tiny_tokenizer, ["two men play music"], [[1, 10, 11, 12, 2]])
    pairs = alignment(maps)
    source_words = len(maps.source_tokens) - 1  # without </s>
    assert [target for _, target in pairs] == [0, 1, 2]  # every target token but </s>, in order
    assert all(0 <= source < source_words for source, _ in pairs)
    mean = maps.cross_attentions[-1].mean(0)
    assert all(mean[target, source] == mean[target, :source_words].max() for source, target in pairs)
    assert format_alignment([(0, 0), (2, 1)]) == "0-0 2-1"


def test_plots_have_tokens_on_their_axes(tiny_tokenizer, tmp_path):
    pytest.importorskip("matplotlib", reason="plotting needs matplotlib: pip install 'hf-transformer[plot]'")
    from hf_transformer.decoding.attention_maps import plot_attention, plot_attention_heads

    model = tiny_model(tiny_tokenizer)
    (maps,) = attention_maps(model, tiny_tokenizer, ["a dog runs"], [[1, 10, 11, 2]])
    figure = plot_attention(maps)
    axes = figure.axes[0]
    assert [label.get_text() for label in axes.get_xticklabels()] == maps.source_tokens
    assert [label.get_text() for label in axes.get_yticklabels()] == maps.target_tokens
    grid = plot_attention_heads(maps, "encoder")
    assert len([axes for axes in grid.axes if axes.images]) == model.config.encoder_layers * 4
    # One numbering: the titles count layers and heads from 0, as --layer and the server's `layer` do ("layer 2" of
    # a two-layer model was the title of --layer 1).
    assert axes.get_title() == "cross attention, layer 1 of 0-1, mean of heads"
    assert plot_attention(maps, "encoder", layer=0).axes[0].get_title().startswith("encoder attention, layer 0 of")
    assert grid.axes[0].get_title() == "layer 0, head 0" and grid.axes[-1].get_title() == "layer 1, head 3"
    figure.savefig(tmp_path / "map.png")
    assert (tmp_path / "map.png").read_bytes()[:4] == b"\x89PNG"


# --- the commands -------------------------------------------------------------------------------------------------


@pytest.fixture
def checkpoint(tiny_tokenizer, tmp_path) -> Path:
    """A checkpoint as training writes it (model weights, config, tokenizer), of an untrained tiny model; 24 positions
    keep its outputs, which run to the length limit, short."""
    model = tiny_model(tiny_tokenizer, max_position_embeddings=24)
    model.generation_config.update(num_beams=3, length_penalty=0.6)
    return write_checkpoint(model, tiny_tokenizer, tmp_path / "model.ckpt")


def reference_model(checkpoint: Path):
    from lightning_modules.checkpoint import load_checkpoint, model_from_checkpoint, tokenizer_from_checkpoint

    loaded = load_checkpoint(checkpoint)
    return model_from_checkpoint(loaded), tokenizer_from_checkpoint(loaded)


def test_translate_command_equals_translate_keeping_order_and_empty_lines(checkpoint, tmp_path, capsys):
    model, tokenizer = reference_model(checkpoint)
    lines = [SENTENCES[0], "", SENTENCES[1], SENTENCES[2], "", SENTENCES[3]]
    (tmp_path / "a.txt").write_text("\n".join(lines[:3]) + "\n")
    (tmp_path / "b.txt").write_text("\n".join(lines[3:]) + "\n")
    main(["translate", str(checkpoint), str(tmp_path / "a.txt"), str(tmp_path / "b.txt"), "-o", str(tmp_path / "out")])
    expected = translate(model, tokenizer, lines)
    assert (tmp_path / "out").read_text().split("\n")[:-1] == expected
    assert expected[1] == expected[4] == ""
    assert "translated 6/6 lines" in capsys.readouterr().err

    # Standard input to standard output, with other decoding settings.
    monkey_stdin = io.StringIO("\n".join(lines) + "\n")
    sys_stdin, sys.stdin = sys.stdin, monkey_stdin
    try:
        main(["translate", str(checkpoint), "--num-beams", "1", "--length-penalty", "1.0"])
    finally:
        sys.stdin = sys_stdin
    output = capsys.readouterr().out
    assert output.split("\n")[:-1] == translate(model, tokenizer, lines, num_beams=1, length_penalty=1.0)


def test_translate_command_n_best_alignments_and_reference(checkpoint, tmp_path, capsys):
    model, tokenizer = reference_model(checkpoint)
    lines = SENTENCES[:2]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "ref.txt").write_text("\n".join(translate(model, tokenizer, lines)) + "\n")
    main(["translate", str(checkpoint), str(tmp_path / "in.txt"), "--n-best", "3", "--alignments"])
    captured = capsys.readouterr()
    rows = [line.split(" ||| ") for line in captured.out.splitlines()]
    assert [int(row[0]) for row in rows] == [0, 0, 0, 1, 1, 1]
    expected = translate(model, tokenizer, lines, num_return_sequences=3)
    for index, hypotheses in enumerate(expected):
        mine = rows[3 * index : 3 * index + 3]
        assert [row[1] for row in mine] == [hypothesis.text for hypothesis in hypotheses]
        scores = [float(row[2]) for row in mine]
        assert scores == sorted(scores, reverse=True)
        assert scores == pytest.approx([hypothesis.score for hypothesis in hypotheses], abs=1e-4)
        for row, hypothesis in zip(mine, hypotheses, strict=True):
            source_tokens = len(tokenizer(lines[index])["input_ids"]) - 1  # without </s>
            target_tokens = len(hypothesis.token_ids) - 2  # without <s> and </s> (when it ends with it)
            pairs = [tuple(map(int, pair.split("-"))) for pair in row[3].split()]
            assert all(0 <= source < source_tokens and 0 <= target <= target_tokens for source, target in pairs)

    main(["translate", str(checkpoint), str(tmp_path / "in.txt"), "--reference", str(tmp_path / "ref.txt")])
    err = capsys.readouterr().err
    assert "sacreBLEU" in err and "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in err
    assert err.count("100.00") >= 4 and "multi-bleu.perl -lc" in err  # the references of themselves, every score
    assert "Moses tokenizer (en)" in err and "compounds split" not in err  # ref.txt names no language

    (tmp_path / "ref.de").write_text((tmp_path / "ref.txt").read_text())
    main(["translate", str(checkpoint), str(tmp_path / "in.txt"), "--reference", str(tmp_path / "ref.de")])
    err = capsys.readouterr().err
    assert "Moses tokenizer (de)" in err and "compounds split" in err  # the language the file's name gives


def test_translate_command_warns_naming_the_lines_it_cut(tiny_tokenizer, checkpoint, tmp_path, capsys):
    saved = torch.load(checkpoint, weights_only=True)
    saved["hf_config"]["max_position_embeddings"] = 8
    torch.save(saved, checkpoint)
    (tmp_path / "in.txt").write_text("a dog\ntwo men play music on the grass a dog runs\n")
    main(["translate", str(checkpoint), str(tmp_path / "in.txt"), "--num-beams", "1"])
    err = capsys.readouterr().err
    assert "1 of 2 sentences are longer than the model's 8 positions and were cut to 8 tokens" in err
    assert f"line 2 of {tmp_path / 'in.txt'}" in err


def test_translate_command_refuses_mistakes_in_one_line(checkpoint, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("a dog\n")
    (tmp_path / "ref.txt").write_text("one\ntwo\n")
    mistakes = {
        ("missing.txt",): "missing.txt: no such file",
        ("--n-best", "5"): "num_return_sequences=5 (the n-best list) must be between 1 and num_beams=3",
        ("--num-beams", "0"): "num_beams=0 must be between 1 and 16",
        ("--reference", str(tmp_path / "ref.txt")): "has 2 lines for 1 translated lines",
    }
    for extra, message in mistakes.items():
        arguments = [a if a != "missing.txt" else str(tmp_path / a) for a in extra]
        files = [] if extra[0] == "missing.txt" else [str(tmp_path / "in.txt")]
        with pytest.raises(SystemExit):
            main(["translate", str(checkpoint), *files, *arguments])
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
        assert err.startswith("hf-transformer translate: error:")
    with pytest.raises(SystemExit):
        main(["translate", str(tmp_path / "no-such-model"), str(tmp_path / "in.txt")])
    assert "is no model folder, checkpoint or Hub repository" in capsys.readouterr().err
    (tmp_path / "marian").mkdir()
    (tmp_path / "marian" / "config.json").write_text('{"model_type": "marian"}')
    with pytest.raises(SystemExit):
        main(["translate", str(tmp_path / "marian"), str(tmp_path / "in.txt")])
    err = capsys.readouterr().err
    assert "is an export of --format marian (the same model as a stock MarianMTModel" in err
    assert "To translate here, pass a folder exported with --format hf-transformer or ctranslate2" in err
    with pytest.raises(SystemExit):
        main(["predict", "--config", "configs/demo.yaml"])
    assert "there is no predict command: `hf-transformer test`" in capsys.readouterr().err


def test_translate_command_with_nothing_to_score_says_so_in_one_line(checkpoint, tmp_path, capsys, monkeypatch):
    """`: | hf-transformer translate MODEL --reference empty.txt` ended in an IndexError inside sacreBLEU."""
    (tmp_path / "empty.txt").write_text("")
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    with pytest.raises(SystemExit):
        main(["translate", str(checkpoint), "--reference", str(tmp_path / "empty.txt")])
    err = capsys.readouterr().err
    assert "there is nothing to score" in err and "Traceback" not in err
    assert err.startswith("hf-transformer translate: error:")


def test_the_onnx_export_names_the_releases_it_needs_when_transformers_has_no_exporters():
    """With the onnx extra's runtimes installed but transformers' exporters missing (a transformers older than the
    extra asks for), the import says to upgrade the extra, not to install it."""
    for module in ("onnxruntime", "onnxscript"):
        pytest.importorskip(module, reason="the ONNX export needs the onnx extra: pip install 'hf-transformer[onnx]'")
    code = "import sys; sys.modules['transformers.exporters'] = None; import hf_transformer.export.onnx"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("ImportError: The ONNX export needs transformers' exporters"), message
    assert "pip install -U 'hf-transformer[onnx]'" in message


@pytest.mark.slow
def test_an_onnx_export_is_refused_saying_how_it_runs(checkpoint, tmp_path, capsys):
    """An ONNX folder has the model's config and tokenizer but no weights: it failed as "no model folder", telling
    the user to pass a folder written by export, which it is."""
    for module in ("onnxruntime", "onnxscript"):
        pytest.importorskip(module, reason="the ONNX export needs the onnx extra: pip install 'hf-transformer[onnx]'")
    folder = tmp_path / "onnx"
    main(["export", str(checkpoint), str(folder), "--format", "onnx", "--source-length", "8", "--max-length", "8"])
    (tmp_path / "in.txt").write_text("a dog\n")
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["translate", str(folder), str(tmp_path / "in.txt")])
    err = capsys.readouterr().err
    assert err.startswith("hf-transformer translate: error:") and "Traceback" not in err
    assert "is an export of --format onnx (ONNX programs of the encoder" in err
    assert "which this command does not run: they run on ONNX Runtime" in err
    assert "ExportedModel.from_pretrained(folder), as docs/deploying.md shows" in err
    assert "is no model folder" not in err


def test_translate_command_never_writes_over_its_input_and_a_failed_run_leaves_the_output(checkpoint, tmp_path, capsys):
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("a dog\n")
    output.write_text("earlier translations\n")
    (tmp_path / "link.txt").symlink_to(source)
    (tmp_path / "sub").mkdir()
    for written in (source, tmp_path / "link.txt", tmp_path / "sub" / ".." / "in.txt"):
        with pytest.raises(SystemExit):
            main(["translate", str(checkpoint), str(source), "-o", str(written)])
        assert f"-o {written} is {source}, an input of this run" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the same file as the references
        main(["translate", str(checkpoint), str(source), "--reference", str(output), "-o", str(output)])
    assert source.read_text() == "a dog\n"

    for failing in ([str(tmp_path / "no-such-model"), str(source)], [str(checkpoint), str(tmp_path / "missing.txt")]):
        with pytest.raises(SystemExit):
            main(["translate", *failing, "-o", str(output)])
        assert "Traceback" not in capsys.readouterr().err
    assert output.read_text() == "earlier translations\n"
    assert sorted(os.listdir(tmp_path)) == ["in.txt", "link.txt", "model.ckpt", "out.txt", "sub"]  # no temporary file

    output.chmod(0o600)
    main(["translate", str(checkpoint), str(source), "-o", str(output)])
    assert output.read_text().count("\n") == 1 and output.stat().st_mode & 0o777 == 0o600
    main(["translate", str(checkpoint), str(source), "-o", "/dev/null"])  # a device is written, not replaced
    assert Path("/dev/null").is_char_device()


def test_translate_command_refuses_unreadable_input_and_unwritable_output_in_one_line(
    checkpoint, tmp_path, capsys, monkeypatch
):
    import gzip

    files = {
        "latin1.txt": "a dog\nein Hund läuft\n".encode("latin-1"),
        "binary.bin": bytes(range(256)),
        "corrupt.gz": gzip.compress(b"a dog\n")[:8],
    }
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    (tmp_path / "in.txt").write_text("a dog\n")
    read_only = tmp_path / "read-only"
    read_only.mkdir(mode=0o555)
    mistakes = {
        (str(tmp_path / "latin1.txt"),): f"line 2 of {tmp_path / 'latin1.txt'} is not UTF-8 text (byte 11 is 0xe4)",
        (str(tmp_path / "binary.bin"),): f"line 2 of {tmp_path / 'binary.bin'} is not UTF-8 text (byte 118 is 0x80)",
        (str(tmp_path / "corrupt.gz"),): f"line 1 of {tmp_path / 'corrupt.gz'} is not UTF-8 text (byte 2 is 0x8b)",
        ("-o", str(tmp_path / "no" / "out.txt")): "no/out.txt: cannot write there (No such file or directory)",
        ("-o", "/proc/out.txt"): "-o /proc/out.txt: cannot write there",
        ("-o", str(tmp_path)): "is a folder: give the path of a file to write the translations to",
        ("--average", "0"): "argument --average: must be at least 1, got 0",
        ("--average", "-1"): "argument --average: must be at least 1, got -1",
        ("--device", "gpu0"): "argument --device: 'gpu0' is no device: use cpu, cuda, cuda:N or mps",
    }
    if os.geteuid() != 0:  # root writes into any folder
        mistakes["-o", str(read_only / "out.txt")] = "read-only/out.txt: cannot write there (Permission denied)"
    if not torch.cuda.is_available():
        mistakes["--device", "cuda"] = "argument --device: cuda: "
    for extra, message in mistakes.items():
        inputs = [str(tmp_path / "in.txt")] if extra[0].startswith("-") else []
        with pytest.raises(SystemExit):
            main(["translate", str(checkpoint), *inputs, *extra])
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
        assert err.startswith("hf-transformer translate: error:") or "usage:" in err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("ein Hund läuft\n".encode("latin-1"))))
    with pytest.raises(SystemExit):
        main(["translate", str(checkpoint)])
    assert "line 1 of standard input is not UTF-8 text (byte 11 is 0xe4)" in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([*files, "in.txt", "model.ckpt", "read-only"])


def test_translate_command_into_a_closed_pipe_ends_quietly(checkpoint, tmp_path, capsys, monkeypatch):
    """`hf-transformer translate ... | head -1`: once head has exited, writing fails; a filter stops without a
    traceback, and Python's flush of standard output at exit must not fail again."""
    (tmp_path / "in.txt").write_text("a dog\n")
    reader, writer = os.pipe()
    os.close(reader)
    with open(writer, "w") as closed_pipe:
        monkeypatch.setattr(sys, "stdout", closed_pipe)
        with pytest.raises(SystemExit) as stopped:
            main(["translate", str(checkpoint), str(tmp_path / "in.txt")])
        closed_pipe.write("at exit\n")
        closed_pipe.flush()  # into devnull now
    assert stopped.value.code == 1
    assert "Traceback" not in capsys.readouterr().err


def test_a_folder_without_its_tokenizer_is_named_with_the_fix(checkpoint, tmp_path, capsys):
    from lightning_modules.checkpoint import load_checkpoint
    from lightning_modules.checkpoint_export import export_checkpoint

    folder = export_checkpoint(load_checkpoint(checkpoint), tmp_path / "exported")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    with pytest.raises(SystemExit):
        main(["translate", str(folder)])
    err = capsys.readouterr().err
    assert "exported has no tokenizer.json or tokenizer_config.json: a model folder needs the tokenizer" in err
    assert "Export it again from its checkpoint" in err and "sentencepiece" not in err


def test_an_export_appears_whole_or_not_at_all(checkpoint, tmp_path, capsys, monkeypatch):
    """A kill -9 midway left a folder of config and weights that `push` published. Now the export is written into a
    hidden folder beside, renamed into place when whole: while it is written, the folder's name holds nothing (or the
    previous export, with --overwrite), and a failure leaves that as it was."""
    import lightning_modules.checkpoint_export

    folder = tmp_path / "exported"
    seen = []

    def killed(written, *args, **kwargs):  # the model card is written last, after the weights and the tokenizer
        seen.append((folder.exists() and sorted(path.name for path in folder.iterdir()), sorted(os.listdir(written))))
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(lightning_modules.checkpoint_export, "write_model_card", killed)
        with pytest.raises(KeyboardInterrupt):
            main(["export", str(checkpoint), str(folder)])
    assert seen[0][0] is False and "model.safetensors" in seen[0][1] and "tokenizer.json" in seen[0][1]
    assert sorted(os.listdir(tmp_path)) == ["model.ckpt"]  # and no hidden folder left

    main(["export", str(checkpoint), str(folder)])
    assert f'model_id = "{folder}"' in (folder / "README.md").read_text()  # the final folder, not the hidden one
    (folder / "notes.txt").write_text("mine")
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    with monkeypatch.context() as patch:
        patch.setattr(lightning_modules.checkpoint_export, "write_model_card", killed)
        with pytest.raises(KeyboardInterrupt):
            main(["export", str(checkpoint), str(folder), "--overwrite"])
    assert seen[1][0] == sorted(before)
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before
    main(["export", str(checkpoint), str(folder), "--overwrite"])  # files of other names stay, as before
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before
    assert sorted(os.listdir(tmp_path)) == ["exported", "model.ckpt"]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["export", str(checkpoint), "/proc/exported"])
    assert "cannot write into /proc (No such file or directory)" in capsys.readouterr().err


def disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def safetensors_disk_full(*args, **kwargs):
    from safetensors import SafetensorError

    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


# What writes each format's weights, and how it fails on a full disk (as each did on a full 1 MiB tmpfs).
WEIGHT_WRITERS = {
    "hf-transformer": ("transformers.modeling_utils.safe_save_file", safetensors_disk_full, None),
    "marian": ("transformers.modeling_utils.safe_save_file", safetensors_disk_full, None),
    "ctranslate2": ("ctranslate2.specs.model_spec.ModelSpec.save", disk_full, "ctranslate2"),
    "onnx": ("onnx.save", disk_full, "onnxscript"),
}


@pytest.mark.parametrize(
    "format", ["hf-transformer", "marian", "ctranslate2", pytest.param("onnx", marks=pytest.mark.slow)]
)
def test_an_export_onto_a_full_disk_is_one_line_and_leaves_nothing(checkpoint, tmp_path, capsys, monkeypatch, format):
    """Each format's writer ended in its own traceback (safetensors' SafetensorError "os error 28", the OSError of
    CTranslate2's and ONNX's): the hidden folder was removed, only the message was wrong."""
    target, fail, extra = WEIGHT_WRITERS[format]
    if extra is not None:
        pytest.importorskip(
            extra, reason=f"the {format} export needs its extra: pip install 'hf-transformer[{format}]'"
        )
    monkeypatch.setattr(target, fail)
    options = ["--source-length", "8", "--max-length", "8"] if format == "onnx" else []
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(["export", str(checkpoint), str(tmp_path / "exported"), "--format", format, *options])
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(
        f"hf-transformer export: error: no space left on the disk of {tmp_path} while writing exported ("
    )
    assert err.strip().endswith(
        f"{tmp_path / 'exported'} is as it was before. Free space there, or export to another disk"
    )
    assert sorted(os.listdir(tmp_path)) == ["model.ckpt"]


def test_the_card_of_an_averaged_export_says_which_steps_its_weights_are_the_mean_of(checkpoint, tmp_path, capsys):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    saved = torch.load(checkpoint, weights_only=True)
    for step in (90, 100):
        torch.save({**saved, "global_step": step}, folder / f"step={step}.ckpt")
    main(["export", str(folder), str(tmp_path / "averaged"), "--average", "2"])
    main(["export", str(folder / "step=100.ckpt"), str(tmp_path / "single")])
    averaged = (tmp_path / "averaged" / "README.md").read_text()
    assert "| Checkpoint averaging | the exported weights are the mean of those at steps 90, 100 |" in averaged
    assert "| Training steps | 100 optimizer steps |" in averaged
    assert "Checkpoint averaging" not in (tmp_path / "single" / "README.md").read_text()


def test_a_format_registered_in_one_line_gets_its_flags_push_its_card_and_a_refusal_where_it_cannot_run(
    checkpoint, tmp_path, capsys, monkeypatch
):
    """Adding a format that carries a card is its writer and one registry entry: `export` takes the option it declares
    as a flag of its type (refused for the other formats), `push` offers it, its card carries its tags and usage (and
    the other formats' cards list it), and `translate` recognises a folder of it by its files and refuses it, saying
    where it runs."""
    from huggingface_hub import ModelCard

    from hf_transformer.formats import FORMATS, ExportFormat, ExportOption, FormatCard, card_formats, positive_int
    from lightning_modules.cli.export import _parser as export_parser
    from lightning_modules.cli.push import _push_parser

    levels = []

    def write_toy(model, tokenizer, folder, toy_level):
        levels.append(toy_level)
        (folder / "toy.bin").write_text(f"{model.config.d_model} {toy_level}")

    toy = ExportFormat(
        "toy",
        "the model in a toy format",
        write_toy,
        options=(ExportOption("toy_level", "how toy it is (default: 1)", positive_int, default=1),),
        card=FormatCard(tags=("toy-format",), usage="import toy\n\nmodel = toy.load({{ model_id | tojson }})"),
        files=("toy.bin",),
        runs_elsewhere="it runs in the toy runtime",
    )
    monkeypatch.setitem(FORMATS, "toy", toy)

    assert "toy" in card_formats() and "--toy-level TOY_LEVEL" in export_parser().format_help()
    assert _push_parser().parse_args(["model.ckpt", "alice/toy", "--format", "toy"]).format == "toy"
    (tmp_path / "scores.json").write_text('{"test/bleu": 12.5}')
    folder = tmp_path / "toy"
    main(
        [
            "export",
            str(checkpoint),
            str(folder),
            "--format",
            "toy",
            "--toy-level",
            "3",
            "--results",
            str(tmp_path / "scores.json"),
        ]
    )
    assert levels == [3] and (folder / "toy.bin").read_text() == "32 3"
    card = ModelCard.load(folder / "README.md")
    assert "toy-format" in card.data.tags and "custom_code" not in card.data.tags
    assert f'model = toy.load("{folder.resolve()}")' in card.text
    assert card.data.eval_results[0].metric_value == 12.5
    main(["export", str(checkpoint), str(tmp_path / "ours")])
    assert "- **toy**: the model in a toy format." in (tmp_path / "ours" / "README.md").read_text()

    capsys.readouterr()
    for mistake, message in (
        (["--format", "toy", "--toy-level", "0"], "argument --toy-level: must be at least 1, got 0"),
        (["--format", "marian", "--toy-level", "2"], "--toy-level applies to --format toy only"),
    ):
        with pytest.raises(SystemExit):
            main(["export", str(checkpoint), str(tmp_path / "other"), *mistake])
        assert message in capsys.readouterr().err
    (tmp_path / "in.txt").write_text("a dog\n")
    with pytest.raises(SystemExit):
        main(["translate", str(folder), str(tmp_path / "in.txt")])
    err = capsys.readouterr().err
    assert "is an export of --format toy (the model in a toy format), which this command does not run" in err
    assert "it runs in the toy runtime" in err


def test_translate_command_reads_exported_and_ctranslate2_folders(checkpoint, tmp_path, capsys):
    from lightning_modules.checkpoint import load_checkpoint
    from lightning_modules.checkpoint_export import export_checkpoint

    model, tokenizer = reference_model(checkpoint)
    export_checkpoint(load_checkpoint(checkpoint), tmp_path / "exported")
    (tmp_path / "in.txt").write_text("\n".join(SENTENCES) + "\n")
    main(["translate", str(tmp_path / "exported"), str(tmp_path / "in.txt")])
    assert capsys.readouterr().out.splitlines() == translate(model, tokenizer, SENTENCES)

    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed: pip install 'hf-transformer[ctranslate2]'")
    from hf_transformer.decoding.ctranslate2 import CTranslate2Translator

    main(["export", str(tmp_path / "exported"), str(tmp_path / "ct2"), "--format", "ctranslate2"])
    capsys.readouterr()
    main(["translate", str(tmp_path / "ct2"), str(tmp_path / "in.txt")])
    assert capsys.readouterr().out.splitlines() == CTranslate2Translator(tmp_path / "ct2")(SENTENCES)
    with pytest.raises(SystemExit):
        main(["translate", str(tmp_path / "ct2"), str(tmp_path / "in.txt"), "--alignments"])
    assert "alignments come from this package's model, not from a CTranslate2 one" in capsys.readouterr().err


def test_translate_command_translates_with_an_ensemble_of_checkpoints_and_folders(
    tiny_tokenizer, checkpoint, tmp_path, capsys
):
    """The models before the first text file (a checkpoint and an exported folder of another depth here) translate as
    `translate()` does with the list of them; their tokenizer must be one, and an ensemble gives no alignments."""
    from lightning_modules.checkpoint import load_checkpoint
    from lightning_modules.checkpoint_export import export_checkpoint

    torch.manual_seed(1)
    deeper = tiny_model(tiny_tokenizer, decoder_layers=3, max_position_embeddings=24)
    folder = export_checkpoint(
        load_checkpoint(write_checkpoint(deeper, tiny_tokenizer, tmp_path / "b.ckpt")), tmp_path / "b"
    )
    model, tokenizer = reference_model(checkpoint)
    lines = [SENTENCES[0], "", SENTENCES[1]]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    main(["translate", str(checkpoint), str(folder), str(tmp_path / "in.txt"), "--n-best", "2"])
    rows = [line.split(" ||| ") for line in capsys.readouterr().out.splitlines()]
    expected = translate([model, deeper], tokenizer, lines, num_return_sequences=2)
    assert [row[1] for row in rows] == [hypothesis.text for best in expected for hypothesis in best]
    assert [float(row[2]) for row in rows] == pytest.approx([h.score for best in expected for h in best], abs=1e-4)
    assert expected != translate(model, tokenizer, lines, num_return_sequences=2)  # not the first model's alone

    main(
        ["translate", str(checkpoint), str(folder), str(tmp_path / "in.txt"), "--ensemble-average", "log-probabilities"]
    )
    from hf_transformer.decoding import Ensemble

    ensemble = Ensemble([model, deeper], average="log-probabilities")
    assert capsys.readouterr().out.splitlines() == translate(ensemble, tokenizer, lines)

    other = tiny_model(word_tokenizer(len(tiny_tokenizer) + 6), max_position_embeddings=24)
    write_checkpoint(other, word_tokenizer(len(tiny_tokenizer) + 6), tmp_path / "other.ckpt")
    mistakes = {
        (str(tmp_path / "other.ckpt"), str(tmp_path / "in.txt")): f"{checkpoint} and {tmp_path / 'other.ckpt'} do not "
        f"share one tokenizer (vocabulary size {len(tiny_tokenizer)} and {len(tiny_tokenizer) + 6})",
        (str(folder), str(tmp_path / "in.txt"), "--alignments"): "alignments come from one model's attention, not from "
        "an ensemble of 2: pass one model",
        (str(tmp_path / "in.txt"), str(folder)): f"{folder} is a folder, after the text file {tmp_path / 'in.txt'}: "
        "the models of an ensemble come first",
    }
    for arguments, message in mistakes.items():
        with pytest.raises(SystemExit):
            main(["translate", str(checkpoint), *arguments])
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def drawn_figures(monkeypatch) -> list:
    """The figures the attention command saves, recorded as it saves them (their images hold the weights drawn)."""
    from matplotlib.figure import Figure

    saved, savefig = [], Figure.savefig

    def recording_savefig(figure, *args, **kwargs):
        saved.append(figure)
        return savefig(figure, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", recording_savefig)
    return saved


def drawn_weights(figure) -> list[torch.Tensor]:
    """The weights of each heatmap of a figure, in the order of its axes (a colorbar's axes draw none)."""
    return [torch.from_numpy(axes.images[0].get_array().data) for axes in figure.axes if axes.images]


def test_attention_command_draws_the_kind_and_layer_asked_for_and_prints_the_alignment(
    checkpoint, tmp_path, capsys, monkeypatch
):
    """Each of --kind, --layer and --heads draws its own weights: those of `attention_maps` of the translation (the
    mean of the heads of one layer, or every layer and head), and the alignment printed is the drawn cross layer's."""
    pytest.importorskip("matplotlib", reason="plotting needs matplotlib: pip install 'hf-transformer[plot]'")
    model, tokenizer = reference_model(checkpoint)
    (maps,) = attention_maps(model, tokenizer, ["a dog runs"])
    saved = drawn_figures(monkeypatch)
    expected = {
        (): maps.cross_attentions[-1].mean(0),
        ("--layer", "0"): maps.cross_attentions[0].mean(0),
        ("--kind", "encoder"): maps.encoder_attentions[-1].mean(0),
        ("--kind", "encoder", "--layer", "0"): maps.encoder_attentions[0].mean(0),
        ("--kind", "decoder", "--layer", "-2"): maps.decoder_attentions[0].mean(0),
    }
    for options, weights in expected.items():
        main(["attention", str(checkpoint), "a dog runs", "-o", str(tmp_path / "map.png"), *options])
        (drawn,) = drawn_weights(saved[-1])
        torch.testing.assert_close(drawn, weights, msg=str(options))
        out = capsys.readouterr().out
        assert f"translation: {maps.translation}\n" in out
        assert f"alignment:   {format_alignment(alignment(maps, 0 if options == ('--layer', '0') else -1))}\n" in out
    assert not torch.allclose(expected[()], expected["--layer", "0"])  # the layers differ: the test tells them apart
    assert not torch.allclose(expected["--kind", "encoder"], expected["--kind", "encoder", "--layer", "0"])
    main(
        ["attention", str(checkpoint), "a dog runs", "-o", str(tmp_path / "heads.png"), "--heads", "--kind", "decoder"]
    )
    layers, heads = maps.decoder_attentions.shape[:2]
    assert len(drawn_weights(saved[-1])) == layers * heads
    for index, drawn in enumerate(drawn_weights(saved[-1])):
        torch.testing.assert_close(drawn, maps.decoder_attentions[index // heads, index % heads])
    assert (tmp_path / "map.png").read_bytes()[:4] == (tmp_path / "heads.png").read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["attention", str(checkpoint), "a dog", "--layer", "7"])
    assert "--layer 7: the model has 2 layers" in capsys.readouterr().err
    mistakes = {
        # The formats are matplotlib's, which differ between its releases.
        str(tmp_path / "map.txt"): "matplotlib writes no .txt images. End the name with one of .",
        "/proc/map.png": "-o /proc/map.png: cannot write there",
        str(tmp_path / "map.png" / "map.png"): "map.png/map.png: cannot write there (File exists)",
    }
    for output, message in mistakes.items():
        with pytest.raises(SystemExit):
            main(["attention", str(checkpoint), "a dog", "-o", output])
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err


def test_attention_command_draws_any_encoder_layer_of_a_deeper_encoder(tiny_tokenizer, tmp_path, capsys, monkeypatch):
    """--layer counts the layers of --kind; the printed alignment stays the last decoder layer's (fairseq's)."""
    pytest.importorskip("matplotlib", reason="plotting needs matplotlib: pip install 'hf-transformer[plot]'")
    model = tiny_model(tiny_tokenizer, encoder_layers=3, decoder_layers=1, max_position_embeddings=24)
    checkpoint = write_checkpoint(model, tiny_tokenizer, tmp_path / "deep_encoder.ckpt")
    image = tmp_path / "encoder.png"
    saved = drawn_figures(monkeypatch)
    main(["attention", str(checkpoint), "a dog runs", "--kind", "encoder", "--layer", "2", "-o", str(image)])
    (maps,) = attention_maps(*reference_model(checkpoint), ["a dog runs"])
    torch.testing.assert_close(drawn_weights(saved[-1])[0], maps.encoder_attentions[2].mean(0))
    assert f"alignment:   {format_alignment(alignment(maps, -1))}\n" in capsys.readouterr().out
    assert image.read_bytes()[:4] == b"\x89PNG"


def test_help_lists_the_commands_of_a_trained_model(capsys):
    main(["--help"])
    usage = capsys.readouterr().out
    assert all(f"\n  {command} " in usage for command in ("translate", "attention", "serve"))
    assert "predict" not in usage


HEAVY_MODULES = ("torch", "transformers", "lightning", "datasets", "huggingface_hub")


@pytest.mark.parametrize(
    "command", ["hf-transformer", "fit", "validate", "test", "export", "push", "translate", "attention", "serve"]
)
def test_every_help_answers_without_loading_torch_lightning_or_transformers(command):
    """Every command paid 6-8 s of CPU for its imports before printing its help; none of those modules loads now (a
    fresh interpreter, so that nothing this test session imported counts)."""
    argv = ["--help"] if command == "hf-transformer" else [command, "--help"]
    code = (
        "import contextlib, io, json, sys\n"
        "from lightning_modules.cli import main\n"
        "output = io.StringIO()\n"
        "with contextlib.redirect_stdout(output), contextlib.suppress(SystemExit):\n"
        f"    main({argv!r})\n"
        f"print(json.dumps([output.getvalue(), [name for name in {HEAVY_MODULES!r} if name in sys.modules]]))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    usage, loaded = json.loads(result.stdout)
    assert loaded == [] and "usage: hf-transformer" in usage, (loaded, result.stderr[-2000:])


def test_the_kept_help_of_the_trainer_commands_is_what_their_parser_prints():
    """`fit/validate/test --help` print text kept beside the parser; it must be the parser's (after a change to the
    options, `python -m lightning_modules.cli.help` writes it again). Compared word by word: the kept text names the
    package's folder by a placeholder, and a longer path wraps its lines elsewhere."""
    from lightning_modules.cli.help import kept_help, kept_versions, parser_help, parser_versions

    if kept_versions() != parser_versions():  # e.g. the test of the lowest releases pyproject.toml allows (.ci/floors)
        pytest.skip(f"the kept help was written under {kept_versions()}, and {parser_versions()} are installed")
    for command in ("fit", "validate", "test"):
        kept = kept_help(command)
        assert kept is not None, f"lightning_modules/cli/help/{command}.txt is missing"
        assert kept.split() == parser_help(command).split(), (
            f"the kept `{command} --help` differs from its parser's: run `python -m lightning_modules.cli.help`"
        )


def test_importing_the_package_loads_nothing_heavy_and_its_model_registers_on_first_use():
    """`import hf_transformer` (which every command imports for its errors) loads neither torch nor transformers; the
    first use of the model registers it with the Auto classes, and of `TranslationPipeline` the pipeline."""
    code = """
import sys
import hf_transformer
assert "torch" not in sys.modules and "transformers" not in sys.modules, "import hf_transformer loaded torch"
from transformers import AutoConfig, AutoModelForSeq2SeqLM
from transformers.pipelines import PIPELINE_REGISTRY
config = hf_transformer.TransformerConfig(vocab_size=16, d_model=8, encoder_layers=1, decoder_layers=1,
    encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=8, decoder_ffn_dim=8)
assert type(AutoConfig.for_model("vaswani_transformer")) is hf_transformer.TransformerConfig
assert type(AutoModelForSeq2SeqLM.from_config(config)) is hf_transformer.TransformerForConditionalGeneration
assert "translation" not in PIPELINE_REGISTRY.get_supported_tasks()
hf_transformer.TranslationPipeline
assert "translation" in PIPELINE_REGISTRY.get_supported_tasks()
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


# --- the attention map of every validation -----------------------------------------------------------------------

ATTENTION_RUN = """
trainer:
  callbacks:
    - class_path: lightning_modules.callbacks.attention_map.AttentionMap
  enable_progress_bar: false
  enable_model_summary: false
  num_sanity_val_steps: 1
  limit_val_batches: 1
  val_check_interval: 2
model:
  config: {d_model: 16, encoder_layers: 1, decoder_layers: 2, encoder_attention_heads: 2, decoder_attention_heads: 2,
           encoder_ffn_dim: 32, decoder_ffn_dim: 32, max_position_embeddings: 64}
  generation: {num_beams: 1}
data: {bpe_vocab_size: 60, synthetic_train_size: 64, synthetic_eval_size: 4, max_tokens: 256}
"""


@pytest.mark.slow
def test_every_validation_draws_the_attention_of_one_sentence_into_the_run_folder(run_dir):
    pytest.importorskip("matplotlib", reason="plotting needs matplotlib: pip install 'hf-transformer[plot]'")
    (run_dir / "attention.yaml").write_text(ATTENTION_RUN)
    main(["fit", "--config", str(DEMO), "--config", "attention.yaml", "--trainer.max_steps=4"])
    images = sorted(path.name for path in run_dir.glob("runs/demo/logs/version_*/attention/*.png"))
    assert images == ["step000002.png", "step000004.png"]  # not the sanity check's


def test_with_a_wandb_logger_the_map_is_a_wandb_image(tiny_tokenizer, monkeypatch, tmp_path):
    pytest.importorskip("matplotlib", reason="plotting needs matplotlib: pip install 'hf-transformer[plot]'")
    pytest.importorskip("wandb", reason="pip install 'hf-transformer[wandb]'")
    from types import SimpleNamespace

    from lightning.pytorch.loggers import WandbLogger

    from lightning_modules.callbacks.attention_map import AttentionMap

    logged = []
    monkeypatch.setattr(WandbLogger, "log_image", lambda self, key, images, step, **kwargs: logged.append((key, step)))
    logger = WandbLogger(offline=True, save_dir=str(tmp_path))
    trainer = SimpleNamespace(sanity_checking=False, is_global_zero=True, loggers=[logger], global_step=7)
    module = SimpleNamespace(model=tiny_model(tiny_tokenizer), tokenizer=tiny_tokenizer)
    module.model.generation_config.num_beams = 1
    AttentionMap(sentence="a dog").on_validation_end(trainer, module)
    assert logged == [("val/attention", 7)]
    assert not list(tmp_path.rglob("*.png"))


def test_names_that_moved_after_0_4_0_are_still_found_with_a_warning_naming_their_new_home():
    """The CTranslate2 runtime left export/ for decoding/, and `FormatCard` the model card for the formats' registry;
    code that imports them from where 0.4.0's docs showed them keeps working, told where they are now."""
    from hf_transformer.formats import FormatCard

    with pytest.warns(FutureWarning, match=r"import it from hf_transformer\.formats"):
        from hf_transformer.hub.model_card import FormatCard as old_card
    assert old_card is FormatCard
    pytest.importorskip("ctranslate2")
    from hf_transformer.decoding.ctranslate2 import CTranslate2Translator

    with pytest.warns(FutureWarning, match=r"import it from hf_transformer\.decoding\.ctranslate2"):
        from hf_transformer.export.ctranslate2 import CTranslate2Translator as old_runtime
    assert old_runtime is CTranslate2Translator

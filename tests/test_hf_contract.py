"""The Hugging Face contract, tested by transformers' own common model tests (`tests/upstream/`, from the sdist of
the installed release, unchanged), set up the way transformers sets them up for Marian."""

import contextlib
import copy
import unittest
from collections.abc import Callable, Iterator
from unittest import mock

import pytest
import torch
import upstream
from conftest import (
    DEMO,
    TINY_CONFIG,
    copy_task_batch,
    make_tiny_config,
    output_rows,
    parts_only_at_near_ties,
    trained_model,
    word_tokenizer,
)
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, CompileConfig, GenerationConfig
from transformers.exporters.exporter_dynamo import DynamoConfig, DynamoExporter
from transformers.exporters.runners import ModelRunner
from transformers.models.auto.modeling_auto import MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

upstream.fetch_upstream_tests()
SHARED_MIXINS = upstream.load_shared_mixins()

from upstream.generation.test_utils import GenerationTesterMixin  # noqa: E402
from upstream.test_configuration_common import ConfigTester  # noqa: E402
from upstream.test_modeling_common import ModelTesterMixin, ids_tensor  # noqa: E402

from hf_transformer import TransformerConfig, TransformerForConditionalGeneration, TransformerModel  # noqa: E402
from lightning_modules.cli import main  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _known_to_transformers():
    """The common tests find a class's role (base model, sequence-to-sequence head) by its name in transformers' own
    tables, where Marian is listed and a model outside the library is not: list ours for these tests."""
    model_type = TransformerConfig.model_type
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(MODEL_MAPPING_NAMES, model_type, TransformerModel.__name__)
        head = TransformerForConditionalGeneration.__name__
        patch.setitem(MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, model_type, head)
        yield


class TransformerModelTester:
    """Tiny configs and inputs for the common tests, as `MarianModelTester` makes them for Marian."""

    def __init__(self, parent, batch_size=13, seq_length=7, vocab_size=99, hidden_size=16, num_hidden_layers=2):
        self.parent = parent
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.is_training = True
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = 4
        self.intermediate_size = 4

    def get_config(self) -> TransformerConfig:
        return TransformerConfig(
            vocab_size=self.vocab_size,
            d_model=self.hidden_size,
            encoder_layers=self.num_hidden_layers,
            decoder_layers=self.num_hidden_layers,
            encoder_attention_heads=self.num_attention_heads,
            decoder_attention_heads=self.num_attention_heads,
            encoder_ffn_dim=self.intermediate_size,
            decoder_ffn_dim=self.intermediate_size,
            activation_function="gelu",
            dropout=0.1,
            attention_dropout=0.1,
            max_position_embeddings=20,
        )

    def prepare_config_and_inputs(self) -> tuple[TransformerConfig, dict]:
        config = self.get_config()
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(3)
        input_ids[:, -1] = config.eos_token_id
        decoder_input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        inputs = {
            "input_ids": input_ids,
            "attention_mask": input_ids.ne(config.pad_token_id),
            "decoder_input_ids": decoder_input_ids,
            "decoder_attention_mask": decoder_input_ids.ne(config.pad_token_id),
        }
        return config, inputs

    def prepare_config_and_inputs_for_common(self) -> tuple[TransformerConfig, dict]:
        return self.prepare_config_and_inputs()

    def create_and_check_decoder_model_past_large_inputs(self, config: TransformerConfig, inputs: dict) -> None:
        """Marian's check of its decoder alone: three new tokens, some of them masked, read with the cache of a first
        forward pass give the outputs of one pass over all the tokens, whichever name the cache is passed by. Compared
        where that pass computes them: not after a row's last unmasked token, where it leaves zeros."""
        model = TransformerModel(config).eval()
        encoder_hidden_states = model.get_encoder()(inputs["input_ids"], inputs["attention_mask"]).last_hidden_state
        decoder = model.get_decoder()
        source = {"encoder_hidden_states": encoder_hidden_states, "encoder_attention_mask": inputs["attention_mask"]}
        input_ids, attention_mask = inputs["decoder_input_ids"], torch.ones_like(inputs["decoder_input_ids"])
        next_tokens = ids_tensor((self.batch_size, 3), config.vocab_size)
        next_mask = ids_tensor((self.batch_size, 3), 2)
        next_attention_mask = torch.cat([attention_mask, next_mask], dim=-1)
        full = decoder(torch.cat([input_ids, next_tokens], dim=-1), attention_mask=next_attention_mask, **source)
        computed = (next_attention_mask.flip(-1).cumsum(-1).flip(-1) > 0)[:, -3:]
        self.parent.assertTrue(computed.any())
        for name in ("past_key_values", "cache"):
            first = decoder(input_ids, attention_mask=attention_mask, use_cache=True, **source)
            cache = first.to_tuple()[1]
            continued = decoder(next_tokens, attention_mask=next_attention_mask, **source, **{name: cache})
            self.parent.assertEqual(continued.last_hidden_state.shape[1], next_tokens.shape[1])
            torch.testing.assert_close(
                continued.last_hidden_state[computed], full.last_hidden_state[:, -3:][computed], atol=1e-3, rtol=0
            )


# generate() without num_beams decodes as the model's generation config says: ours saves the paper's beam 4 (6.1), as
# Marian's checkpoints on the Hub save it (Helsinki-NLP/opus-mt-*), and a MarianMTModel given num_beams=4 fails
# these tests the same way, while a new one, as Marian's tester builds it, decodes greedily.
SAVED_BEAM_SEARCH = (
    "decodes with the saved default, beam 4 here: transformers' beam search never compiles the forward, and continuing "
    "from the cache it returns is not one beam search; passes for the model that saves greedy search, as a new "
    "MarianMTModel does (test_upstream_generation_tests_with_transformers_default_decoding)"
)


class TransformerModelTest(ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    all_model_classes = (TransformerModel, TransformerForConditionalGeneration)
    is_encoder_decoder = True
    test_missing_keys = False

    def setUp(self):
        upstream.seed_random_inputs(0)
        self.model_tester = TransformerModelTester(self)
        self.config_tester = ConfigTester(self, config_class=TransformerConfig, has_text_modality=False)
        # The shared GenerationTesterMixin (transformers 5.16) asks each model class whether it keeps a recurrent state
        # (which assisted decoding and packed inputs cannot use), and 5.25's PreTrainedModel no longer defines the
        # attribute. Ours keeps none: False, the default that 5.16's PreTrainedModel gave.
        for model_class in self.all_model_classes:
            if not hasattr(model_class, "_is_stateful"):
                patcher = mock.patch.object(model_class, "_is_stateful", False, create=True)
                patcher.start()
                self.addCleanup(patcher.stop)

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_decoder_model_past_with_large_inputs(self):
        self.model_tester.create_and_check_decoder_model_past_large_inputs(
            *self.model_tester.prepare_config_and_inputs()
        )

    @unittest.skip(
        "asks that the loss given labels be the plain cross-entropy of the returned logits, differentiable through "
        "them; ours is the paper's label-smoothed loss (config.label_smoothing, section 5.4), computed chunk by chunk "
        "from the decoder's outputs so that all the logits are never held (hf_transformer/loss.py), and returns logits "
        "with labels only when asked (return_logits=True). test_modeling.py checks that loss against F.cross_entropy "
        "with the same smoothing on those logits, unshifted labels included."
    )
    def test_encoder_decoder_loss_no_double_shift(self):
        pass

    @unittest.skip(SAVED_BEAM_SEARCH)
    def test_generate_compile_model_forward_fullgraph(self):
        pass

    @unittest.skip(SAVED_BEAM_SEARCH)
    def test_static_cache_no_recompile_with_smaller_length(self):
        pass

    @unittest.skip(SAVED_BEAM_SEARCH)
    def test_generate_continue_from_past_key_values(self):
        pass


class GreedyByDefault(TransformerForConditionalGeneration):
    """The model with transformers' default decoding, greedy search, as a new `MarianMTModel` has it."""

    def __init__(self, config: TransformerConfig):
        super().__init__(config)
        self.generation_config = GenerationConfig.from_model_config(config)


class UnpaddedPromptTester(TransformerModelTester):
    """Decoder prompts without padding: a padded position inside the prompt that `generate()` continues makes upstream's
    `test_generate_continue_from_past_key_values` fail for a new `MarianMTModel` too (17 of 30 draws of the inputs),
    and for neither model without one (30 of 30 pass)."""

    def prepare_config_and_inputs(self) -> tuple[TransformerConfig, dict]:
        config, inputs = super().prepare_config_and_inputs()
        inputs["decoder_input_ids"] = inputs["decoder_input_ids"].clamp(3)  # no special tokens, as for the source
        inputs["decoder_attention_mask"] = torch.ones_like(inputs["decoder_input_ids"])
        return config, inputs


class GreedyByDefaultTest(TransformerModelTest):
    __test__ = False  # run for the tests that `SAVED_BEAM_SEARCH` names, below
    all_model_classes = (GreedyByDefault,)

    def setUp(self):
        super().setUp()
        self.model_tester = UnpaddedPromptTester(self)


def test_upstream_tests_draw_the_same_inputs_in_every_run():
    """Upstream's `ids_tensor` draws from an unseeded generator: each test's setUp seeds it, so that a test that fails
    on some inputs fails on every run, not on some."""
    drawn = []
    for _ in range(2):
        case = TransformerModelTest("test_config")
        case.setUp()
        drawn.append(case.model_tester.prepare_config_and_inputs()[1])
    assert all(torch.equal(drawn[0][name], drawn[1][name]) for name in drawn[0])


# torch 2.8 and 2.9 compile generate()'s forward a second time, the guard on the static cache's key tensor failing
# (`___check_obj_id`), under transformers 5.23 and 5.25 alike; on 2.10, 2.11, 2.12 and 2.13 these two pass.
RECOMPILES_BEFORE_2_10 = pytest.mark.skipif(
    torch.__version__ < "2.10", reason="torch < 2.10 recompiles the compiled forward once (a static cache guard)"
)


@pytest.mark.skipif(not SHARED_MIXINS, reason=f"upstream's GenerationTesterMixin is missing: {upstream.SHARED_HINT}")
@pytest.mark.parametrize(
    "name",
    [
        pytest.param("test_generate_compile_model_forward_fullgraph", marks=RECOMPILES_BEFORE_2_10),
        pytest.param("test_static_cache_no_recompile_with_smaller_length", marks=RECOMPILES_BEFORE_2_10),
        "test_generate_continue_from_past_key_values",
    ],
)
def test_upstream_generation_tests_with_transformers_default_decoding(name):
    """Upstream's tests that decode with the saved default pass on the model that saves greedy search, as Marian's
    tester builds Marian: `generate()` compiles the forward with a static cache and gives the default cache's outputs,
    reuses the compiled call for a shorter generation without recompiling, and continues from a returned cache."""
    case = GreedyByDefaultTest(name)
    case.setUp()
    getattr(GenerationTesterMixin, name)(case)


# Beside upstream's tests, on a small trained model whose outputs mean something: generate() and export as users call
# them (see tests/upstream/README.md); each works, or is refused with a clear message.


@pytest.fixture(scope="module")
def copy_model() -> TransformerForConditionalGeneration:
    """A model trained to copy (`trained_model`): outputs that vary from row to row and end at different lengths."""
    torch.manual_seed(0)
    return trained_model(make_tiny_config())


def sources(seed: int, size: int = 4) -> dict[str, torch.Tensor]:
    source, attention_mask, _ = copy_task_batch(size, TINY_CONFIG["vocab_size"], torch.Generator().manual_seed(seed))
    return {"input_ids": source, "attention_mask": attention_mask}


def compiled_decoding() -> CompileConfig:
    """`generate()` compiles its decoding step only on GPUs unless told otherwise: `_compile_all_devices` is how
    transformers' own tests compile it on a CPU."""
    compile_config = CompileConfig(fullgraph=True)
    compile_config._compile_all_devices = True
    return compile_config


@pytest.mark.parametrize("num_beams", [1, 4])
def test_a_static_cache_gives_the_default_caches_tokens(copy_model, num_beams):
    # float64: attention over the static cache's whole length sums in another order, and in float32 a near tie could
    # go either way.
    model = copy.deepcopy(copy_model).to(torch.float64)
    inputs = {**sources(seed=1), "num_beams": num_beams, "max_new_tokens": 10}
    assert torch.equal(model.generate(**inputs, cache_implementation="static"), model.generate(**inputs))


@pytest.mark.slow
def test_compiled_decoding_gives_the_default_caches_tokens(copy_model):
    """generate() compiles the decoding step of greedy search and sampling (transformers 5.24's beam search calls the
    model uncompiled) when the cache is static: the whole step in one graph (`fullgraph=True`)."""
    # float64: the compiled graph sums in another order, and in float32 a near tie could go either way.
    model = copy.deepcopy(copy_model).to(torch.float64)
    inputs = {**sources(seed=1), "num_beams": 1, "max_new_tokens": 10}
    compiled = model.generate(**inputs, cache_implementation="static", compile_config=compiled_decoding())
    assert hasattr(model, "_compiled_call"), "generate() did not compile its decoding step"
    assert torch.equal(compiled, model.generate(**inputs))


def test_from_pretrained_takes_a_state_dict_a_device_map_and_a_dtype(copy_model, tmp_path):
    inputs = {**sources(seed=2), "num_beams": 1, "max_new_tokens": 10}
    expected = copy_model.generate(**inputs)
    state_dict = copy_model.state_dict()
    loaded = TransformerForConditionalGeneration.from_pretrained(None, config=copy_model.config, state_dict=state_dict)
    assert torch.equal(loaded.generate(**inputs), expected)
    copy_model.save_pretrained(tmp_path)
    assert torch.equal(AutoModelForSeq2SeqLM.from_pretrained(tmp_path, device_map="cpu").generate(**inputs), expected)
    assert AutoModelForSeq2SeqLM.from_pretrained(tmp_path, dtype="auto").dtype == torch.float32  # as saved
    for dtype in ({"dtype": torch.bfloat16}, {"torch_dtype": torch.bfloat16}):  # torch_dtype: the name before v5
        model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, **dtype)
        assert {parameter.dtype for parameter in model.parameters()} == {torch.bfloat16}
        assert model.generate(**inputs).shape[0] == len(expected)


def test_generate_returns_what_it_is_asked_for(copy_model):
    inputs = {**sources(seed=3), "max_new_tokens": 6, "min_new_tokens": 6}
    beams = copy_model.generate(
        **inputs, num_beams=4, num_return_sequences=3, output_scores=True, return_dict_in_generate=True
    )
    assert beams.sequences.shape == (4 * 3, 7) and beams.sequences_scores.shape == (4 * 3,)
    assert len(beams.scores) == 6 and beams.scores[0].shape == (4 * 4, TINY_CONFIG["vocab_size"])
    greedy = copy_model.generate(
        **inputs,
        num_beams=1,
        output_scores=True,
        output_logits=True,
        output_attentions=True,
        output_hidden_states=True,
        return_dict_in_generate=True,
    )
    assert torch.equal(torch.stack(greedy.scores).argmax(-1).T, greedy.sequences[:, 1:])  # after min_new_tokens
    assert len(greedy.logits) == 6 and greedy.logits[0].shape == (4, TINY_CONFIG["vocab_size"])
    assert len(greedy.decoder_attentions) == len(greedy.cross_attentions) == len(greedy.decoder_hidden_states) == 6
    assert len(greedy.encoder_attentions) == TINY_CONFIG["encoder_layers"]


def test_assisted_decoding_gives_greedy_search_tokens(copy_model):
    """float64: assisted and prompt-lookup decoding check several candidate tokens in one forward pass, which sums in
    another order than one token at a time, and in float32 a near tie could go either way."""
    model = copy.deepcopy(copy_model).to(torch.float64)
    torch.manual_seed(1)
    config = TransformerConfig(**{**TINY_CONFIG, "encoder_layers": 1, "decoder_layers": 1})
    assistant = trained_model(config, steps=30).to(torch.float64)
    inputs = sources(seed=4)
    for row in range(len(inputs["input_ids"])):  # transformers assists one sentence at a time
        source = inputs["input_ids"][row : row + 1, : int(inputs["attention_mask"][row].sum())]
        greedy = model.generate(source, num_beams=1, max_new_tokens=10)
        assert torch.equal(model.generate(source, num_beams=1, max_new_tokens=10, assistant_model=assistant), greedy)
        assert torch.equal(model.generate(source, num_beams=1, max_new_tokens=10, prompt_lookup_num_tokens=3), greedy)
    with pytest.raises(ValueError, match="only supported for batch_size = 1"):
        model.generate(**inputs, num_beams=1, assistant_model=assistant)


def exported_program(runner: ModelRunner) -> Callable:
    """Call an exported program with the model's keyword arguments, leaving out those it was not traced with
    (`use_cache`, `return_dict`)."""
    return lambda **kwargs: runner(**{key: value for key, value in kwargs.items() if key in runner.metadata.kwargs})


@contextlib.contextmanager
def programs_in_place(
    model: TransformerForConditionalGeneration, encoder: ModelRunner, prefill: ModelRunner, decode: ModelRunner
) -> Iterator[None]:
    """`generate()` runs exported programs in place of the model's own forward passes: the encoder's, then the
    decoder's first step (empty cache) and its later steps."""
    prefill, decode = exported_program(prefill), exported_program(decode)

    def decoder_step(**kwargs):
        return (prefill if kwargs["cache"].get_seq_length() == 0 else decode)(**kwargs)

    with (
        mock.patch.object(model, "forward", decoder_step),
        mock.patch.object(model.get_encoder(), "forward", exported_program(encoder)),
    ):
        yield


@pytest.mark.slow
def test_exported_prefill_and_decode_programs_give_generates_tokens(copy_model):
    """transformers' exporter traces a real `generate()` into two programs with torch.export: the decoder's first
    step (prefill) and its later steps (decode); the encoder, which `generate()` runs before them, is exported as a
    third. Driven by `generate()` in place of the model, they give its tokens on other sources. A static cache sizes
    the self-attention keys and values once; the tree of a cache also records the batch size and the source length
    (transformers 5.24), so the programs take batches of the traced shape: pad to it. In float64: the programs run a
    static cache, whose attention sums in another order than the default cache's, and in float32 a near tie could go
    either way."""
    copy_model = copy.deepcopy(copy_model).to(torch.float64)
    generation_config = copy.deepcopy(copy_model.generation_config)
    generation_config.update(num_beams=1, cache_implementation="static", max_cache_len=16)
    exporter, dynamic = DynamoExporter(), DynamoConfig(dynamic=True)
    traced = sources(seed=1)
    decoder = exporter.export_for_generation(copy_model, traced, dynamic, generation_config=generation_config)
    encoder = exporter.export(copy_model.get_encoder(), traced, dynamic)
    programs = (encoder.runners["model"], decoder.runners["prefill"], decoder.runners["decode"])
    for seed in (2, 3, 4):  # other sources and other padding, the traced shape
        inputs = {**sources(seed), "max_new_tokens": 12}
        expected = copy_model.generate(**inputs, num_beams=1)
        with programs_in_place(copy_model, *programs):
            assert torch.equal(copy_model.generate(**inputs, generation_config=generation_config), expected)


@pytest.mark.slow
def test_onnx_export_folder_runs_on_onnx_runtime_and_gives_generates_tokens(copy_model, tmp_path):
    """`to_onnx` (`export --format onnx`) writes the encoder's and the decoder's programs, converted by torch's own
    ONNX exporter, into a folder that transformers' `ExportedModel.from_pretrained` loads on ONNX Runtime; driven by
    `generate()`, they give its tokens on sources of the shape they were traced for."""
    for module in ("onnxruntime", "onnxscript"):
        pytest.importorskip(module, reason="the ONNX export needs the onnx extra: pip install 'hf-transformer[onnx]'")
    from transformers.exporters import ExportedModel

    from hf_transformer.export.onnx import PROGRAMS, to_onnx

    batch_size, source_length = sources(seed=1)["input_ids"].shape
    folder = to_onnx(
        copy_model,
        word_tokenizer(copy_model.config.vocab_size),
        tmp_path / "onnx",
        batch_size=batch_size,
        source_length=source_length,
        max_length=16,
    )
    exported = ExportedModel.from_pretrained(folder)
    assert exported.export_format == "onnx" and list(exported.components) == list(PROGRAMS)
    assert sorted(path.suffix for path in folder.glob("*.onnx")) == [".onnx"] * len(PROGRAMS)
    assert AutoTokenizer.from_pretrained(folder).model_max_length == source_length
    eos = copy_model.config.eos_token_id
    for seed in (2, 3, 4):
        inputs = {**sources(seed), "max_new_tokens": 12}
        expected = output_rows(copy_model.generate(**inputs, num_beams=1), eos)
        with programs_in_place(copy_model, *map(exported.runners.get, PROGRAMS)):
            onnx_rows = output_rows(copy_model.generate(**inputs, generation_config=exported.generation_config), eos)
        # ONNX Runtime's kernels sum in another order than torch's: equal tokens but where two score within rounding.
        for source, mask, ours, theirs in zip(
            inputs["input_ids"], inputs["attention_mask"], expected, onnx_rows, strict=True
        ):
            assert parts_only_at_near_ties(copy_model, source[mask.bool()].tolist(), ours, theirs), (ours, theirs)

    with pytest.raises(ValueError, match="source_length=999: the model takes 2 to 64 tokens"):
        to_onnx(copy_model, word_tokenizer(copy_model.config.vocab_size), tmp_path / "long", source_length=999)


@pytest.mark.slow
def test_export_command_writes_onnx_programs_from_a_checkpoint(run_dir, capsys):
    """`hf-transformer export CHECKPOINT FOLDER --format onnx` with the shape options: the programs of that shape, the
    configs and the tokenizer; the shape options with another format are refused."""
    for module in ("onnxruntime", "onnxscript"):
        pytest.importorskip(module, reason="the ONNX export needs the onnx extra: pip install 'hf-transformer[onnx]'")
    from transformers.exporters import ExportedModel

    main(["fit", "--config", str(DEMO), "--config", "tiny.yaml", "--trainer.max_steps=2"])
    checkpoint = str(run_dir / "runs/demo/checkpoints/last.ckpt")
    main(["export", checkpoint, "onnx", "--format", "onnx", "--batch-size", "2", "--source-length", "12"])
    exported = ExportedModel.from_pretrained(run_dir / "onnx")
    encoder = exported.runners["encoder"]
    inputs = {"input_ids": torch.full((2, 12), 5), "attention_mask": torch.ones(2, 12, dtype=torch.long)}
    assert encoder(**inputs).last_hidden_state.shape == (2, 12, exported.config.d_model)
    assert exported.generation_config.max_cache_len == exported.config.max_position_embeddings

    with pytest.raises(SystemExit):
        main(["export", checkpoint, "marian", "--format", "marian", "--source-length", "12"])
    assert "--source-length applies to --format onnx only" in capsys.readouterr().err

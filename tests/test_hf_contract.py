"""The Hugging Face contract, tested by transformers' own common model tests (`tests/upstream/`, from the sdist of
the installed release, unchanged), set up the way transformers sets them up for Marian."""

import unittest

import pytest
import upstream
from transformers.models.auto.modeling_auto import MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

upstream.fetch_upstream_tests()

from upstream.generation.test_utils import GenerationTesterMixin  # noqa: E402
from upstream.test_configuration_common import ConfigTester  # noqa: E402
from upstream.test_modeling_common import ModelTesterMixin, ids_tensor  # noqa: E402

from hf_transformer import TransformerConfig, TransformerForConditionalGeneration, TransformerModel  # noqa: E402


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


class TransformerModelTest(ModelTesterMixin, GenerationTesterMixin, unittest.TestCase):
    all_model_classes = (TransformerModel, TransformerForConditionalGeneration)
    is_encoder_decoder = True
    test_missing_keys = False

    def setUp(self):
        self.model_tester = TransformerModelTester(self)
        self.config_tester = ConfigTester(self, config_class=TransformerConfig, has_text_modality=False)

    def test_config(self):
        self.config_tester.run_common_tests()

"""Stands in for transformers' `tests/utils/test_configuration_utils.py`, which the PyPI sdist does not ship:
`ConfigTester.check_config_arguments_init` sets each of these fields of `PreTrainedConfig` to a value other than its
default and checks that the config keeps it."""

config_common_kwargs = {
    "output_hidden_states": True,
    "return_dict": False,
    "dtype": "float16",
    "chunk_size_feed_forward": 5,
    "architectures": ["TransformerForConditionalGeneration"],
    "id2label": {0: "label"},
    "label2id": {"label": "0"},
    "problem_type": "regression",
}

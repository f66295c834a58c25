"""Stands in for transformers' `tests/generation/test_utils.py`, which the PyPI sdist does not ship:
`test_modeling_common.py` imports its `GenerationTesterMixin` and checks that the tester of a model that can generate
derives from it. The `generate()` tests of this package are in `tests/test_hf_contract.py`."""


class GenerationTesterMixin:
    """Marks a tester that runs `generate()` tests: see the module docstring."""

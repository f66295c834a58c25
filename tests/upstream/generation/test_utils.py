"""Stands in for transformers' `tests/generation/test_utils.py` where the folder UPSTREAM_TESTS_DIR names is absent
(`upstream.load_shared_mixins`): the PyPI sdist does not ship it, and `test_modeling_common.py` imports its
`GenerationTesterMixin`."""

import unittest


class GenerationTesterMixin:
    """Skips, saying why, in place of upstream's `generate()` tests."""

    def test_generation_tester_mixin(self):
        raise unittest.SkipTest(
            "transformers' GenerationTesterMixin is not in the PyPI sdist: to run its generate() tests, set "
            "UPSTREAM_TESTS_DIR to a copy of transformers' tests/ folder (its generation/ and exporters/)"
        )

"""Stands in for transformers' `tests/generation/test_utils.py` where `../shared/upstream-tests/` is absent
(`upstream.load_shared_mixins`): the PyPI sdist does not ship it, and `test_modeling_common.py` imports its
`GenerationTesterMixin`."""

import unittest


class GenerationTesterMixin:
    """Skips, saying why, in place of upstream's `generate()` tests."""

    def test_generation_tester_mixin(self):
        raise unittest.SkipTest(
            "transformers' GenerationTesterMixin is not in the PyPI sdist: its generate() tests run from "
            "../shared/upstream-tests/generation/test_utils.py, which is absent here"
        )

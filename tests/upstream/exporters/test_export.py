"""Stands in for transformers' `tests/exporters/test_export.py`, which the PyPI sdist does not ship:
`ModelTesterMixin` derives from its `ExportTesterMixin`. Export is tested in `tests/test_hf_contract.py`."""


class ExportTesterMixin:
    """No upstream export tests: see the module docstring."""

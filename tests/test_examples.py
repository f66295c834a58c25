"""The example notebook runs top to bottom in a fresh kernel, as a person runs it, and shows what it says it shows."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_quickstart_notebook_runs_top_to_bottom(tmp_path):
    """examples/quickstart.ipynb: install (skipped here: installed), train the demo briefly, export and translate, draw
    the attention, load the export with plain transformers; every cell runs, in a folder of its own, and none prints
    a warning."""
    nbformat = pytest.importorskip("nbformat", reason="the notebook runner: pip install -e '.[dev]'")
    nbclient = pytest.importorskip("nbclient", reason="the notebook runner: pip install -e '.[dev]'")
    pytest.importorskip("ipykernel", reason="the notebook's kernel: pip install -e '.[dev]'")
    pytest.importorskip("matplotlib", reason="the notebook draws: pip install 'hf-transformer[plot]'")
    notebook = nbformat.read(ROOT / "examples" / "quickstart.ipynb", as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, where a cell fails

    outputs = {index: cell.outputs for index, cell in enumerate(notebook.cells) if cell.cell_type == "code"}
    printed = {index: "".join(output.get("text", "") for output in cells) for index, cells in outputs.items()}
    assert not [index for index, text in printed.items() if "Warning" in text or "warning:" in text], printed
    assert (tmp_path / "exports" / "demo" / "config.json").is_file()

    def result(marker: str):
        """The value the cell whose code holds `marker` ends on."""
        index = next(index for index, cell in enumerate(notebook.cells) if marker in cell.source)
        return next(output for output in outputs[index] if output.output_type == "execute_result")["data"]

    translations = ast.literal_eval(result("translate(model")["text/plain"])
    assert len(translations) == 3 and all(isinstance(text, str) for text in translations)
    assert "image/png" in result("plot_attention(maps)")
    plain = ast.literal_eval(result("AutoModelForSeq2SeqLM.from_pretrained")["text/plain"])
    assert len(plain) == 2 and all(isinstance(text, str) for text in plain)  # loaded and decoded by transformers

"""Sphinx configuration of hf-transformer's documentation (`python -m sphinx -W -n docs docs/_build/html`).

Pages are Markdown (MyST). Some of their content is generated at build time, where a page holds a marker line:
- `<!-- generated: table NAME -->`: a results table from `benchmarks/results/*.json` (`docs/results_tables.py`);
- `<!-- generated: plot NAME -->`: a plot of the same JSON (`tables.PLOTS`), drawn into `_generated/NAME.png`;
- `<!-- generated: help COMMAND -->`: the `--help` of `hf-transformer COMMAND`, as its parser prints it.
The API and configuration references come from the docstrings (autodoc).
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))

import results_tables as tables  # noqa: E402  (docs/results_tables.py: the tables and plots of the results pages)

project = "hf-transformer"
author = "hf-transformer contributors"
copyright = "hf-transformer contributors"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode"]
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_generated"]
# Code blocks wrap their long lines rather than hide them behind a scrollbar, and tables fit the column.
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_theme = "furo"
html_title = "hf-transformer"
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_inherit_docstrings = False  # the methods Hugging Face's classes document are theirs
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# Types from other libraries that autodoc names in signatures: no page of theirs in this site to link to.
nitpick_ignore_regex = [
    (
        r"py:.*",
        r"(torch|transformers|lightning|datasets|tokenizers|huggingface_hub|pathlib|numpy|fastapi|collections)\..*",
    ),
    (r"py:class", r"GenerationMixin|PreTrainedTokenizer(Base|Fast)?|Module|Figure|Kind|CTranslate2Translator"),
    # A type named as text where importing it would load torch (the export registry answers `export --help`).
    (r"py:class", r"TransformerForConditionalGeneration"),
]

MARKER = re.compile(r"^<!-- generated: (table|plot|help) ([\w-]+) -->$", re.MULTILINE)
GENERATED = Path(__file__).resolve().parent / "_generated"  # the plots, drawn at each build (not in git)


def help_text(command: str) -> str:
    """What `hf-transformer COMMAND --help` prints, 80 columns wide, naming the package's files by their place in
    the repository."""
    from lightning_modules.cli.help import HERE, parser_help

    return parser_help(command).replace(HERE, "lightning_modules/cli").rstrip()


def generated(match: re.Match) -> str:
    kind, name = match.groups()
    if kind == "table":
        return tables.table(name)
    if kind == "plot":
        tables.plot(name, GENERATED / f"{name}.png")
        alt = " ".join(tables.PLOTS[name].__doc__.split(". ")[0].replace("`", "").split())
        return f"![{alt}](_generated/{name}.png)"
    return f"```text\n{help_text(name)}\n```"


def fill_markers(app, docname: str, source: list[str]) -> None:
    source[0] = MARKER.sub(generated, source[0])


def setup(app):
    app.connect("source-read", fill_markers)
    return {"parallel_read_safe": True}

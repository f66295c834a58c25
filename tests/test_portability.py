"""A saved model loads under the transformers its users have: every release from the floor that `pyproject.toml`
claims, tested at the floor itself and at 5.17 (the release on common GPU images), each installed with its own
dependencies into a separate folder; an older release stops with a message naming the version to install."""

import importlib.util
import re
import shutil
import subprocess
import sys
from importlib.metadata import PathDistribution
from pathlib import Path

import pytest
import torch
from conftest import RECORDED, assert_continues_under_both_cache_names, load_without_the_package
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from hf_transformer import TransformerForConditionalGeneration
from hf_transformer.model.configuration_transformer import MIN_TRANSFORMERS_VERSION

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
# Installs are kept between runs (about 250 MB and 15 s each): a fresh machine downloads them once.
INSTALLS = Path.home() / ".cache" / "hf-transformer-tests"
UNREACHABLE = ("Could not find a version", "No matching distribution", "NewConnectionError", "Temporary failure")
# Packages that the environment's transformers requires and an older release only imports where they are installed,
# failing with today's versions (transformers 5.4 constructs kernels' LayerRepository without the revision that
# kernels 0.17.2, 0.18.3 and 0.19.1 ask for, tried 2026-12-04). A user of that release has them only if installed by
# hand: where the release does not require one, a package of the same name in its folder, first on the path, hides it.
OPTIONAL_FOR_OLDER_RELEASES = ("kernels",)


def install_transformers(version: str) -> str:
    """A folder holding transformers==version and the dependencies that release asks for (torch stays the
    environment's), or skip the test saying why when the package registry cannot be reached."""
    folder = INSTALLS / f"transformers-{version}"
    if (folder / "complete").exists():
        hide_what_the_release_does_not_require(folder, version)
        return str(folder)
    pip_install = [sys.executable, "-m", "pip", "install", "-q", "--upgrade"]  # --upgrade: over a broken install
    result = subprocess.run(
        [*pip_install, "--target", str(folder), f"transformers=={version}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0:
        if any(message in result.stderr for message in UNREACHABLE):
            pytest.skip(f"cannot install transformers=={version} from the package registry: {result.stderr[-300:]}")
        raise AssertionError(result.stderr[-3000:])
    (folder / "complete").touch()
    hide_what_the_release_does_not_require(folder, version)
    return str(folder)


def hide_what_the_release_does_not_require(folder: Path, version: str) -> None:
    """Hide from transformers==version in `folder` each of `OPTIONAL_FOR_OLDER_RELEASES` that its metadata does not
    require (extras aside), as if it were not installed."""
    requirements = map(Requirement, PathDistribution(folder / f"transformers-{version}.dist-info").requires or [])
    required = {
        canonicalize_name(requirement.name)
        for requirement in requirements
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""})
    }
    for name in OPTIONAL_FOR_OLDER_RELEASES:
        if name in required:
            continue
        if importlib.util.find_spec(name) is None:  # not installed here: nothing to hide, and a stub would be found
            shutil.rmtree(folder / name, ignore_errors=True)  # (one left by a run in an environment that has it)
            continue
        (folder / name).mkdir(exist_ok=True)
        (folder / name / "__init__.py").write_text(
            f"raise ImportError('{name} is hidden: transformers=={version} does not require it')\n"
        )


@pytest.fixture
def saved_model(tiny_config, tmp_path) -> tuple[Path, TransformerForConditionalGeneration]:
    model = TransformerForConditionalGeneration(tiny_config).eval()
    model.save_pretrained(tmp_path / "model")
    return tmp_path / "model", model


def test_pyproject_claims_the_tested_floor():
    (requirement,) = re.findall(r'"transformers>=([\d.]+),<6"', PYPROJECT.read_text())
    assert requirement == MIN_TRANSFORMERS_VERSION


@pytest.mark.slow
@pytest.mark.parametrize("version", [f"{MIN_TRANSFORMERS_VERSION}.0", "5.17.0"])
def test_remote_code_gives_identical_outputs_under_older_transformers(version, saved_model, tiny_config):
    """Both sides in float64: the older release's generate() and attention functions sum in their own order, and in
    float32 a near tie in beam search could go either way; in float64 the same tokens win."""
    folder, model = saved_model
    model = model.double()
    source = torch.randint(4, tiny_config.vocab_size, (3, 9))
    target = torch.randint(4, tiny_config.vocab_size, (3, 7))
    pythonpath = install_transformers(version)
    remote = load_without_the_package(folder, source, target, pythonpath=pythonpath, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(
            remote["logits"], model(input_ids=source, decoder_input_ids=target).logits, atol=1e-6, rtol=0
        )
        # Recorded by that release's `capture_outputs` (transformers.utils.output_capturing, from 5.4 on).
        outputs = model(input_ids=source, decoder_input_ids=target, output_attentions=True, output_hidden_states=True)
    for name in RECORDED:
        torch.testing.assert_close(remote["recorded"][name], torch.stack(getattr(outputs, name)), atol=1e-6, rtol=0)
    assert torch.equal(remote["beams"], model.generate(source, max_new_tokens=5))
    assert_continues_under_both_cache_names(remote)


@pytest.mark.slow
def test_a_release_below_the_floor_is_told_which_version_to_install(saved_model, tiny_config):
    folder, _ = saved_model
    ids = torch.randint(4, tiny_config.vocab_size, (1, 4))
    error = load_without_the_package(folder, ids, ids, pythonpath=install_transformers("5.3.0"), expect_failure=True)
    assert f"needs transformers>={MIN_TRANSFORMERS_VERSION}, found 5.3.0" in error
    assert f"pip install -U 'transformers>={MIN_TRANSFORMERS_VERSION},<6'" in error

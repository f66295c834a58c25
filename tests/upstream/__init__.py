"""transformers' own common model tests, run against this package by `tests/test_hf_contract.py` (see README.md)."""

import importlib.util
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import transformers
from filelock import FileLock

HERE = Path(__file__).resolve().parent
# The files of transformers' tests/ that the PyPI sdist ships and that the contract tests run, unchanged.
UPSTREAM_FILES = ("test_modeling_common.py", "test_configuration_common.py")
# Downloads are kept between runs (10 MB): a fresh machine fetches them once.
DOWNLOADS = Path.home() / ".cache" / "hf-transformer-tests"
UNREACHABLE = ("Could not find a version", "No matching distribution", "NewConnectionError", "Temporary failure")
# transformers' generation and export test mixins, which the sdist does not ship, lie unchanged in the folder that
# UPSTREAM_TESTS_DIR names (by default ../shared/upstream-tests beside the checkout, with their source and revision):
# transformers' tests/ folder of a release, or a copy of its generation/ and exporters/. The stand-ins in generation/
# and exporters/ take their place where that folder is absent. Module name here -> file there; the first is imported
# by the second.
SHARED = Path(os.environ.get("UPSTREAM_TESTS_DIR") or HERE.parents[2] / "shared" / "upstream-tests")
# What a skipped test says to run these tests.
SHARED_HINT = (
    "set UPSTREAM_TESTS_DIR to a copy of transformers' tests/ folder (its generation/ and exporters/, from the "
    "transformers release installed)"
)
SHARED_MIXINS = {
    "exporters.test_export": "exporters/test_export.py",
    "generation.test_utils": "generation/test_utils.py",
}


def fetch_upstream_tests(version: str = transformers.__version__) -> None:
    """Put `UPSTREAM_FILES` of the transformers `version` sdist (the installed release by default) beside this file,
    unchanged, or skip the calling test module saying why when the package registry cannot be reached. Under a lock:
    pytest-xdist's workers all import the test module at once, and on a first run each would download and extract the
    files while the others read them half written."""
    DOWNLOADS.mkdir(parents=True, exist_ok=True)
    with FileLock(DOWNLOADS / "fetch.lock"):
        _fetch_upstream_tests(version)


def _fetch_upstream_tests(version: str) -> None:
    marker = HERE / ".version"
    if marker.exists() and marker.read_text() == version and all((HERE / name).exists() for name in UPSTREAM_FILES):
        return
    sdist = DOWNLOADS / f"transformers-{version}.tar.gz"
    if not sdist.exists():
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(DOWNLOADS)]
            + [f"transformers=={version}"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if result.returncode != 0 or not sdist.exists():
            if any(message in result.stderr for message in UNREACHABLE):
                pytest.skip(f"cannot download the transformers=={version} sdist: {result.stderr[-300:]}", True)
            raise AssertionError(result.stderr[-3000:] or f"pip download did not write {sdist}")
    with tarfile.open(sdist) as archive:
        for name in UPSTREAM_FILES:
            (HERE / name).write_bytes(archive.extractfile(f"transformers-{version}/tests/{name}").read())
    marker.write_text(version)


def load_shared_mixins() -> bool:
    """Import transformers' `GenerationTesterMixin` and export test mixins from `SHARED`, unchanged, under the names
    `test_modeling_common.py` imports them by (`upstream.generation.test_utils`, `upstream.exporters.test_export`),
    before it imports the stand-ins. `generation/test_utils.py` imports the export mixins by their absolute name in
    transformers' repository (`tests.exporters.test_export`): that name is the same module. False where `SHARED` lacks
    the files (the stand-ins stay)."""
    if not all((SHARED / path).exists() for path in SHARED_MIXINS.values()):
        return False
    for name, path in SHARED_MIXINS.items():
        spec = importlib.util.spec_from_file_location(f"{__name__}.{name}", SHARED / path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        if name == "exporters.test_export":
            sys.modules["tests.exporters.test_export"] = module
        spec.loader.exec_module(module)
    return True


def seed_random_inputs(seed: int) -> None:
    """Seed the generator that upstream's `ids_tensor` and `floats_tensor` draw the common tests' inputs from when
    given none: a module-level `random.Random()` in `test_modeling_common.py` and in the shared
    `generation/test_utils.py`, which nothing seeds, so that each run drew new inputs. A test's inputs are then the
    same whatever ran before it in its process."""
    for name in ("test_modeling_common", "generation.test_utils"):
        generator = getattr(sys.modules.get(f"{__name__}.{name}"), "global_rng", None)
        if generator is not None:
            generator.seed(seed)

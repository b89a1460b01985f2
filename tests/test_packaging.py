"""What the installed package holds: pyproject.toml lists its packages by hand (passes/ is
mapped to gradcompiler.passes, which `packages.find` cannot express), so a package folder
added to the tree but not to that list would be missing from every wheel. The wheel itself
is built, installed and run outside the repository by `make wheel-check` (in CI)."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import gradcompiler as gc
import gradcompiler.passes

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _package_folders() -> set[str]:
    """Dotted names of the tree's package folders, as installed (passes/ → gradcompiler.passes)."""
    names = set()
    for top, installed_as in (("gradcompiler", "gradcompiler"), ("passes", "gradcompiler.passes")):
        for init in (ROOT / top).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / top).parts
            names.add(".".join((installed_as, *parts)))
    return names


def test_pyproject_lists_every_package_folder():
    setuptools = PYPROJECT["tool"]["setuptools"]
    assert set(setuptools["packages"]) == _package_folders()
    assert setuptools["package-dir"] == {"gradcompiler": "gradcompiler", "gradcompiler.passes": "passes"}


def test_passes_is_a_subpackage_of_gradcompiler():
    assert Path(gradcompiler.passes.__file__).resolve().parent == (ROOT / "passes").resolve()
    assert (ROOT / "gradcompiler" / "py.typed").exists()


def test_version_comes_from_the_package_metadata():
    assert gc.__version__ == metadata.version("gradcompiler") == PYPROJECT["project"]["version"]

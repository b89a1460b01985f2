"""What the installed package holds: pyproject.toml lists its packages by hand (passes/ is
mapped to gradcompiler.passes, which `packages.find` cannot express), so a package folder
added to the tree but not to that list would be missing from every wheel. The wheel itself
is built, installed and run outside the repository by `make wheel-check` (in CI)."""

from __future__ import annotations

import subprocess
import sys
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


def test_the_cpu_library_modules_import_in_any_order():
    """The CPU backend's library modules import one another (`library` registers the kernels of
    every library_* module; `gemm` and `library_direct_conv` use each other): each must import
    first, in a fresh interpreter, whatever the cycle (a name taken `from` a module still
    initialising fails there)."""
    folder = ROOT / "gradcompiler" / "backends" / "numba_cpu"
    names = sorted(path.stem for path in folder.glob("*.py") if path.stem.startswith(("library", "gemm")))
    assert {"library", "library_conv", "library_direct_conv", "gemm"} <= set(names)
    runs = {name: subprocess.Popen([sys.executable, "-c", f"import gradcompiler.backends.numba_cpu.{name}"],
                                   stderr=subprocess.PIPE, text=True) for name in names}
    failed = {name: run.communicate()[1].strip().splitlines()[-1:] for name, run in runs.items()}
    assert {name: error for name, error in failed.items() if runs[name].returncode} == {}

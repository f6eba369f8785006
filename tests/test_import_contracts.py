"""The import contracts of pyproject.toml ([tool.importlinter]) hold, benchmarks/ included.

The linter reads packages as installed: server/ and export/ are harmony_mobile.server and
harmony_mobile.export only through pyproject's package-dir mapping, so the test lays the sources out
that way in a scratch directory (what `pip install --target` would make, without a build) and puts
the checkout after it on the path, where benchmarks/ is found as a namespace package.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def lay_out_installed_package(target: Path) -> None:
    setuptools = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    # parents first, so a mapped subpackage (server/ -> harmony_mobile/server) lands inside its parent
    for package, source in sorted(setuptools["package-dir"].items()):
        destination = target.joinpath(*package.split("."))
        shutil.copytree(
            REPO_ROOT / source, destination, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__")
        )


def test_the_import_contracts_hold(tmp_path):
    lay_out_installed_package(tmp_path)
    linter = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(linter), str(REPO_ROOT / "pyproject.toml"), "--no-cache"],
        cwd=tmp_path,
        env={"PYTHONPATH": f"{tmp_path}:{REPO_ROOT}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout
    assert "benchmarks" in result.stdout  # the contracts over benchmarks/ ran

"""The layer contract of pyproject.toml's [tool.importlinter], checked by import-linter on the source tree.

The editable install maps each folder into the ``agentgym_rl`` namespace through an import hook, which
import-linter cannot walk; so the test copies the packages' modules into ``agentgym_rl/`` under a temporary
directory and lints that copy.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("actors", "configs", "driver", "envs", "learner", "serve")
# What the unit tests of each package may import: that package and the layers below it.
BELOW = {
    "configs": {"configs"},
    "envs": {"configs", "envs"},
    "actors": {"configs", "envs", "actors"},
    "learner": {"configs", "envs", "actors", "learner"},
    "serve": {"configs", "envs", "actors", "serve"},
    "driver": set(PACKAGES),
}
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def source_copy(target: Path) -> Path:
    """The project's modules under ``target/agentgym_rl`` (a regular package, so import-linter finds it)."""
    namespace = target / "agentgym_rl"
    for package in PACKAGES:
        shutil.copytree(ROOT / package, namespace / package, ignore=shutil.ignore_patterns("__pycache__", "static"))
    (namespace / "__init__.py").write_text("")
    return target


def lint(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_imports_follow_the_layers_without_cycles(tmp_path: Path) -> None:
    result = lint(source_copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout


def test_an_upward_import_breaks_the_contract(tmp_path: Path) -> None:
    tree = source_copy(tmp_path)
    schema = tree / "agentgym_rl" / "configs" / "schema.py"
    schema.write_text(schema.read_text() + "\nfrom agentgym_rl.driver import cli  # noqa: E402,F401\n")
    result = lint(tree)
    assert result.returncode != 0
    assert "agentgym_rl.configs is not allowed to import agentgym_rl.driver" in result.stdout


def imported_packages(path: Path) -> set[str]:
    """The project packages a test module imports, from ``agentgym_rl`` or through another unit test's module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        for parts in (name.split(".") for name in names):
            if parts[0] == "agentgym_rl" and len(parts) > 1:
                found.add(parts[1])
            elif parts[:2] == ["tests", "unit"] and len(parts) > 2 and parts[2] in BELOW:
                found.add(parts[2])
    return found


def test_the_unit_tests_follow_the_layers():
    crossing = {
        str(path.relative_to(ROOT)): sorted(imported_packages(path) - allowed)
        for package, allowed in BELOW.items()
        for path in sorted((ROOT / "tests" / "unit" / package).glob("*.py"))
        if imported_packages(path) - allowed
    }
    assert crossing == {}

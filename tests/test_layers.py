"""The reader's folders are layers: imports point one way between them, and the plan is pure.

Read from the source (every ``import`` statement, those inside functions included), so an arrow
that runs back up fails here before it becomes a circle.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import lerobot_shards

PACKAGE = Path(lerobot_shards.__file__).parent
READER_LAYERS = ["plan", "fetch", "batches", "frames", "meta", "loading"]
"""Lowest first: a layer imports only the layers before it (and the package's top modules)."""
TOP_BELOW_READER = {"arrow", "format", "validate", "language", "items", "depth", "trace"}
"""Top-level modules the reader builds on; they never import the reader."""


def module_name(path: Path) -> str:
    """The dotted name of the package's module at ``path``."""
    parts = ["lerobot_shards", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_in(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every ``lerobot_shards...`` module the source of ``module`` imports, anywhere in it;
    relative imports (``from ..loading import dataset``) resolved against ``module``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                package = module.split(".")
                if not is_package:
                    package = package[:-1]
                base = package[: len(package) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            if target.startswith("lerobot_shards"):
                if node.module:
                    found.add(target)
                found.update(f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("lerobot_shards"))
    return found


def imports_of(path: Path) -> set[str]:
    """Every ``lerobot_shards...`` module ``path`` imports (:func:`imports_in`)."""
    return imports_in(path.read_text(), module_name(path), path.name == "__init__.py")


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] == ["lerobot_shards", "reader"] and len(parts) > 2 and parts[2] in READER_LAYERS:
        return parts[2]
    return None


def test_reader_layers_import_only_lower_layers():
    wrong = []
    for layer in READER_LAYERS:
        allowed = set(READER_LAYERS[: READER_LAYERS.index(layer) + 1])
        for path in sorted((PACKAGE / "reader" / layer).glob("*.py")):
            for module in imports_of(path):
                target = layer_of(module)
                if target is not None and target not in allowed:
                    wrong.append(f"reader/{layer}/{path.name} imports {module}")
                if module.startswith("lerobot_shards.") and target is None:
                    top = module.split(".")[1]
                    if top not in TOP_BELOW_READER | {"reader"}:
                        wrong.append(f"reader/{layer}/{path.name} imports {module}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    ("source", "module", "is_package", "imported"),
    [
        ("from ..loading import dataset", "lerobot_shards.reader.plan.pool", False,
         "lerobot_shards.reader.loading.dataset"),
        ("from .. import loading", "lerobot_shards.reader.plan.pool", False,
         "lerobot_shards.reader.loading"),
        ("from .pool import Draws", "lerobot_shards.reader.plan.state", False,
         "lerobot_shards.reader.plan.pool.Draws"),
        ("from ..loading.stream import x", "lerobot_shards.reader.plan", True,
         "lerobot_shards.reader.loading.stream"),
    ],
)  # fmt: skip
def test_relative_imports_are_resolved(source, module, is_package, imported):
    """An upward relative import is an arrow like any other: it is read, not passed over."""
    assert imported in imports_in(source, module, is_package)


def test_reader_folders_are_the_layers():
    """Every reader module sits in one of the layers (a new module picks its floor)."""
    loose = [p.name for p in (PACKAGE / "reader").glob("*.py") if p.name != "__init__.py"]
    folders = sorted(p.name for p in (PACKAGE / "reader").iterdir() if (p / "__init__.py").exists())
    assert loose == []
    assert folders == sorted(READER_LAYERS)


def test_top_modules_below_the_reader_never_import_it():
    wrong = [
        f"{name}.py imports {module}"
        for name in sorted(TOP_BELOW_READER)
        for module in imports_of(PACKAGE / f"{name}.py")
        if module.startswith("lerobot_shards.reader")
        or (module.startswith("lerobot_shards.") and module.split(".")[1] not in TOP_BELOW_READER)
    ]
    assert not wrong, "\n".join(wrong)


def test_format_never_imports_validate():
    """validate builds on format (the contract); the reverse arrow made a circle. format builds
    only on arrow.py, which builds on nothing of the package."""
    below = [m for m in imports_of(PACKAGE / "format.py") if m.startswith("lerobot_shards")]
    assert [m for m in below if not m.startswith("lerobot_shards.arrow")] == []
    assert not [m for m in imports_of(PACKAGE / "arrow.py") if m.startswith("lerobot_shards")]


def test_nothing_outside_testing_imports_testing():
    """The test-data factory is for tests and demos: features never depend on it."""
    wrong = [
        f"{path.relative_to(PACKAGE)} imports {module}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.parent.name != "testing" and path.name != "demo.py"
        for module in imports_of(path)
        if module.startswith("lerobot_shards.testing")
    ]
    assert not wrong, "\n".join(wrong)


def test_the_plan_imports_without_torch():
    """Every module of the plan imports in a process where torch cannot be imported."""
    modules = [
        f"lerobot_shards.reader.plan.{p.stem}" for p in (PACKAGE / "reader" / "plan").glob("*.py")
    ]
    script = f"""
import builtins, importlib, json, sys
real = builtins.__import__
def guarded(name, *args, **kwargs):
    if name == "torch" or name.startswith("torch."):
        raise ImportError("torch is not allowed in the plan")
    return real(name, *args, **kwargs)
builtins.__import__ = guarded
for m in {modules!r}:
    importlib.import_module(m)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "av", "fsspec"))))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []

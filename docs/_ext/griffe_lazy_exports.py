"""Griffe extension: the names ``lerobot_shards/__init__.py`` exports lazily, as aliases.

The package imports its public names on first use (``_LAZY``: name -> module), which static
analysis cannot follow. This adds each name to the package as an alias of its definition, so
the API reference documents ``lerobot_shards.ShardedLeRobotDataset`` wherever the class lives.
"""

from __future__ import annotations

import ast
from typing import Any

import griffe


def lazy_exports(init_source: str) -> dict[str, str]:
    """The ``_LAZY`` mapping of the package's ``__init__.py``: public name -> defining module."""
    for node in ast.parse(init_source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise ValueError("no _LAZY mapping in lerobot_shards/__init__.py")


class LazyExports(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name != "lerobot_shards":
            return
        for name, module in lazy_exports(pkg.filepath.read_text()).items():
            pkg.set_member(name, griffe.Alias(name, f"{module}.{name}", parent=pkg))

"""Griffe extensions: docstrings and signatures as a reader of the API page needs them.

``SphinxRoles``: the code's docstrings name other objects with Sphinx roles
(``:class:`DatasetRoot```), which read well in ``help()`` but are literal text in Markdown.
Each role becomes a link where its target is documented on the API page (``docs/api.md``'s
``::: path`` lines, by the target's last name), else inline code.

``LiteralDefaults``: a parameter whose default is a module constant
(``tolerance_s=DEFAULT_TOLERANCE_S``) shows the constant's value, which is what a reader
wants to know.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import griffe

API_PAGE = Path(__file__).parents[1] / "api.md"
ROLE = re.compile(r":(?:class|func|meth|attr|mod|exc|data|obj):`~?\.?([\w.]+)`(\\ )?")


def documented() -> dict[str, str]:
    """Last name -> identifier of every object the API page documents."""
    paths = re.findall(r"^::: ([\w.]+)$", API_PAGE.read_text(), re.M)
    return {path.rsplit(".", 1)[-1]: path for path in paths}


def without_roles(text: str, targets: dict[str, str]) -> str:
    """``text`` with every Sphinx role a Markdown link (a documented target) or inline code."""

    def replace(match: re.Match) -> str:
        target = match[1]
        name = target.rsplit(".", 1)[-1]
        if name in targets:
            return f"[`{name}`][{targets[name]}]"
        return f"`{target}`"

    return ROLE.sub(replace, text)


class SphinxRoles(griffe.Extension):
    def __init__(self) -> None:
        self.targets = documented()

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None and ":" in obj.docstring.value:
            obj.docstring.value = without_roles(obj.docstring.value, self.targets)


def functions(obj: griffe.Object) -> Iterator[griffe.Function]:
    """Every function and method defined in ``obj``, at any depth."""
    for member in obj.members.values():
        if member.is_alias:
            continue
        if member.is_function:
            yield member
        elif member.is_module or member.is_class:
            yield from functions(member)


class LiteralDefaults(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for function in functions(pkg):
            for parameter in function.parameters:
                default = parameter.default
                if not isinstance(default, griffe.ExprName):
                    continue
                try:
                    constant = pkg.modules_collection.get_member(default.canonical_path)
                except (KeyError, ValueError):
                    continue
                if constant.is_attribute and isinstance(constant.value, str):
                    parameter.default = constant.value

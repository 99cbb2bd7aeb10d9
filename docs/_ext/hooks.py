"""MkDocs hooks: the package is read from ``src/``, the API page lists every public name, and no
page shows text that was meant for another renderer.

``mkdocs-click`` imports the CLI; with ``src/`` first on ``sys.path`` the site documents this
checkout whatever is installed. A name exported from ``lerobot_shards`` but missing from
``api.md`` is a warning, and so is a rendered page that shows a Sphinx role (``:class:``), a
value click uses for "no default" (``Sentinel.UNSET``) or a doubled ``%%``: ``mkdocs build
--strict`` turns each into a failure.
"""

from __future__ import annotations

import html
import logging
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import griffe
import yaml
from griffe_lazy_exports import LazyExports, lazy_exports

ROOT = Path(__file__).parents[2]
log = logging.getLogger("mkdocs.plugins.lerobot_shards")


def on_config(config: Any) -> Any:
    sys.path.insert(0, str(ROOT / "src"))
    return config


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if page.file.src_uri == "api.md":
        exports = lazy_exports((ROOT / "src/lerobot_shards/__init__.py").read_text())
        for name in exports:
            if f"::: lerobot_shards.{name}\n" not in markdown:
                log.warning("api.md does not document lerobot_shards.%s", name)
        for problem in reference_gaps(documented_objects(markdown)):
            log.warning("api.md: %s", problem)
    return markdown


def documented_objects(markdown: str) -> dict[str, Any]:
    """Each ``::: path`` of the page, with the ``members`` its options show (None: all)."""
    found = {}
    blocks = re.finditer(r"^::: ([\w.]+)\n((?:    .*\n)*)", markdown, re.M)
    for block in blocks:
        options = (yaml.safe_load(textwrap.dedent(block[2])) or {}).get("options", {})
        found[block[1]] = options.get("members")
    return found


def reference_gaps(paths: dict[str, Any]) -> list[str]:
    """What the API page leaves out of the objects at ``paths``: a parameter of an exported
    function or class's constructor without its ``Args:`` entry, and a type of this package
    that one of them returns (a function's or method's return annotation, a property's or
    attribute's annotation) but the page does not document."""
    package = griffe.load(
        "lerobot_shards",
        search_paths=[str(ROOT / "src")],
        extensions=griffe.load_extensions(LazyExports),
        docstring_parser="google",
    )
    objects = {path: target(package.modules_collection.get_member(path)) for path in paths}
    documented = {obj.canonical_path for obj in objects.values()}
    gaps = []
    for path in paths:
        obj = objects[path]
        if path.count(".") == 1:  # an exported name: users call it or construct it
            for name in undocumented_parameters(obj):
                gaps.append(f"{path}: parameter {name!r} has no Args: entry")
        for returned in returned_types(obj, paths[path]):
            if returned not in documented:
                gaps.append(f"{path} returns {returned}, which the page does not document")
    return gaps


def undocumented_parameters(obj: Any) -> list[str]:
    """The parameters of a function, or of a class's ``__init__`` (its own, not inherited),
    that neither the docstring nor ``__init__``'s names in an ``Args:`` section."""
    function = obj.members.get("__init__") if obj.is_class else obj
    if function is None or function.is_alias or not function.is_function:
        return []
    named = set()
    for docstring in (obj.docstring, function.docstring):
        for section in docstring.parsed if docstring is not None else []:
            if section.kind.value == "parameters":
                named.update(p.name.lstrip("*") for p in section.value)
    if obj.is_class and "dataclass" in obj.labels:  # a field's own docstring documents it
        named.update(n for n, m in obj.members.items() if m.is_attribute and m.docstring)
    skip = {"self", "cls"}
    return [p.name for p in function.parameters if p.name not in skip | named]


def returned_types(obj: Any, shown: Any = None) -> set[str]:
    """Canonical paths of this package's types named in what ``obj`` (a function, or a class's
    public members, those ``shown`` if the page names them: False for none) returns."""
    annotations = []
    if obj.is_function:
        annotations.append(obj.returns)
    elif obj.is_class and shown is not False:
        for name, member in obj.members.items():
            if name.startswith("_") or member.is_alias or (shown and name not in shown):
                continue
            annotations.append(member.returns if member.is_function else member.annotation)
    found = set()
    for annotation in annotations:
        if isinstance(annotation, griffe.Expr):
            for part in annotation.iterate(flat=True):
                if isinstance(part, griffe.ExprName):
                    path = part.canonical_path
                    if path.startswith("lerobot_shards.") and path != obj.canonical_path:
                        found.add(path)
    return found


LEFTOVERS = {
    re.compile(r":(?:class|func|meth|attr|mod|exc|data|obj):`"): "a Sphinx role shown as text",
    re.compile(r"Sentinel\.\w+"): "click's sentinel for no default",
    re.compile(r"%%"): "a doubled % (click prints help text as written)",
}


def leftovers(page_html: str) -> list[str]:
    """What a rendered page shows that was meant for another renderer, with its context."""
    text = html.unescape(re.sub(r"<[^>]+>", "", page_html))
    found = []
    for pattern, what in LEFTOVERS.items():
        for match in pattern.finditer(text):
            context = " ".join(text[max(0, match.start() - 40) : match.end() + 40].split())
            found.append(f"{what}: ...{context}...")
    return found


def on_page_content(page_html: str, page: Any, **kwargs: Any) -> str:
    for problem in leftovers(page_html):
        log.warning("%s shows %s", page.file.src_uri, problem)
    return page_html


def target(obj: Any) -> Any:
    """The object an alias (a name the package exports) stands for."""
    return obj.final_target if obj.is_alias else obj

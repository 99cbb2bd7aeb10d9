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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from griffe_lazy_exports import lazy_exports

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
    return markdown


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

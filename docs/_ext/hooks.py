"""MkDocs hooks: the package is read from ``src/`` and the API page lists every public name.

``mkdocs-click`` imports the CLI; with ``src/`` first on ``sys.path`` the site documents this
checkout whatever is installed. A name exported from ``lerobot_shards`` but missing from
``api.md`` is a warning, which ``mkdocs build --strict`` turns into a failure.
"""

from __future__ import annotations

import logging
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

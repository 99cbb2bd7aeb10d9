"""Optional components that a test run declares required, so that their tests fail, never skip,
when the component is missing or broken.

``LEROBOT_SHARDS_REQUIRE`` names them, space-separated (``scripts/test.sh`` sets it for each
environment: ``ray`` in ``.venv``; ``lerobot``, ``torchcodec`` and ``accelerate`` in LeRobot's).
A developer's bare ``pytest`` requires nothing and skips what is not installed, saying so in its
summary.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

REQUIRED = frozenset(os.environ.get("LEROBOT_SHARDS_REQUIRE", "").split())


def importorskip(module: str, reason: str) -> ModuleType:
    """``module``, or a skip with ``reason`` if it cannot be imported; an import error if its
    component (the top-level package) is required."""
    __tracebackhide__ = True  # a skip is reported where the test asked, not here
    if module.split(".")[0] in REQUIRED:
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=reason)


def import_error(module: str) -> str | None:
    """Why ``module`` cannot be imported (torchcodec fails with OSError or RuntimeError when
    FFmpeg's libraries are missing), or None if it imports."""
    try:
        importlib.import_module(module)
    except (ImportError, OSError, RuntimeError) as error:
        return f"{type(error).__name__}: {error}"
    return None

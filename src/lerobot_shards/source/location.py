"""Where a SOURCE argument points: a local path or fsspec URL as it is, and a Hub repo id
(``lerobot/aloha_sim_insertion_human``) as LeRobot resolves one.

LeRobot keeps a dataset it has downloaded or recorded under ``$HF_LEROBOT_HOME/<repo_id>``
(``HF_LEROBOT_HOME`` defaults to ``$HF_HOME/lerobot``, and ``HF_HOME`` to
``$XDG_CACHE_HOME/huggingface`` or ``~/.cache/huggingface``, as huggingface_hub sets it). A repo
id is read from there when that copy exists (no network), else from the Hub through
huggingface_hub's fsspec filesystem (``hf://datasets/<repo_id>``: pip install huggingface_hub).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def lerobot_home() -> Path:
    """LeRobot's local datasets folder, as LeRobot computes it."""
    if "HF_LEROBOT_HOME" in os.environ:
        return Path(os.environ["HF_LEROBOT_HOME"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME", "~/.cache")
    hf_home = os.environ.get("HF_HOME", os.path.join(cache, "huggingface"))
    return Path(hf_home).expanduser() / "lerobot"


def resolve_source(source: str) -> str:
    """``source`` itself unless it is a Hub repo id that is not a local path; then LeRobot's
    local copy if it has one, else ``hf://datasets/<repo_id>``."""
    if "://" in source or Path(source).exists() or not REPO_ID.match(source):
        return source
    local = lerobot_home() / source
    if (local / "meta" / "info.json").exists():
        return str(local)
    return f"hf://datasets/{source}"

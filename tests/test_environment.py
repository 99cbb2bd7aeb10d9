"""The run is in the environment it claims: every component it declares required
(``LEROBOT_SHARDS_REQUIRE``, see ``support/required.py``) imports, and in LeRobot's environment
the versions are those a LeRobot 0.6.1 user has. A broken ``import lerobot`` or torchcodec
without FFmpeg's libraries fails here by name, besides failing the tests that need them."""

from __future__ import annotations

import importlib.metadata
import sys

import pytest
from support.required import REQUIRED, import_error

LEROBOT_ENV = {"lerobot": "0.6.1", "torch": "2.11.", "numpy": "2.2.", "av": "15."}
"""Version prefixes of what ``lerobot[dataset,training,diffusion]==0.6.1`` installs
(``setup_lerobot_env.sh``)."""


@pytest.mark.parametrize("component", sorted(REQUIRED))
def test_required_component_imports(component):
    assert import_error(component) is None, f"{component} is required in this run"


@pytest.mark.skipif("lerobot" not in REQUIRED, reason="not LeRobot's environment")
def test_lerobot_environment_has_lerobots_versions():
    assert sys.version_info[:2] == (3, 12)
    for package, version in LEROBOT_ENV.items():
        assert importlib.metadata.version(package).startswith(version), package

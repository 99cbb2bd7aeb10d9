#!/usr/bin/env bash
# Creates .venv-lancedb: lerobot-lancedb 0.3.1 as its README installs it, for the peer benchmark
# (scripts/bench_peers.py). It needs Python 3.12 and LeRobot 0.6.1 (its pins: torch, torchcodec,
# numpy, av), lancedb 0.37.1 or newer (on the package index now) and, for torchcodec, FFmpeg's
# shared libraries (scripts/setup_lerobot_env.sh installs them from Debian). Its own folder, so
# that nothing here moves the pins of .venv-lerobot, LeRobot's environment for the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON312:-}
if [ -z "$PY" ]; then
  for candidate in python3.12 "$HOME/.pyenv/versions/3.12"*/bin/python3.12; do
    if "$candidate" -c "import sys; assert sys.version_info[:2] == (3, 12)" 2>/dev/null; then
      PY=$candidate
      break
    fi
  done
fi
if [ -z "$PY" ]; then
  echo "setup_lancedb_env: no Python 3.12 found (set PYTHON312)" >&2
  exit 1
fi
VENV=.venv-lancedb
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q "lerobot[dataset]==0.6.1" "lerobot-lancedb==0.3.1"
"$VENV/bin/python" -m pip check
"$VENV/bin/python" -c "import lerobot_lancedb, lancedb, torchcodec; print('lerobot-lancedb ready:', lancedb.__version__)"

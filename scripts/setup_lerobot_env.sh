#!/usr/bin/env bash
# Creates .venv-lerobot as a LeRobot 0.6.1 user who trains has it: Python 3.12,
# `lerobot[dataset,training,diffusion]==0.6.1` installed first (training: accelerate and wandb,
# for lerobot-train; diffusion: diffusers, for its diffusion policy; its pins: torch < 2.12,
# av 15, numpy 2.2, datasets' fsspec), then this package and its test extras into it without
# moving any of LeRobot's pins. FFmpeg's shared libraries come from Debian where apt-get can
# install them, so that torchcodec imports as it does in LeRobot's own environment.
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
  echo "setup_lerobot_env: no Python 3.12 found (set PYTHON312)" >&2
  exit 1
fi
FFMPEG_LIBS="libavcodec59 libavformat59 libavutil57 libswscale6 libswresample4 libavfilter8 libavdevice59"
if ! ldconfig -p | grep -q 'libavutil\.so'; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    # shellcheck disable=SC2086
    apt-get install -y -q --no-install-recommends $FFMPEG_LIBS >/dev/null \
      || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $FFMPEG_LIBS >/dev/null; } \
      || echo "setup_lerobot_env: FFmpeg libraries not installed: torchcodec will not load" >&2
  fi
fi
VENV=.venv-lerobot
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q "lerobot[dataset,training,diffusion]==0.6.1"
# Hold what LeRobot resolved for its own pins; the test extras then resolve around them.
"$VENV/bin/python" -m pip freeze \
  | grep -iE '^(lerobot|torch|torchvision|torchcodec|numpy|av|fsspec|datasets|pyarrow|pandas|huggingface[-_]hub|accelerate|diffusers)==' \
  > "$VENV/lerobot-constraints.txt"
"$VENV/bin/python" -m pip install -q -e ".[test,report]" -c "$VENV/lerobot-constraints.txt"
"$VENV/bin/python" -m pip check

#!/usr/bin/env bash
# Sets up .venv if needed, then makes a sample LeRobot dataset, converts it and streams it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/lerobot-shards demo --workdir demo-output "$@"

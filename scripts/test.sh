#!/usr/bin/env bash
# Sets up .venv if needed and runs ruff, the documentation site's strict build (mkdocs.yml) and
# the whole test suite; then, in LeRobot 0.6.1's own environment (.venv-lerobot: Python 3.12,
# torch 2.11, numpy 2.2, PyAV 15), the tests of what
# LeRobot users run: golden items (v3.0 and v2.1), reader, collate, resume, checkpoints, and the
# LeRobot tests (meta, training, the example under torchrun, lerobot-shards train with LeRobot's
# own trainer under torchrun and accelerate launch and its datasets from LeRobot's own config,
# accelerate's re-sharding refused, the factory's aggregated layout against LeRobot's own
# aggregate_datasets, episodes cut mid-GOP against LeRobot's own items, language columns recorded
# and annotated with LeRobot's own tools against its items, batches and trainer, the datasets every
# tool of LeRobot's makes (lerobot-edit-dataset's operations, aggregate_datasets, add_features, the
# quantile stats, the v2.1 to v3.0 script) read as LeRobot reads them).
# LEROBOT_ENV=0 skips the second run. Each run names the optional components it requires
# (LEROBOT_SHARDS_REQUIRE, tests/support/required.py): their tests fail, never skip, if one is
# missing; every skip is listed, with its reason, at the end of each run (-ra in pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# The documentation site: a broken link or anchor, a page left out of the nav, a public name
# missing from the API reference or text meant for another renderer fails the build. Not
# --quiet: it hides the warnings that --strict counts, and the build passes with them.
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict -d build/docs-site
LEROBOT_SHARDS_REQUIRE="ray aiohttp matplotlib" .venv/bin/python -m pytest -q "$@"
if [ "${LEROBOT_ENV:-1}" != 0 ]; then
  started=$(date +%s)
  bash scripts/setup_lerobot_env.sh
  echo "LeRobot 0.6.1 environment ready in $(($(date +%s) - started)) s"
  # Another CPU's kernels, emulated: torch's plain (unvectorised) kernels compute the layouts'
  # losses differently, as an AVX-512 Intel Xeon's did; the loss comparison and the golden items
  # (frames made float in torch) must hold there too. FFmpeg's levels: tests/test_simd_levels.py.
  ATEN_CPU_CAPABILITY=default LEROBOT_SHARDS_REQUIRE="lerobot torchcodec" \
    .venv-lerobot/bin/python -m pytest -q "$@" tests/test_golden.py \
    tests/test_lerobot_training.py::test_batch_and_loss_equal_lerobots_own
  LEROBOT_SHARDS_REQUIRE="lerobot torchcodec accelerate aiohttp" \
    .venv-lerobot/bin/python -m pytest -q "$@" \
    tests/test_environment.py tests/test_readme.py tests/test_golden.py tests/test_reader.py \
    tests/test_decode.py tests/test_rgb24.py tests/test_simd_levels.py tests/test_collate.py \
    tests/test_transfer.py tests/test_elastic_resume.py tests/test_loader.py \
    tests/test_worker_epochs.py tests/test_s3.py tests/test_lerobot_meta.py \
    tests/test_lerobot_training.py tests/test_stats.py tests/test_mixture_reader.py \
    tests/test_lerobot_aggregate.py tests/test_long_gop.py tests/test_lerobot_train.py \
    tests/test_accelerate_guard.py tests/test_train_arguments.py tests/test_http.py \
    tests/test_source_location.py tests/test_lerobot_train_cache.py tests/test_lerobot_train_datasets.py \
    tests/test_lerobot_language.py tests/test_lerobot_tools.py \
    "tests/test_warm_start.py::test_a_warm_up_is_not_claimed_after_a_setting_changes[video_backend]"
fi

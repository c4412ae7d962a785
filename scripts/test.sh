#!/usr/bin/env bash
# The test command: install dependencies, build, run the ctest suite (every
# label except gpu). Exits non-zero on any failure or timeout.
#   scripts/test.sh                 # whole suite
#   CTEST_ARGS="-L unit" scripts/test.sh   # a subset
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -LE gpu -j "${CTEST_JOBS:-2}" ${CTEST_ARGS:-}

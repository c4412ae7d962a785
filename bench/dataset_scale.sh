#!/usr/bin/env bash
# bench/dataset_scale.sh [BUILD_DIR] [OUT_DIR]
# Opening a token dataset at cluster scale (docs/data.md, "Open time and
# memory"): a synthetic dataset of DOCS documents and TOKENS tokens (default
# 100 M documents, 1 B tokens: a 4.8 GB file, written once, about a minute)
# through the writer wlb4d-prep uses, then opened twice in a fresh process
# as the trainer does (TokenDataset::open + a shuffled DocumentStream): the
# open time, the stream's time and the resident memory. Needs ~6 GB of disk.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
OUT=${2:-runs/bench/dataset-scale}
DOCS=${DOCS:-100000000}
TOKENS=${TOKENS:-1000000000}
BIN=$BUILD/bench/dataset_scale
mkdir -p "$OUT"
DS="$OUT/synthetic-${DOCS}-${TOKENS}.h5"
[ -f "$DS" ] || "$BIN" make "$DS" "$DOCS" "$TOKENS"
ls -l "$DS"
for i in 1 2; do "$BIN" open "$DS"; done

#!/usr/bin/env bash
# bench/prep_mpi.sh TOKENIZER_JSON [BUILD_DIR] [OUT_DIR]
# wlb4d-prep on 1 rank against `mpiexec -n RANKS` (default 2), one encoding
# thread per rank (docs/data.md, "MPI ranks"): the SOTU corpus repeated
# COPIES times (default 18: 41.7 MB of JSONL, 846 documents, ~20 batches),
# encoded with TOKENIZER_JSON (scripts/get-tokenizer.sh gpt2 DIR). The runs
# alternate (1 rank, N ranks, 1 rank, ...; REPEATS each, default 5) so that
# a busy machine weighs on both alike; prints each run's time line, the
# medians of the encode+write rate (MB/s) and of the encoding rate per
# CPU-second, and checks that both wrote the same datasets (h5py).
set -euo pipefail
cd "$(dirname "$0")/.."
TOK=${1:?usage: bench/prep_mpi.sh TOKENIZER_JSON [BUILD_DIR] [OUT_DIR]}
BUILD=${2:-build}
OUT=${3:-runs/bench/prep-mpi}
RANKS=${RANKS:-2} COPIES=${COPIES:-18} REPEATS=${REPEATS:-5}
PY=/usr/bin/python3
mkdir -p "$OUT"
CORPUS="$OUT/sotu-x$COPIES.jsonl"
[ -f "$CORPUS" ] || for i in $(seq "$COPIES"); do xz -dc inputs/corpus/sotu-embedded.jsonl.xz; done > "$CORPUS"
ls -l "$CORPUS"
: > "$OUT/times.txt"
for r in $(seq "$REPEATS"); do
  for n in 1 "$RANKS"; do
    if [ "$n" = 1 ]; then run=("$BUILD/app/wlb4d-prep"); else run=(mpiexec -n "$n" "$BUILD/app/wlb4d-prep"); fi
    line=$("${run[@]}" --input "$CORPUS" --output "$OUT/r$n/train.h5" --tokenizer "$TOK" --threads 1 | grep 'wlb4d-prep: time')
    echo "ranks $n: $line" | tee -a "$OUT/times.txt"
  done
done
"$PY" - "$OUT/times.txt" "$RANKS" <<'PYEOF'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    n = int(line.split()[1].rstrip(":"))
    wall = float(re.search(r"encode\+write ([0-9.]+) s: ([0-9.]+) MB/s", line).group(2))
    cpu = float(re.search(r"encoding ([0-9.]+) MB per CPU-second", line).group(1))
    rows.setdefault(n, []).append((wall, cpu))
for n in sorted(rows):
    w = statistics.median(x[0] for x in rows[n]); c = statistics.median(x[1] for x in rows[n])
    print(f"ranks {n}: median encode+write {w:.1f} MB/s ({w / n:.1f} per rank), "
          f"median encoding {c:.1f} MB per CPU-second, {len(rows[n])} runs")
PYEOF
"$PY" tests/tools/prep_same_datasets.py "$OUT/r1" "$OUT/r$RANKS"

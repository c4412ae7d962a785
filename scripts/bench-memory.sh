#!/usr/bin/env bash
# Peak memory per rank, predicted vs measured, and the step-time cost of each
# memory feature: the benchmark decks with recompute
# none/selective/full (1 rank), and ZeRO-1 on dp=2 and sequence parallelism on
# tp=2 rows (meaningful once those features are merged).
#
#   scripts/bench-memory.sh                                  # both decks, recompute rows
#   ROWS="none selective full dp2-zero0 dp2-zero1 tp2-sp0 tp2-sp1" scripts/bench-memory.sh
#   DECKS=inputs/bench-quickstart.ini STEPS=4 scripts/bench-memory.sh
#
# Every row runs SCHEDULE (default gpipe: with pp = 1 all train.micro_batches
# are in flight, so recompute acts on all of them; 1f1b keeps one) for STEPS
# steps (default 3; step 0 is excluded from the step time). Columns:
#   predicted_mib  memory model (pipeline::predict_memory), max over ranks
#   measured_mib   Kokkos high-water mark (Kokkos Tools callbacks), max over ranks
#   rss_mib        peak resident set (getrusage), max over ranks
#   step_ms        median wall time of a step; cost = step_ms / the same deck's
#                  first row of the same rank count - 1
#   cpu_ms         median compute CPU time of a step (busiest rank, comm
#                  excluded); cpu_cost likewise: robust where a shared machine
#                  makes wall time noisy
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
BIN=$BUILD_DIR/app
OUT=${OUT:-runs/bench-memory}
DECKS=${DECKS:-"inputs/bench-quickstart.ini inputs/bench-gpt2-small.ini"}
ROWS=${ROWS:-"none selective full"}
STEPS=${STEPS:-3}
SCHEDULE=${SCHEDULE:-gpipe}
export OMP_NUM_THREADS=1 KOKKOS_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
[ -x "$BIN/wlb4d" ] || { echo "bench-memory: build first (scripts/build.sh)"; exit 1; }
mkdir -p "$OUT/data"
DATA=$OUT/data/sotu-train.h5
[ -f "$DATA" ] || "$BIN/wlb4d-prep" --input inputs/corpus/sotu-embedded.jsonl.xz --output "$DATA" >/dev/null
RESULTS=$OUT/results.csv
echo "deck,row,ranks,predicted_mib,measured_mib,error,rss_mib,step_ms,cost,cpu_ms,cpu_cost" > "$RESULTS"
for deck in $DECKS; do
  for row in $ROWS; do
    case $row in
      none|selective|full) n=1; ov="--model.recompute=$row" ;;
      dp2-zero0) n=2; ov="--parallel.dp=2 --parallel.zero=0" ;;
      dp2-zero1) n=2; ov="--parallel.dp=2 --parallel.zero=1" ;;
      tp2-sp0)   n=2; ov="--parallel.tp=2 --parallel.sequence_parallel=false" ;;
      tp2-sp1)   n=2; ov="--parallel.tp=2 --parallel.sequence_parallel=true" ;;
      *) echo "bench-memory: unknown row $row"; exit 1 ;;
    esac
    name=$(basename "$deck" .ini)-$row
    csvf=$OUT/$name.csv; log=$OUT/$name.log; rm -f "$csvf"
    if ! mpiexec -n $n "$BIN/wlb4d" "$deck" $ov --parallel.schedule="$SCHEDULE" --train.steps="$STEPS" \
         --data.train="$DATA" --log.csv_file="$csvf" >"$log" 2>&1; then
      echo "bench-memory: $name failed (see $log)"; continue
    fi
    /usr/bin/env python3 - "$csvf" "$deck" "$row" "$n" "$RESULTS" >> "$RESULTS" <<'PY'
import csv, statistics, sys
f, deck, row, n, results = sys.argv[1:]
rows = list(csv.DictReader(open(f)))
steps = sorted({int(r["step"]) for r in rows})
keep = [s for s in steps if s >= 1] or steps
by = lambda s: [r for r in rows if int(r["step"]) == s]
last = by(steps[-1])
mib = lambda k: max(float(r[k]) for r in last) / 2**20
med = statistics.median(max(float(r["t_total"]) for r in by(s)) for s in keep) * 1e3
name = deck.split("/")[-1][:-4]
base = [l.split(",") for l in open(results).read().splitlines()[1:]]
base = [b for b in base if b[0] == name and b[2] == n]
cost = f"{med / float(base[0][7]) - 1:+.1%}" if base else "+0.0%"
cpu = statistics.median(max(float(r["compute_cpu"]) for r in by(s)) for s in keep) * 1e3
cpu_cost = f"{cpu / float(base[0][9]) - 1:+.1%}" if base else "+0.0%"
p, m = mib("mem_predicted"), mib("mem_measured")
print(f"{name},{row},{n},{p:.1f},{m:.1f},{p / m - 1:+.1%},{max(float(r['rss_mib']) for r in last):.1f},{med:.0f},{cost},{cpu:.0f},{cpu_cost}")
PY
  done
done
echo
column -s, -t < "$RESULTS"
echo "bench-memory: CSV in $RESULTS (schedule $SCHEDULE, $STEPS steps)"

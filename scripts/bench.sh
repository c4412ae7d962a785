#!/usr/bin/env bash
# End-to-end training throughput: runs the benchmark decks on 1 and
# 2 ranks and prints one table (and writes a CSV) with tokens/s, achieved model
# GFLOP/s, share of the SGEMM peak measured in the same run, the GEMM-bound
# share (GEMM FLOPs of the step at that peak / step time), time by category
# and peak memory per rank (RSS). Predicted vs measured peak memory and the
# step-time cost of each memory feature: scripts/bench-memory.sh.
#
#   scripts/bench.sh                      # quickstart + gpt2-small decks, all layouts
#   DECKS="inputs/bench-quickstart.ini" LAYOUTS="1 dp2" scripts/bench.sh
#
# Layouts: 1 (1 rank x 1 thread), dp2/tp2/pp2 (2 ranks x 1 thread) and, when
# the build's Kokkos has the OpenMP backend, 1x2t (1 rank x 2 threads: the
# hybrid MPI+OpenMP alternative to dp2 on the same two cores; kernels and
# OpenBLAS both use the threads, OMP_PROC_BIND=spread OMP_PLACES=cores).
#   OPENBLAS_MODE=native scripts/bench.sh # unset OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE for this run (OpenBLAS's own
#                                         # choice); by default an unset OPENBLAS_CORETYPE gets the CPU's widest kernel
#   NICE=-15 scripts/bench.sh             # run at a higher priority (as root) on a shared, busy machine
#   TORCH=1 scripts/bench.sh              # also wlb4d vs PyTorch, same model and tokens (bench/torch_compare.py)
#
#   ARGS="--train.precision=bf16" scripts/bench.sh  # extra wlb4d overrides for every run
#   STEPS=16 scripts/bench.sh             # more steps than the deck's (the median is over steps >= 1;
#                                         # on a shared VM the first seconds of a run are often slower)
#
# Every layout runs MICRO_BATCHES (default 8) micro-batches per step, so
# tokens/step are the same across layouts (pp2 needs ≥ 2·pp micro-batches to
# fill its pipeline) and 1 rank is the baseline of the same work.
#
# Model FLOPs per step (lib/include/wlb4d/model/transformer.hpp):
#   6 * N_mm * tokens + 12 * layers * heads * head_dim * pairs,
#   N_mm = parameters used in matmuls (LM head included, embedding lookup excluded),
#   pairs = sum over documents of d(d+1)/2 (attention query/key pairs under the mask).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
BIN=$BUILD_DIR/app
OUT=${OUT:-runs/bench}
DECKS=${DECKS:-"inputs/bench-quickstart.ini inputs/bench-gpt2-small.ini"}
# The Kokkos the build used: its KokkosConfig*.cmake lists the devices.
kokkos_dir=$(sed -n 's/^Kokkos_DIR:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null || true)
KOKKOS_OPENMP=0
grep -qsiE 'set\(Kokkos_DEVICES .*OPENMP' "$kokkos_dir"/KokkosConfig*.cmake && KOKKOS_OPENMP=1
if [ "$KOKKOS_OPENMP" = 1 ]; then
  LAYOUTS=${LAYOUTS:-"1 1x2t dp2 tp2 pp2"}
else
  LAYOUTS=${LAYOUTS:-"1 dp2 tp2 pp2"}
  echo "bench: Kokkos at ${kokkos_dir:-?} has no OpenMP backend: no 1 rank x 2 threads row"
fi
MICRO_BATCHES=${MICRO_BATCHES:-8}
STEPS=${STEPS:-}
read -r -a EXTRA <<<"${ARGS:-}"
RUN=""
[ -n "${NICE:-}" ] && RUN="nice -n $NICE"
# native: the kernel OpenBLAS picks by itself (the generic fallback on a CPU it
# does not know); env (default): the environment's OPENBLAS_CORETYPE, or the
# kernel of the CPU's widest instruction set when it is unset (scripts/openblas-env.sh).
if [ "${OPENBLAS_MODE:-env}" = native ]; then
  unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
else
  # shellcheck source=openblas-env.sh
  source scripts/openblas-env.sh
fi
export OMP_NUM_THREADS=1 KOKKOS_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$OUT/data"
[ -x "$BIN/wlb4d" ] || { echo "bench: build first (scripts/build.sh)"; exit 1; }
if [ ! -f "$OUT/data/sotu-train.h5" ]; then
  "$BIN/wlb4d-prep" --input inputs/corpus/sotu-embedded.jsonl.xz --output "$OUT/data/sotu-train.h5" >/dev/null
fi

# SGEMM peak of this machine, one core, measured now (best of the model shapes).
PEAK=$($RUN "$BUILD_DIR/bench/gemm_bench" --benchmark_format=csv 2>/dev/null |
       /usr/bin/env python3 -c '
import csv, sys
# the "GFLOPs" counter is already in GFLOP/s (gemm_bench scales by 1e-9)
rows = [r for r in csv.reader(sys.stdin) if r and r[0].strip(chr(34)).startswith("BM_sgemm")]
print(max(float(r[-1]) for r in rows) if rows else 0)' ) || PEAK=0
echo "bench: SGEMM peak (1 core, KokkosBlas::gemm -> BLAS, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}): ${PEAK} GFLOP/s"

RESULTS="$OUT/results.csv"
echo "deck,layout,ranks,threads,tokens_per_s,gflops,peak_share,gemm_bound_share,step_ms,cpu_ms,forward_ms,backward_ms,tp_ms,p2p_ms,cp_ms,dp_ms,optim_ms,peak_mib,sgemm_peak" > "$RESULTS"
for deck in $DECKS; do
  for lay in $LAYOUTS; do
    case $lay in
      1)   n=1; th=1; ov="" ;;
      1x2t) n=1; th=2; ov="" ;;
      dp2) n=2; th=1; ov="--parallel.dp=2" ;;
      tp2) n=2; th=1; ov="--parallel.tp=2" ;;
      pp2) n=2; th=1; ov="--parallel.pp=2" ;;
      *)   echo "bench: unknown layout $lay"; exit 1 ;;
    esac
    name=$(basename "$deck" .ini)-$lay
    csvf="$OUT/$name.csv"; rm -f "$csvf"
    log="$OUT/$name.log"
    # Bind only a multi-threaded rank: single-threaded ranks started by an
    # unbinding mpiexec would all be pinned to the first core.
    bind=false; [ "$th" -gt 1 ] && bind=spread
    # OMP_WAIT_POLICY=passive: Debian's OpenBLAS runs its own pthreads, and
    # spinning OpenMP threads would take their cores (core::BlasInfo::thread_advice).
    if ! OMP_NUM_THREADS=$th KOKKOS_NUM_THREADS=$th OPENBLAS_NUM_THREADS=$th OMP_PROC_BIND=$bind OMP_PLACES=cores \
         OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} \
         $RUN mpiexec -n $n "$BIN/wlb4d" "$deck" $ov --train.micro_batches=$MICRO_BATCHES ${STEPS:+--train.steps=$STEPS} ${EXTRA[@]+"${EXTRA[@]}"} --data.train="$OUT/data/sotu-train.h5" --log.csv_file="$csvf" >"$log" 2>&1; then
      echo "bench: $name failed (see $log)"; continue
    fi
    /usr/bin/env python3 - "$csvf" "$log" "$deck" "$lay" "$n" "$PEAK" "$th" >> "$RESULTS" <<'PY'
import csv, re, statistics, sys
f, log, deck, lay, n, peak, th = sys.argv[1:]
rows = list(csv.DictReader(open(f)))
steps = sorted({int(r["step"]) for r in rows})
keep = [s for s in steps if s >= 1] or steps          # step 0 warms up caches and BLAS
by = lambda s: [r for r in rows if int(r["step"]) == s]
tot = [max(float(r["t_total"]) for r in by(s)) for s in keep]
med = statistics.median(tot)
tokens = float(by(keep[0])[0]["tokens"])
gfl = statistics.median(float(by(s)[0]["gflops"]) for s in keep)
def cat(c): return 1e3 * statistics.mean(float(r["t_" + c]) for s in keep for r in by(s))
# compute CPU seconds of the busiest rank (communication excluded): step_ms far
# above cpu_ms means the ranks waited or were descheduled (a busy machine).
cpu = 1e3 * statistics.median(max(float(r.get("compute_cpu") or 0) for r in by(s)) for s in keep)
m = re.search(r"peak memory (?:per rank (\d+)-)?(\d+) MiB", open(log).read())  # 1 rank: "peak memory N MiB"
mem = m.group(2) if m else ""
share = gfl / (float(peak) * int(n) * int(th)) if float(peak) > 0 else 0
# GEMM-bound share: the step's GEMM FLOPs (6 N_mm per token, the
# trainer's start-up line) at the SGEMM peak of this run, over the measured
# step time. 1.0 = the step is as fast as its GEMMs alone at peak; the
# target is >= 1/1.10.
g = re.search(r"GEMM work 6\*N_mm = ([0-9.e+]+) FLOP per token", open(log).read())
gemm_s = float(g.group(1)) * tokens / (float(peak) * 1e9 * int(n) * int(th)) if g and float(peak) > 0 else 0
gshare = gemm_s / med if med > 0 else 0
print(f"{deck.split('/')[-1][:-4]},{lay},{n},{th},{tokens/med:.0f},{gfl:.2f},{share:.3f},{gshare:.3f},{med*1e3:.0f},{cpu:.0f},"
      f"{cat('forward'):.0f},{cat('backward'):.0f},{cat('tp_comm'):.0f},{cat('p2p_wait'):.0f},{cat('cp_comm'):.0f},"
      f"{cat('dp_reduce'):.0f},{cat('optimizer'):.0f},{mem},{float(peak):.1f}")
PY
  done
done
echo
column -s, -t < "$RESULTS"

# Kernel benchmarks (bench/kernels_bench.cpp, bench/attention_bench.cpp), one
# core: element-wise kernels as GB/s and share of the one-core STREAM triad,
# attention fwd+bwd as GFLOP/s (FA-2 FLOP convention) and its share of the SGEMM
# peak and of the SGEMM at the attention's shapes (BM_sgemm_attn_shapes, same
# head dim, measured by the same binary in this run), by wall time and by CPU
# time (on a shared machine the CPU-time figures are the kernel's own).
# KERNELS=0 skips.
if [ "${KERNELS:-1}" != 0 ]; then
  for kb in kernels_bench attention_bench; do
    [ -x "$BUILD_DIR/bench/$kb" ] || continue
    $RUN "$BUILD_DIR/bench/$kb" --benchmark_format=csv ${kb/attention_bench/--benchmark_filter=fwd_bwd|sgemm_attn} 2>/dev/null
  done | /usr/bin/env python3 -c '
import csv, sys
peak = float(sys.argv[1])
rows = [r for r in csv.reader(sys.stdin) if r and r[0].startswith("BM_")]
out = []
bw = 0.0
ref = {}  # head dim -> (wall GFLOP/s, cpu GFLOP/s) of SGEMM at the attention shapes
for r in rows:
    name, ms, cms = r[0], float(r[2]), float(r[3])
    vals = [x for x in r[10:] if x != ""]
    out.append((name, ms, cms, vals))
    if name.startswith("BM_stream_triad") and vals: bw = float(vals[0])
    if name.startswith("BM_sgemm_attn_shapes") and vals:
        g = float(vals[-1]); ref[int(name.split("/")[2])] = (g, g * ms / cms)
print("\nkernel                                   ms       rate          share")
for name, ms, cms, vals in out:
    if name.startswith("BM_attention"):
        g = float(vals[-1]); gc = g * ms / cms; D = int(name.split("/")[4])
        s = f"{g/peak if peak else 0:.3f} of SGEMM peak"
        if D in ref:
            s += f", {g/ref[D][0]:.3f} of SGEMM at its shapes ({ref[D][0]:.1f}); cpu time {gc:.2f} GFLOP/s, {gc/ref[D][1]:.3f} of {ref[D][1]:.1f}"
        print(f"{name:38s} {ms:8.2f} {g:8.2f} GFLOP/s  {s}")
    elif name.startswith("BM_sgemm_attn_shapes"):
        print(f"{name:38s} {ms:8.2f} {float(vals[-1]):8.2f} GFLOP/s  (cpu time {ref[int(name.split(chr(47))[2])][1]:.1f})")
    elif vals:
        g = float(vals[0]); s = f"{g/bw:.3f} of triad" if bw else ""
        ex = f"  {float(vals[1]):.2f} Gexp/s" if len(vals) > 1 and float(vals[1]) > 0 else ""
        print(f"{name:38s} {ms:8.2f} {g:8.2f} GB/s     {s}{ex}")
' "$PEAK"
fi
# wlb4d against PyTorch on the same model and tokens (off by
# default): TORCH=1 runs bench/torch_compare.py on every deck, TORCH_ROUNDS
# alternating rounds of TORCH_STEPS steps (the deck's micro-batches), with the
# threads and OpenBLAS kernel of this run. Prints `skipped:` without torch.
if [ "${TORCH:-0}" = 1 ]; then
  for deck in $DECKS; do
    echo; echo "bench: PyTorch comparison, $deck"
    $RUN /usr/bin/python3 bench/torch_compare.py "$deck" --wlb4d "$BIN/wlb4d" --rounds "${TORCH_ROUNDS:-3}" \
      --steps "${TORCH_STEPS:-4}" --data.train="$OUT/data/sotu-train.h5" || echo "bench: torch_compare failed on $deck"
  done
fi
echo "bench: CSV in $RESULTS (share = achieved model GFLOP/s / (ranks x threads x 1-core SGEMM peak))"

#!/usr/bin/env bash
# gpu-check.sh inside the GPU bundle (scripts/gpu-bundle.sh; DESIGN §12): the
# one command for a lent GPU machine, under 10 minutes on one
# H100 or H200. Needs only what the bundle holds plus the NVIDIA driver and the
# CUDA runtime libraries (cudart, cuBLAS, cuBLASLt, NCCL; cuDNN for a bundle of
# a -DWLB4D_ENABLE_CUDNN=ON build), which it looks for in $CUDA_HOME,
# /usr/local/cuda*, the loader's cache and the nvidia-* pip wheels of the
# machine's Python (PyTorch's; cuDNN first in site-packages/nvidia/cudnn/lib),
# and says which it used.
#   payload/gpu-check.sh RESULTS_DIR
# Steps (each with a timeout; a failed step is reported, the others still run):
#   1. nvidia-smi summary
#   2. the device tests: kernel unit tests, the allocation test, NCCL collectives
#   3. CPU-vs-GPU equivalence: ci-tiny and quickstart, 10 steps on 1 GPU (and
#      ci-tiny with comm.backend=mpi, host-staged collectives, on 1 rank and
#      on 2 ranks sharing the GPU with pp=2 and with cp=2), each
#      loss within 1e-5 relative of the CPU reference computed when the
#      bundle was built (ref/*.csv; fp32); and quickstart in bf16 (the
#      device's cublasGemmEx) within 1e-3 of the CPU's bf16 run
#   4. throughput of bench-quickstart, bench-gpt2-small and bench-1b on 1 GPU,
#      each in fp32 and bf16, and of bench-1b-8k (ProLong-length documents,
#      4 x 8192 tokens) in bf16 with cuDNN attention and with the portable
#      kernel; then attention alone (bin/attention_bench, BM_attention_lengths,
#      portable against cuDNN, at most 120 s): tokens/s, achieved TFLOP/s, MFU against the
#      device's fp32, TF32 and bf16 dense peaks, peak device memory; one table,
#      RESULTS_DIR/gpu-check.csv. The peaks are the device table's
#      (core/device_table.hpp, through `wlb4d-plan --devices NAME`) for the
#      name nvidia-smi gives GPU 0; WLB4D_CHECK_DEVICE=KEY (a plan.device key:
#      a100 a100-40gb h100 h100-pcie h200) picks the row instead. A device not
#      in the table gets no MFU columns (empty), the rest of the row stays.
#   5. optional, where python3 has a CUDA PyTorch: the PyTorch peer
#      (tools/torch_compare.py: the same model from wlb4d's initial weights, the
#      same packed micro-batches, data/peer-*.npz) on bench-gpt2-small (at most
#      90 s) and bench-1b-8k (at most 150 s), bf16 autocast and SDPA, 4 steps
#      beside wlb4d's 4:
#      tokens/s and MFU of both under one FLOP formula, and their step-1 losses.
# WLB4D_CHECK_QUICK=1 (the host-kind bundle test) runs 2 and 3 on the CPU.
set -uo pipefail
P=$(cd "$(dirname "$0")" && pwd)
R=${1:-$P/results}
mkdir -p "$R"
R=$(cd "$R" && pwd)
kind=$(sed -n 's/^kind=//p' "$P/MANIFEST")
quick=${WLB4D_CHECK_QUICK:-0}
failures=()
t_start=$SECONDS
say() { echo "== $*"; }
fail() { failures+=("$1"); echo "FAILED: $1"; }
echo "wlb4d GPU bundle: $(sed -n 's/^git=//p' "$P/MANIFEST"), built $(sed -n 's/^built=//p' "$P/MANIFEST"), kind $kind"

# ---- 1. the GPU
backend=mpi
if [ "$kind" = cuda ]; then
  backend=nccl
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu-check: no GPU visible (nvidia-smi)"; exit 1
  fi
  say "GPU"
  nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_cap,clocks.max.sm,power.limit \
    --format=csv | tee "$R/nvidia-smi.csv"
fi

# ---- CUDA runtime libraries the bundle leaves to the target
cuda_dirs=()
if [ "$kind" = cuda ]; then
  cands=("${CUDA_HOME:-/usr/local/cuda}/lib64" "${CUDA_HOME:-/usr/local/cuda}/targets/x86_64-linux/lib")
  for d in /usr/local/cuda*/lib64 /usr/local/cuda*/targets/x86_64-linux/lib; do cands+=("$d"); done
  while read -r d; do cands+=("$d"); done < <(python3 - <<'EOF' 2>/dev/null
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib"))) + [os.path.join(r, "torch", "lib")]:
        if os.path.isdir(d):
            print(d)
EOF
)
  for so in $(sed -n 's/^from_target=//p' "$P/MANIFEST"); do
    case "$so" in libcuda.so*|libnvidia-*) continue ;; esac
    found=
    dirs=("${cands[@]}")
    case "$so" in
      libcudnn*)
        # cuDNN 9's libcudnn.so.9 is a loader that dlopens its engines
        # (libcudnn_graph, libcudnn_engines_*) from the library path: a folder
        # counts only with libcudnn_graph beside it. The pip wheel's folder
        # (site-packages/nvidia/cudnn/lib, PyTorch's) is tried first.
        dirs=()
        for d in "${cands[@]}"; do [[ "$d" == */nvidia/cudnn/lib ]] && dirs+=("$d"); done
        for d in "${cands[@]}"; do [[ "$d" == */nvidia/cudnn/lib ]] || dirs+=("$d"); done
        ;;
    esac
    for d in "${dirs[@]}"; do
      [ -e "$d/$so" ] || continue
      case "$so" in libcudnn.so.*) compgen -G "$d/libcudnn_graph.so*" >/dev/null || continue ;; esac
      found=$d; break
    done
    if [ -z "$found" ] && p=$(ldconfig -p 2>/dev/null | awk -v s="$so" '$1 == s {print $NF; exit}') && [ -n "$p" ]; then
      found=$(dirname "$p")
    fi
    if [ -z "$found" ]; then
      fail "CUDA library $so not found (set CUDA_HOME, or pip install the nvidia-* wheel)"
      continue
    fi
    echo "  $so from $found"
    case " ${cuda_dirs[*]-} " in *" $found "*) ;; *) cuda_dirs+=("$found") ;; esac
  done
  WLB4D_CUDA_LIBS=$(IFS=:; echo "${cuda_dirs[*]-}")
  export WLB4D_CUDA_LIBS
fi
MPIEXEC=("$P/bin/mpiexec" -n 1)
export KOKKOS_DEVICE_ID=0

# ---- 2. device tests
say "device tests"
for t in "$P"/tests/test_*; do
  name=$(basename "$t")
  [ "$kind" != cuda ] && [ "$name" = test_comm_nccl ] && continue
  [ "$quick" = 1 ] && [ "$name" != test_adamw ] && continue
  t0=$SECONDS
  if timeout 300 "${MPIEXEC[@]}" "$t" >"$R/$name.log" 2>&1; then
    printf '  %-26s passed %4d s\n' "$name" $((SECONDS - t0))
  else
    tail -20 "$R/$name.log"
    fail "$name (log: $R/$name.log)"
  fi
done

# ---- 3. CPU-vs-GPU equivalence
say "equivalence with the CPU reference (10 steps, 1 rank, fp32, rtol 1e-5)"
# equiv NAME DECK DATA [BACKEND [PRECISION RTOL [LAYOUT]]] (the reference is
# ref/NAME-without-suffix.csv, a 1-rank CPU run); LAYOUT "pp=2" runs 2 ranks
# on this one GPU with parallel.pp=2 (layout equivalence: every layout gives
# the 1-rank losses).
equiv() {
  local name=$1 deck=$2 data=$3 be=${4:-$backend} prec=${5:-fp32} rtol=${6:-1e-5} ref=${1%%-*} layout=${7:-}
  local n=1 dp=1 pp=1 cp=1 tp=1
  if [ -n "$layout" ]; then eval "${layout%%=*}=${layout##*=}"; n=${layout##*=}; fi
  (cd "$R" && timeout 300 "$P/bin/mpiexec" -n "$n" "$P/bin/wlb4d" "$P/inputs/$deck" --data.train="$P/data/$data" --data.val= \
     --parallel.dp=$dp --parallel.pp=$pp --parallel.cp=$cp --parallel.tp=$tp --train.steps=10 --train.eval_every=0 \
     --checkpoint.every=0 --checkpoint.at_end=false --checkpoint.resume=never --log.timing_file= \
     --comm.backend="$be" --train.precision="$prec" --log.csv_file="$R/equiv-$name.csv" >"$R/equiv-$name.log" 2>&1) ||
    { tail -20 "$R/equiv-$name.log"; fail "equivalence run $name (log: $R/equiv-$name.log)"; return; }
  if python3 "$P/tools/check_losses.py" "$R/equiv-$name.csv" --against "$P/ref/$ref.csv" --rtol "$rtol" \
       >"$R/equiv-$name.check" 2>&1 && [ "$(grep -c ' ok$' "$R/equiv-$name.check")" = 10 ]; then
    echo "  $name: 10 of 10 steps within $rtol ($(grep -m1 -o 'worst.*' "$R/equiv-$name.check" || true))"
  else
    cat "$R/equiv-$name.check"
    fail "equivalence $name"
  fi
}
equiv tiny ci-tiny.ini tiny-train.h5
equiv quickstart quickstart.ini sotu-train.h5
# comm.backend=mpi on the device: collectives staged through host buffers.
[ "$kind" = cuda ] && equiv tiny-mpistaged ci-tiny.ini tiny-train.h5 mpi
# 2 ranks sharing this GPU (comm.backend=mpi: NCCL refuses two ranks on one
# device) give the 1-rank losses: pipeline p2p, and the CP K/V all-gather and
# dK/dV reduce-scatter.
equiv tiny-2ranks_pp ci-tiny.ini tiny-train.h5 mpi fp32 1e-5 pp=2
equiv tiny-2ranks_cp ci-tiny.ini tiny-train.h5 mpi fp32 1e-5 cp=2
# bf16 (the device's cublasGemmEx against the host's bf16 GEMMs). Both round
# the same fp32 operands to bf16 and accumulate in fp32, but in another order,
# so an activation near a bf16 rounding boundary can round the other way;
# 1e-3 is 10x what layouts of one build differ by in bf16
# (test_train_equiv_np2_bf16: 1e-4) and 10x below the bf16-vs-fp32 step-1 gap
# the bf16 tests allow (1e-2).
equiv quickstart_bf16 quickstart.ini sotu-train.h5 "$backend" bf16 1e-3

# ---- 4. throughput
if [ "$kind" = cuda ] && [ "$quick" != 1 ]; then
  say "throughput on 1 GPU"
  # Dense peaks (TFLOP/s, datasheet figures without sparsity) of the device
  # table row of this GPU: key,name,fp32,tf32,bf16,memory_gb.
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null | head -1)
  if [ -n "${WLB4D_CHECK_DEVICE:-}" ]; then
    dev_row=$("$P/bin/wlb4d-plan" --devices 2>/dev/null | awk -F, -v k="$WLB4D_CHECK_DEVICE" 'NR > 1 && $1 == k')
    dev_why="WLB4D_CHECK_DEVICE=$WLB4D_CHECK_DEVICE"
  else
    dev_row=$("$P/bin/wlb4d-plan" --devices "$gpu_name" 2>/dev/null | tail -n +2)
    dev_why="nvidia-smi name '$gpu_name'"
  fi
  peaks= dev_key=
  if [ -n "$dev_row" ]; then
    IFS=, read -r dev_key dev_name p_fp32 p_tf32 p_bf16 _ <<<"$dev_row"
    peaks="$p_fp32 $p_tf32 $p_bf16"
    echo "  MFU peaks: device table $dev_key ($dev_name; $dev_why): fp32 $p_fp32, tf32 $p_tf32, bf16 $p_bf16 TFLOP/s"
  else
    echo "  MFU peaks: none ($dev_why is not in the device table: $("$P/bin/wlb4d-plan" --devices 2>/dev/null |
      awk -F, 'NR > 1 {printf "%s%s", (NR > 2 ? " " : ""), $1}')); MFU columns left empty"
  fi
  csv=$R/gpu-check.csv
  echo "deck,precision,steps,tokens_per_s,tflops,mfu_fp32,mfu_tf32,mfu_bf16,mem_mib,step_ms,device,attention" >"$csv"
  printf '%-18s %-5s %12s %10s %9s %9s %9s %10s %9s %s\n' deck prec tokens/s TFLOP/s "MFU fp32" "MFU tf32" "MFU bf16" \
    "mem MiB" "step ms" attention
  # DECK:PRECISION[:ATTENTION]: ATTENTION is model.attention_kernel (default
  # auto: cuDNN for bf16 on a cuDNN bundle). bench-1b-8k (ProLong-length
  # documents, 4 x 8192 tokens) runs in bf16 with each kernel, side by side.
  for run in bench-quickstart:fp32 bench-quickstart:bf16 bench-gpt2-small:fp32 bench-gpt2-small:bf16 \
             bench-1b:fp32 bench-1b:bf16 bench-1b-8k:bf16:auto bench-1b-8k:bf16:portable; do
    IFS=: read -r deck prec attn <<<"$run"
    attn=${attn:-auto}
    data=sotu-train.h5
    if [ "$deck" = bench-1b-8k ]; then
      data=prolong-8k.h5
      [ -f "$P/data/$data" ] || { echo "  $deck: skipped (the bundle has no data/$data)"; continue; }
    fi
    log=$R/tput-$deck-$prec-$attn.log
    if ! (cd "$R" && timeout 240 "${MPIEXEC[@]}" "$P/bin/wlb4d" "$P/inputs/$deck.ini" --data.train="$P/data/$data" \
            --train.steps=4 --train.precision="$prec" --model.attention_kernel="$attn" --comm.backend=nccl \
            --log.csv_file= --log.timing_file= >"$log" 2>&1); then
      tail -20 "$log"; fail "throughput $deck $prec $attn (log: $log)"; continue
    fi
    kernel=$(grep -m1 -oE 'attention: (cuDNN fused SDPA|portable kernel)' "$log" | sed 's/attention: //')
    line=$(grep -E 'step +[0-9]+/' "$log" | tail -1)
    tok=$(sed -nE 's/.*\| ([0-9.]+) tok\/s\/dev.*/\1/p' <<<"$line")
    tfl=$(sed -nE 's/.* ([0-9.e+-]+) TFLOP\/s\/dev.*/\1/p' <<<"$line")
    detail=$(grep -E 'detail +[0-9]+/' "$log" | tail -1)  # memory in MiB is on the detail line
    mem=$(sed -nE 's/.*\| mem ([0-9]+) MiB.*/\1/p' <<<"$detail")
    ms=$(sed -nE 's/.*\| step ([0-9]+) ms.*/\1/p' <<<"$line")
    read -r row <<<"$(awk -v d="$deck" -v pr="$prec" -v t="$tok" -v g="$tfl" -v m="$mem" -v s="$ms" -v pk="$peaks" 'BEGIN{
      n = split(pk, p, " "); tf = g + 0;
      if (n == 3) { m1 = sprintf("%.2f%%", 100*tf/p[1]); m2 = sprintf("%.2f%%", 100*tf/p[2]); m3 = sprintf("%.2f%%", 100*tf/p[3]) }
      printf "%s,%s,4,%s,%.3f,%s,%s,%s,%s,%s", d, pr, t, tf, m1, m2, m3, m, s }')"
    echo "$row,${dev_key:-},$kernel" >>"$csv"
    IFS=, read -r d pr _ t tf m1 m2 m3 mm sm <<<"$row"
    printf '%-18s %-5s %12s %10s %9s %9s %9s %10s %9s %s\n' "$d" "$pr" "$t" "$tf" "$m1" "$m2" "$m3" "$mm" "$sm" "$kernel"
  done
  # Attention alone, forward + backward, on one micro-batch of ProLong-length
  # documents (bench/attention_bench.cpp, BM_attention_lengths): the portable
  # kernel against cuDNN at bench-1b-8k's heads and Llama-3.2-1B's.
  if [ -x "$P/bin/real/attention_bench" ]; then
    say "attention forward + backward, 8192 tokens of ProLong-length documents (at most 120 s)"
    if (cd "$R" && WLB4D_BENCH_LENGTHS="$P/inputs/dist/dist_prolong.json" WLB4D_PEAK_TFLOPS="${p_bf16:-}" \
          timeout 120 "$P/bin/attention_bench" --benchmark_filter='BM_attention_lengths/T:8192' \
          --benchmark_min_time=1 >"$R/attention_bench.log" 2>&1); then
      grep -E '^BM_attention_lengths' "$R/attention_bench.log" | sed 's/^/  /'
      echo "  (TFLOPs: pairs counted per document, FA-2 convention; peak_share: of the bf16 peak ${p_bf16:-unknown})"
    else
      tail -20 "$R/attention_bench.log"
      fail "attention bench (log: $R/attention_bench.log)"
    fi
  fi
  grep -h 'bf16 GEMM' "$R"/tput-*-bf16*.log 2>/dev/null | head -1 | sed 's/^.*info: /  /'
  # The cuDNN graph cache over bench-1b-8k's 4 steps (built, hits, build time).
  grep -h 'cuDNN graphs:' "$R"/tput-bench-1b-8k-bf16-auto.log 2>/dev/null | sed 's/^.*info: /  bench-1b-8k: /'
  echo "  (model FLOP per model::model_flops; steady state = the last of 4 steps; table also in $csv)"
fi

# ---- 5. the PyTorch peer (optional: needs python3 with a CUDA PyTorch and numpy, not h5py)
if [ "$kind" = cuda ] && [ "$quick" != 1 ]; then
  say "PyTorch peer beside wlb4d (bench-gpt2-small, then bench-1b-8k; bf16, SDPA, 4 steps each)"
  if [ ! -f "$P/data/peer-gpt2-small.npz" ]; then
    echo "  skipped: the bundle has no data/peer-gpt2-small.npz (no h5py where it was built)"
  elif ! python3 -c 'import sys, numpy, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    echo "  skipped: python3 has no PyTorch that sees a CUDA device (or no numpy)"
  else
    # The device table's bf16 peak of step 4 (WLB4D_CHECK_DEVICE included);
    # without one the script looks the GPU's name up itself.
    peer_peak=()
    [ -n "${p_bf16:-}" ] && peer_peak=(--peak-tflops "$p_bf16")
    # DECK:DATA:NPZ:SECONDS
    for peer in bench-gpt2-small:sotu-train.h5:peer-gpt2-small.npz:90 bench-1b-8k:prolong-8k.h5:peer-1b-8k.npz:150; do
      IFS=: read -r deck data npz secs <<<"$peer"
      [ -f "$P/data/$npz" ] && [ -f "$P/data/$data" ] || { echo "  $deck: skipped (no data/$npz)"; continue; }
      echo "  -- $deck (at most $secs s)"
      if (cd "$R" && timeout "$secs" python3 "$P/tools/torch_compare.py" "$P/inputs/$deck.ini" --device cuda \
            --precision bf16 --attention sdpa --batches "$P/data/$npz" --steps 4 --rounds 1 \
            --threads "$(nproc)" --wlb4d "$P/bin/wlb4d" --mpiexec "$P/bin/mpiexec" ${peer_peak[@]+"${peer_peak[@]}"} \
            --data.train="$P/data/$data" --comm.backend=nccl >"$R/peer-$deck.log" 2>&1); then
        grep -v '^deck ' "$R/peer-$deck.log" | sed 's/^/  /'
      else
        rc=$?
        tail -20 "$R/peer-$deck.log"
        fail "PyTorch peer $deck (exit $rc$([ $rc = 124 ] && echo ": past $secs s"); log: $R/peer-$deck.log)"
      fi
    done
  fi
fi

say "gpu-check: $((SECONDS - t_start)) s"
if [ "${#failures[@]}" -gt 0 ]; then
  printf 'FAILED: %s\n' "${failures[@]}"
  exit 1
fi
echo "gpu-check: all passed"

# shellcheck shell=bash
# Shared part of the wlb4d Slurm templates (slurm/*.sbatch source this file).
# Not a job script itself. Functions:
#   wlb4d_setup DECK [overrides...]   resolve WLB4D_BIN, ARGS, RUN_DIR; record the job
#   wlb4d_check_layout                read the resolved parallel.* (wlb4d --print-config),
#                                     print the layout, compare with the job's task count
#   wlb4d_done                        0 if checkpoint.dir/latest is at >= train.steps
#   wlb4d_launch [prefix...]          start the ranks with $LAUNCHER (srun | mpiexec)
#
# Template variables (environment; `sbatch --export=ALL,VAR=...` or plain `VAR=... sbatch ...`):
#   WLB4D_BIN   the trainer (default: build/app/wlb4d under the working directory,
#               else `wlb4d` on PATH, e.g. a Spack view)
#   DECK        input deck (the first script argument wins)
#   EXTRA       more --section.key=value overrides (word-split), after the script's arguments
#   RUN_DIR     per-job record directory (default runs/<job name>_<job id>; arrays:
#               runs/<name>_<array job id>/<task id>): job.txt, env.txt, config.ini, launch.txt
#   LAUNCHER    srun (default) | mpiexec
#   SRUN_MPI    srun's --mpi plugin (default pmi2: MPICH's simple PMI client speaks it;
#               pmix for a PMIx-built MPI, cray_shasta on HPE/Cray)
#   SRUN_ARGS   extra srun options (defaults per template, e.g. --cpu-bind=cores)
#   MPIEXEC     mpiexec command (default mpiexec); MPIEXEC_ARGS extra options (e.g. -bind-to core)
#   DRY_RUN=1   print what would be launched and stop after the layout check
#   WLB4D_SITE_ENV  a file sourced first in every job: the site's `module load ...` /
#               `spack env activate ...` / `spack load wlb4d` lines (see slurm/site-env.example.sh)
#   WLB4D_GPU_MAP   node-local rank i -> GPU WLB4D_GPU_MAP[i] (comma list, e.g. 2,3,0,1);
#               default in train-gpu.sbatch: the GPUs in NUMA order (wlb4d_gpu_numa_order)

wlb4d_log() { echo "[wlb4d-job] $*"; }
wlb4d_die() {
  echo "[wlb4d-job] ERROR: $*" >&2
  exit 2
}

# Number of ranks of this job (srun's default for a step filling the allocation).
wlb4d_ntasks() {
  if [ -n "${SLURM_NTASKS:-}" ]; then
    echo "$SLURM_NTASKS"
  elif [ -n "${SLURM_NPROCS:-}" ]; then
    echo "$SLURM_NPROCS"
  elif [ -n "${SLURM_NTASKS_PER_NODE:-}" ] && [ -n "${SLURM_NNODES:-}" ]; then
    echo $((SLURM_NTASKS_PER_NODE * SLURM_NNODES))
  else
    echo ""
  fi
}

# The site's environment (modules, Spack) before anything else, so WLB4D_BIN
# on PATH and the MPI/CUDA libraries come from it.
wlb4d_site_env() {
  [ -n "${WLB4D_SITE_ENV:-}" ] || return 0
  [ -r "$WLB4D_SITE_ENV" ] || wlb4d_die "WLB4D_SITE_ENV=$WLB4D_SITE_ENV is not a readable file"
  wlb4d_log "site environment: source $WLB4D_SITE_ENV"
  set +u
  # shellcheck disable=SC1090
  source "$WLB4D_SITE_ENV" || { set -u; wlb4d_die "sourcing WLB4D_SITE_ENV=$WLB4D_SITE_ENV failed"; }
  set -u
}

# GPUs of this node in NUMA order, as a comma list of device indices: the rows of
# `nvidia-smi topo -m` sorted by their "NUMA Affinity" column (stable, so GPUs of
# one NUMA node keep their index order). With srun --cpu-bind=cores and block
# distribution, node-local rank i runs on the i-th block of cores, so mapping it
# to the i-th GPU of this list gives each rank a GPU on its own NUMA node.
# Prints nothing when nvidia-smi is missing or reports no NUMA affinity.
wlb4d_gpu_numa_order() {
  command -v "${NVIDIA_SMI:-nvidia-smi}" >/dev/null 2>&1 || return 0
  "${NVIDIA_SMI:-nvidia-smi}" topo -m 2>/dev/null | awk '
    !hdr && /NUMA Affinity/ { hdr = 1; for (i = 1; i <= NF; i++) if ($i ~ /^(GPU|NIC)[0-9]+$|^mlx/) ncol++; next }
    hdr && $1 ~ /^GPU[0-9]+$/ {
      numa = $(ncol + 3)               # name, ncol matrix cells, CPU affinity, NUMA affinity
      if (numa !~ /^[0-9]+$/) exit 1   # N/A: no NUMA information
      printf "%d %d\n", numa, substr($1, 4) }' | sort -s -n -k1,1 | awk '{ printf "%s%s", sep, $2; sep = "," } END { if (NR) print "" }'
}

wlb4d_setup() {
  wlb4d_site_env
  DECK=${1:-${DECK:-}}
  [ $# -gt 0 ] && shift
  [ -n "$DECK" ] || wlb4d_die "no deck: sbatch $(basename "${WLB4D_TEMPLATE:-slurm/train.sbatch}") DECK.ini [--section.key=value ...]"
  [ -r "$DECK" ] || wlb4d_die "deck '$DECK' not readable from $(pwd)"
  ARGS=("$@")
  # shellcheck disable=SC2206
  [ -n "${EXTRA:-}" ] && ARGS+=(${EXTRA})
  WLB4D_BIN=${WLB4D_BIN:-${WLB4D:-}}
  if [ -z "$WLB4D_BIN" ]; then
    if [ -x build/app/wlb4d ]; then
      WLB4D_BIN=$(pwd)/build/app/wlb4d
    elif command -v wlb4d >/dev/null 2>&1; then
      WLB4D_BIN=$(command -v wlb4d)
    else
      wlb4d_die "no trainer: set WLB4D_BIN=/path/to/wlb4d (neither ./build/app/wlb4d nor wlb4d on PATH)"
    fi
  fi
  [ -x "$WLB4D_BIN" ] || wlb4d_die "WLB4D_BIN=$WLB4D_BIN is not an executable"
  LAUNCHER=${LAUNCHER:-srun}
  case "$LAUNCHER" in srun | mpiexec) ;; *) wlb4d_die "LAUNCHER=$LAUNCHER: must be srun or mpiexec" ;; esac
  SRUN_MPI=${SRUN_MPI:-pmi2}
  MPIEXEC=${MPIEXEC:-mpiexec}
  local job=${SLURM_JOB_ID:-local}
  if [ -n "${SLURM_ARRAY_JOB_ID:-}" ]; then
    RUN_DIR=${RUN_DIR:-runs/${SLURM_JOB_NAME:-wlb4d}_${SLURM_ARRAY_JOB_ID}/${SLURM_ARRAY_TASK_ID}}
  else
    RUN_DIR=${RUN_DIR:-runs/${SLURM_JOB_NAME:-wlb4d}_${job}}
  fi
  mkdir -p "$RUN_DIR" || wlb4d_die "cannot create RUN_DIR=$RUN_DIR"
  if [ -n "${SLURM_JOB_ID:-}" ]; then
    scontrol show job "$SLURM_JOB_ID" >"$RUN_DIR/job.txt" 2>/dev/null || true
  fi
  env | grep -E '^(SLURM|SRUN|KOKKOS|OMP|OPENBLAS|NCCL|CUDA|MPICH|FI|UCX|HYDRA|MPIR|WLB4D)_' | sort >"$RUN_DIR/env.txt" || true
  wlb4d_log "job ${job}${SLURM_ARRAY_TASK_ID:+ (array task $SLURM_ARRAY_TASK_ID)} on ${SLURM_JOB_NODELIST:-$(hostname)} | $(date -Is)"
  wlb4d_log "bin $WLB4D_BIN | deck $DECK | overrides: ${ARGS[*]:-(none)} | run dir $RUN_DIR | workdir $(pwd)"
}

# Resolved value of section.key from config.ini (written by wlb4d_check_layout).
wlb4d_key() {
  awk -v sec="$1" -v key="$2" '
    /^\[/ { s = substr($0, 2, index($0, "]") - 2); next }
    s == sec { k = $1; if (k == key) { sub(/^[^=]*=[ \t]*/, ""); print; exit } }' "$RUN_DIR/config.ini"
}

wlb4d_check_layout() {
  # --print-config runs the trainer as an MPI singleton (no launcher); it also
  # validates the deck, so a bad key fails here, before the ranks start.
  if ! "$WLB4D_BIN" "$DECK" "${ARGS[@]}" --print-config >"$RUN_DIR/config.ini" 2>"$RUN_DIR/config.err"; then
    if [ "$LAUNCHER" = srun ] && [ -n "${SLURM_JOB_ID:-}" ] &&
      srun -N 1 -n 1 --mpi="$SRUN_MPI" "$WLB4D_BIN" "$DECK" "${ARGS[@]}" --print-config \
        >"$RUN_DIR/config.ini" 2>"$RUN_DIR/config.err"; then
      :
    else
      cat "$RUN_DIR/config.err" >&2
      wlb4d_die "the deck does not resolve: $WLB4D_BIN $DECK ${ARGS[*]} --print-config"
    fi
  fi
  [ -s "$RUN_DIR/config.err" ] || rm -f "$RUN_DIR/config.err"
  local dp pp cp tp need have
  dp=$(wlb4d_key parallel dp) pp=$(wlb4d_key parallel pp) cp=$(wlb4d_key parallel cp) tp=$(wlb4d_key parallel tp)
  [ -n "$dp" ] && [ -n "$pp" ] && [ -n "$cp" ] && [ -n "$tp" ] ||
    wlb4d_die "no [parallel] dp/pp/cp/tp in $RUN_DIR/config.ini"
  need=$((dp * pp * cp * tp))
  have=$(wlb4d_ntasks)
  wlb4d_log "layout dp=$dp pp=$pp cp=$cp tp=$tp -> $need ranks | job: ${have:-?} tasks on ${SLURM_NNODES:-?} nodes, ${SLURM_CPUS_PER_TASK:-1} CPUs/task | launcher $LAUNCHER"
  if [ -z "$have" ]; then
    wlb4d_die "the job's task count is unknown (SLURM_NTASKS unset): submit with -n/--ntasks or --ntasks-per-node"
  fi
  if [ "$need" != "$have" ]; then
    wlb4d_die "deck layout parallel.dp*pp*cp*tp = $dp*$pp*$cp*$tp = $need ranks, but this job has $have tasks (SLURM_NTASKS). Submit with -n $need (or --nodes/--ntasks-per-node giving $need), or change --parallel.dp/pp/cp/tp"
  fi
  WLB4D_NRANKS=$need
}

# Resume bookkeeping for chained / requeued jobs: the step of the newest
# checkpoint named by checkpoint.dir/latest (empty if none).
wlb4d_latest_step() {
  local dir latest f
  dir=$(wlb4d_key checkpoint dir)
  latest=${dir:-.}/latest
  [ -s "$latest" ] || return 0
  f=$(head -1 "$latest")
  f=${f##*/}
  f=${f#step_}
  f=${f%%.*}
  [[ "$f" =~ ^[0-9]+$ ]] && echo $((10#$f))
}

# 0 when the run is already complete (a chained job with nothing left to do).
wlb4d_done() {
  local resume steps s
  resume=$(wlb4d_key checkpoint resume)
  [ "$resume" = auto ] || return 1
  steps=$(wlb4d_key train steps)
  s=$(wlb4d_latest_step)
  [ -n "$s" ] && [ -n "$steps" ] && [ "$s" -ge "$steps" ]
}

# wlb4d_launch [per-rank prefix...]: the prefix runs before the trainer on every
# rank (e.g. slurm/lib/bind-gpu.sh). Returns the launcher's exit status.
wlb4d_launch() {
  local cmd
  if [ "$LAUNCHER" = srun ]; then
    # shellcheck disable=SC2206
    # --kill-on-bad-exit=1: one rank failing ends the step, instead of the others
    # waiting in a collective until the time limit.
    cmd=(srun --mpi="$SRUN_MPI" --ntasks="$WLB4D_NRANKS" --kill-on-bad-exit=1 ${SRUN_ARGS:-} "$@" "$WLB4D_BIN" "$DECK" "${ARGS[@]}")
  else
    # hydra's mpiexec reads the allocation (SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE)
    # and starts its proxies with srun itself; it ends every rank when one fails.
    # shellcheck disable=SC2206
    cmd=($MPIEXEC -n "$WLB4D_NRANKS" ${MPIEXEC_ARGS:-} "$@" "$WLB4D_BIN" "$DECK" "${ARGS[@]}")
  fi
  printf '%q ' "${cmd[@]}" >"$RUN_DIR/launch.txt"
  echo >>"$RUN_DIR/launch.txt"
  wlb4d_log "launch: $(cat "$RUN_DIR/launch.txt")"
  if [ "${DRY_RUN:-0}" = 1 ]; then
    wlb4d_log "DRY_RUN=1: not launching"
    return 0
  fi
  local t0=$SECONDS rc=0
  "${cmd[@]}" || rc=$?
  wlb4d_log "ranks exited with status $rc after $((SECONDS - t0)) s"
  return $rc
}

# wlb4d_finish STATUS: the end of a training job. With REQUEUE=1, a run that
# stopped early with status 0 (SIGUSR1/SIGTERM before the time limit: the
# trainer wrote a checkpoint and exited 0) requeues this job, which then
# resumes with checkpoint.resume=auto; MAX_REQUEUE (default 20) bounds the loop.
# "Incomplete" = the newest checkpoint is before train.steps, so this needs
# checkpoint.at_end=true (the default). Slurm makes a requeued job eligible
# again after about 2 minutes (its requeue delay).
wlb4d_finish() {
  local rc=$1 step steps
  step=$(wlb4d_latest_step)
  steps=$(wlb4d_key train steps)
  wlb4d_log "end: status $rc | newest checkpoint step ${step:-none} of train.steps=${steps:-?} | $(date -Is)"
  if [ "$rc" = 0 ] && [ "${REQUEUE:-0}" = 1 ] && ! wlb4d_done; then
    local n=${SLURM_RESTART_COUNT:-0}
    if [ "$(wlb4d_key checkpoint resume)" != auto ]; then
      wlb4d_log "REQUEUE=1 ignored: checkpoint.resume is not auto"
    elif [ "$(wlb4d_key checkpoint at_end)" != true ]; then
      # without a checkpoint at the end, a finished run looks unfinished: never requeue then
      wlb4d_log "REQUEUE=1 ignored: needs checkpoint.at_end=true (a finished run must leave its last checkpoint)"
    elif [ -z "$step" ]; then
      wlb4d_log "REQUEUE=1 ignored: no checkpoint to resume from"
    elif [ "$n" -ge "${MAX_REQUEUE:-20}" ]; then
      wlb4d_log "REQUEUE=1: restart count $n reached MAX_REQUEUE=${MAX_REQUEUE:-20}; not requeueing"
    else
      wlb4d_log "REQUEUE=1: run incomplete, requeueing job $SLURM_JOB_ID (restart $((n + 1)))"
      scontrol requeue "$SLURM_JOB_ID" || wlb4d_log "scontrol requeue failed"
    fi
  fi
  return "$rc"
}

# wlb4d_default_arg KEY VALUE: append --KEY=VALUE to ARGS unless an override of
# KEY is already there (the command line must not name a key twice).
wlb4d_default_arg() {
  local a
  for a in "${ARGS[@]}"; do [[ "$a" == "--$1="* ]] && return 0; done
  ARGS+=("--$1=$2")
}

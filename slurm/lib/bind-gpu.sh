#!/bin/bash
# Per-rank prefix of slurm/train-gpu.sbatch: one GPU per rank, every GPU of the
# node visible to every rank (so NCCL / CUDA IPC peer access works between the
# ranks of a node). Kokkos::initialize reads KOKKOS_DEVICE_ID (Kokkos 3.x-5.x)
# and calls cudaSetDevice before wlb4d builds its NCCL communicator.
#   srun:    SLURM_LOCALID is the node-local task index
#   mpiexec: hydra sets MPI_LOCALRANKID (SLURM_LOCALID is then the proxy's, always 0)
#   WLB4D_GPU_MAP=2,3,0,1: local rank i gets GPU map[i mod len] (train-gpu.sbatch
#   sets it to the GPUs in NUMA order); unset or empty: GPU = local rank mod GPUs
local_rank=${MPI_LOCALRANKID:-${SLURM_LOCALID:-0}}
ngpu=${WLB4D_GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-0}}
if [ -n "${WLB4D_GPU_MAP:-}" ]; then
  IFS=, read -r -a _map <<<"$WLB4D_GPU_MAP"
  export KOKKOS_DEVICE_ID=${_map[$((local_rank % ${#_map[@]}))]}
elif [ -n "$ngpu" ] && [ "$ngpu" -gt 0 ] 2>/dev/null; then
  export KOKKOS_DEVICE_ID=$((local_rank % ngpu))
else
  export KOKKOS_DEVICE_ID=$local_rank
fi
if [ "${WLB4D_BIND_VERBOSE:-0}" = 1 ]; then
  echo "bind-gpu: $(hostname) local rank $local_rank -> KOKKOS_DEVICE_ID=$KOKKOS_DEVICE_ID (map ${WLB4D_GPU_MAP:-none}, CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset})" >&2
fi
exec "$@"

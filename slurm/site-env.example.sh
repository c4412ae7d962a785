# shellcheck shell=bash
# Site environment of the wlb4d Slurm templates: copy, edit, and submit with
#   WLB4D_SITE_ENV=$PWD/site-env.sh sbatch slurm/train-gpu.sbatch DECK ...
# It is sourced at the start of every job (before WLB4D_BIN is looked up), so
# `wlb4d` on PATH and its MPI/CUDA libraries come from here. Placeholders: each
# line is a site choice; uncomment and adapt.
#
# Modules:
# module load PrgEnv-gnu cray-mpich cudatoolkit          # HPE/Cray
# module load gcc openmpi cuda                             # other sites
#
# Spack: the environment of this repository (spack.yaml) or the installed package:
# . /path/to/spack/share/spack/setup-env.sh
# spack env activate /path/to/wlb4d                      # then WLB4D_BIN=build/app/wlb4d
# spack load wlb4d+cuda                                  # or: the wlb4d package on PATH
#
# Fabric settings for NCCL / libfabric belong here too (see slurm/train-gpu.sbatch).
:

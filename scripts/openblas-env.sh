# Sourced (not run) by scripts/quickstart.sh, scripts/bench.sh and
# slurm/train-cpu.sbatch: when OPENBLAS_CORETYPE is unset, set it to the
# OpenBLAS kernel of the widest instruction set this CPU has (AVX-512:
# SkylakeX, AVX2 + FMA: Haswell). An OpenBLAS older than
# the CPU (Debian 12's 0.3.21 on Zen 5) otherwise falls back to its generic
# SSE3 kernel "Prescott": measured on one Zen 5 core 25-30 GFLOP/s, against
# 101 for Haswell (AVX2) and 188 for SkylakeX (AVX-512), the fastest measured
# there (other CPUs were not measured). A value that is set
# is never changed; WLB4D_OPENBLAS_AUTO=0 turns the choice off. wlb4d prints
# the kernel it got at start-up (and warns when it is below the CPU's).
_wlb4d_cpuinfo=${WLB4D_CPUINFO:-/proc/cpuinfo}   # tests point it at a fixture
if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ "${WLB4D_OPENBLAS_AUTO:-1}" != 0 ] && [ -r "$_wlb4d_cpuinfo" ]; then
  _wlb4d_flags=$(grep -m1 "^flags" "$_wlb4d_cpuinfo" || true)
  case " $_wlb4d_flags " in
    *" avx512f "*) export OPENBLAS_CORETYPE=SkylakeX ;;
    *" avx2 "*)
      case " $_wlb4d_flags " in *" fma "*) export OPENBLAS_CORETYPE=Haswell ;; esac ;;
  esac
  [ -n "${OPENBLAS_CORETYPE:-}" ] && echo "openblas-env: OPENBLAS_CORETYPE unset; using ${OPENBLAS_CORETYPE} (the kernel of this CPU's widest instruction set)" >&2
  unset _wlb4d_flags
fi
unset _wlb4d_cpuinfo

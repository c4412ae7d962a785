#!/bin/sh
# run_plot_timing.sh PYTHON plot_timing.py ARGS...: runs the plot script, or
# exits 77 (ctest SKIP_RETURN_CODE) when PYTHON lacks h5py or matplotlib.
py=$1; shift
if ! "$py" -c 'import h5py, matplotlib' 2>/dev/null; then
  echo "run_plot_timing: $py has no h5py/matplotlib: skipped"
  exit 77
fi
exec "$py" "$@"

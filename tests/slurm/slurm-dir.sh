# Sourced by start-slurm.sh, stop-slurm.sh and slurm_test.sh: where this
# checkout's test Slurm lives. Each checkout gets its own folder and ports, so
# two checkouts on one machine never share (or stop) each other's instance.
#   WLB4D_TEST_SLURM_DIR  default /tmp/wlb4d-slurm-<10 hex digits of the checkout's path hash>
#   WLB4D_SLURM_PORT      default 7000 + 2 * (that hash mod 1000) (slurmd: PORT + 1)
WLB4D_CHECKOUT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
wlb4d_slurm_id=$(printf '%s' "$WLB4D_CHECKOUT" | sha256sum | cut -c1-10)
WLB4D_TEST_SLURM_DIR=${WLB4D_TEST_SLURM_DIR:-/tmp/wlb4d-slurm-$wlb4d_slurm_id}
WLB4D_SLURM_PORT=${WLB4D_SLURM_PORT:-$((7000 + 2 * (16#${wlb4d_slurm_id:0:6} % 1000)))}
# The owner record start-slurm.sh writes: which checkout started the
# daemons of this folder (stop-slurm.sh stops only those).
WLB4D_SLURM_OWNER=$WLB4D_TEST_SLURM_DIR/owner

#!/usr/bin/env bash
# Installs wlb4d's Debian 12 build and run dependencies (idempotent: only the
# packages that are missing are installed). Needs root or sudo.
#   scripts/install-deps.sh               # build and run
#   scripts/install-deps.sh --test-peers  # also the independent peers some tests
#                                         # compare against (Node.js + npm for
#                                         # Hugging Face's tokenizers, PyTorch
#                                         # 1.13 for bench/torch_compare.py's
#                                         # self-test); those tests skip
#                                         # without them
set -euo pipefail
PKGS=(
  cmake g++ make pkg-config
  libtrilinos-kokkos-dev libtrilinos-kokkos-kernels-dev libopenblas-dev
  mpich libmpich-dev libhdf5-mpich-dev hdf5-tools
  libboost-program-options-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libsentencepiece-dev sentencepiece libpcre2-dev
  libgtest-dev libbenchmark-dev
  python3-h5py python3-matplotlib python3-numpy python3-yaml
  xz-utils
)
PEERS=()
if [ "${1:-}" = "--test-peers" ]; then
  command -v node > /dev/null || PEERS+=(nodejs)
  command -v npm > /dev/null || PEERS+=(npm)
  dpkg-query -W -f='${Status}' python3-torch 2>/dev/null | grep -q "install ok installed" || PEERS+=(python3-torch)
fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Peers are best-effort: a test that needs one skips (and says so) without it.
if [ ${#PEERS[@]} -gt 0 ]; then
  echo "install-deps: installing test peers ${PEERS[*]}"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${PEERS[@]}"; } \
    || echo "install-deps: test peers ${PEERS[*]} not installed; the tests that use them will skip"
fi

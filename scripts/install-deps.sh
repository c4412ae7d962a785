#!/usr/bin/env bash
# Installs wlb4d's Debian 12 build and run dependencies (idempotent: only the
# packages that are missing are installed). Needs root or sudo.
set -euo pipefail
PKGS=(
  cmake g++ make pkg-config
  libtrilinos-kokkos-dev libtrilinos-kokkos-kernels-dev libopenblas-dev
  mpich libmpich-dev libhdf5-mpich-dev hdf5-tools
  libboost-program-options-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libsentencepiece-dev sentencepiece
  libgtest-dev libbenchmark-dev
  python3-h5py python3-matplotlib python3-numpy python3-yaml
  xz-utils
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"

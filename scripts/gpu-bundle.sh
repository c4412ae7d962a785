#!/usr/bin/env bash
# Builds the self-contained GPU bundle (DESIGN §12): the CUDA
# binaries of a finished CUDA build, every shared library they load except the
# NVIDIA driver's and the CUDA runtime's (cudart, cuBLAS, cuBLASLt, NCCL, and
# cuDNN in a -DWLB4D_ENABLE_CUDNN=ON build: the target finds those in its
# toolkit or its PyTorch wheels; cuBLASLt alone is 540 MB, cuDNN's engines
# 400+ MB), mpiexec/hydra, the decks, prepared datasets, and CPU reference
# losses computed here, so a lent GPU machine with no MPI, HDF5, Boost or
# Kokkos can run `gpu-check.sh` with nothing but the bundle; and the PyTorch
# peer (bench/torch_compare.py with its packed micro-batches as an .npz,
# written here with h5py) that gpu-check.sh runs where the machine's Python
# has a CUDA PyTorch.
#
#   scripts/gpu-bundle.sh OUT        # OUT/gpu-check.sh + OUT/wlb4d-gpu.tar.xz
#
# On the target: copy OUT over, run `OUT/gpu-check.sh` (it unpacks the archive
# once, next to itself, then runs payload/gpu-check.sh).
#
# Environment:
#   CUDA_BUILD_DIR   the CUDA build (default build-cuda; scripts/check-cuda-build.sh makes it)
#   HOST_BUILD_DIR   a host build (default build): prepares the datasets and
#                    computes the CPU reference losses
#   WLB4D_BUNDLE_KIND=host   bundle the host build instead (tests the bundle's
#                    closure and its loader path on a machine without a GPU:
#                    ctest -R gpu_bundle_host)
#   WLB4D_BUNDLE_COMPRESS=xz|none    none leaves the payload as a folder, OUT/payload
#   MAX_MIB          size limit of OUT (default 64: what travels to a lent machine)
#
# Layout of the payload: bin/real/* are the stripped ELF files; bin/<tool> are
# wrappers (scripts/gpu-bundle/run-tool.sh) that put lib/ (and the CUDA
# libraries gpu-check.sh found) on LD_LIBRARY_PATH, and, when the target's
# glibc is older than the one the binaries need (MANIFEST: glibc_required),
# start them through the bundled loader lib/glibc/ld-linux-x86-64.so.2.
# Skips (exit 0, a line starting with "skipped:") when the build is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$(pwd)
OUT=${1:?usage: scripts/gpu-bundle.sh OUT}
KIND=${WLB4D_BUNDLE_KIND:-cuda}
HOST_BUILD_DIR=${HOST_BUILD_DIR:-build}
case "$KIND" in
  cuda) BIN_BUILD=${CUDA_BUILD_DIR:-build-cuda} ;;
  host) BIN_BUILD=$HOST_BUILD_DIR ;;
  *) echo "gpu-bundle: WLB4D_BUNDLE_KIND must be cuda or host, not '$KIND'" >&2; exit 2 ;;
esac
COMPRESS=${WLB4D_BUNDLE_COMPRESS:-xz}
MAX_MIB=${MAX_MIB:-64}
case "$COMPRESS" in xz|none) ;; *) echo "gpu-bundle: WLB4D_BUNDLE_COMPRESS must be xz or none" >&2; exit 2 ;; esac
for b in "$BIN_BUILD" "$HOST_BUILD_DIR"; do
  if [ ! -x "$b/app/wlb4d" ]; then
    echo "skipped: gpu-bundle: no $b/app/wlb4d (build it first: scripts/build.sh, scripts/check-cuda-build.sh)"
    exit 0
  fi
done
t0=$SECONDS
rm -rf "$OUT"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
P=$OUT/payload
mkdir -p "$P"/{bin/real,tests/real,lib/glibc,inputs,data,ref,tools}

# ---- binaries: the tools, hydra, and the tests gpu-check.sh runs on the device
tools=(wlb4d wlb4d-prep wlb4d-ckpt wlb4d-plan)
for t in "${tools[@]}"; do cp "$BIN_BUILD/app/$t" "$P/bin/real/"; done
# The attention benchmark (portable kernel against cuDNN on ProLong-length
# documents, gpu-check.sh step 4), where the build made it.
if [ -x "$BIN_BUILD/bench/attention_bench" ]; then
  cp "$BIN_BUILD/bench/attention_bench" "$P/bin/real/"
  tools+=(attention_bench)
fi
hydra=$(readlink -f "$(command -v mpiexec)")
proxy=$(command -v hydra_pmi_proxy || true)
[ -x "$hydra" ] && [ -n "$proxy" ] || { echo "gpu-bundle: mpiexec (hydra) and hydra_pmi_proxy must be on PATH" >&2; exit 1; }
cp "$hydra" "$P/bin/real/mpiexec"
cp "$proxy" "$P/bin/real/hydra_pmi_proxy"
# Kernel and device tests (self-contained gtest executables, no data files).
# test_model_attention_cudnn exists in a cuDNN build only (cuDNN against the portable kernel).
device_tests=(unit/model/test_model_layers unit/model/test_model_transformer unit/model/test_model_step_alloc
              unit/model_attention/test_model_attention unit/optim/test_adamw unit/core/test_core_memory
              unit/core/test_core_bf16 unit/model/test_model_bf16 mpi/comm/test_comm_nccl
              unit/model_attention/test_model_attention_cudnn)
for t in "${device_tests[@]}"; do
  [ -x "$BIN_BUILD/tests/$t" ] && cp "$BIN_BUILD/tests/$t" "$P/tests/real/"
done
# Stripped copies: debug sections are most of a test binary's size.
strip --strip-unneeded "$P"/bin/real/* "$P"/tests/real/* 2>/dev/null || true

# ---- the shared-library closure (ldd resolves transitively)
# Left to the target: the driver (libcuda, libnvidia-*), the CUDA runtime
# libraries (cudart, cuBLAS, cuBLASLt, NCCL, NVRTC: cudnn-frontend compiles with it), cuDNN (libcudnn*: the 9.x loader
# a cuDNN build links dlopens its engines, libcudnn_engines_precompiled.so.9
# alone 245 MB, from its own folder; gpu-check.sh finds them in the target's
# site-packages/nvidia/cudnn/lib), and the vDSO. glibc goes to lib/glibc, used
# only through the bundled loader when the target's glibc is too old. Keep
# this list equal to check-closure.sh's target_re.
target_re='^(libcuda\.so|libnvidia-|libcudart\.so|libcublas\.so|libcublasLt\.so|libnccl\.so|libnvrtc|libcudnn|linux-vdso)'
glibc_re='^(ld-linux-x86-64\.so|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libresolv\.so|libutil\.so|libmvec\.so)'
declare -A from_target=()
for f in "$P"/bin/real/* "$P"/tests/real/*; do
  while read -r name arrow path _; do
    [ -z "$name" ] && continue
    if [[ "$name" == /* ]]; then path=$name; name=$(basename "$name"); fi
    if [[ "$name" =~ $target_re ]]; then
      [[ "$name" == linux-vdso* ]] || from_target[$name]=1
      continue
    fi
    [ "$arrow" = "=>" ] || [[ "$path" == /* ]] || continue
    if [ "$path" = "not" ]; then echo "gpu-bundle: $f needs $name, which is not found here" >&2; exit 1; fi
    dest=$P/lib
    [[ "$name" =~ $glibc_re ]] && dest=$P/lib/glibc
    [ -e "$dest/$name" ] || cp -L "$path" "$dest/$name"
  done < <(ldd "$f" | sed 's/^[[:space:]]*//')
done
# The loader itself (ldd prints it by its absolute path).
[ -e "$P/lib/glibc/ld-linux-x86-64.so.2" ] || cp -L /lib64/ld-linux-x86-64.so.2 "$P/lib/glibc/"
strip --strip-unneeded "$P"/lib/*.so* 2>/dev/null || true

# ---- wrappers
cp scripts/gpu-bundle/run-tool.sh "$P/bin/run"
for t in "${tools[@]}" mpiexec hydra_pmi_proxy; do ln -s run "$P/bin/$t"; done
for f in "$P"/tests/real/*; do ln -s ../bin/run "$P/tests/$(basename "$f")"; done

# ---- decks, datasets, CPU references
cp inputs/ci-base.ini inputs/ci-tiny.ini inputs/ci-tiny.ref.csv inputs/quickstart.ini \
   inputs/bench-quickstart.ini inputs/bench-gpt2-small.ini inputs/bench-1b.ini inputs/bench-1b-8k.ini "$P/inputs/"
mkdir -p "$P/inputs/dist"
cp inputs/dist/dist_prolong.json "$P/inputs/dist/"
cp tests/tools/check_losses.py bench/torch_compare.py "$P/tools/"
cp scripts/gpu-bundle/gpu-check.sh "$P/gpu-check.sh"
H=$(cd "$HOST_BUILD_DIR/app" && pwd)
"$H/wlb4d-prep" --input tests/data/tiny.jsonl --output "$P/data/tiny-train.h5" >/dev/null
# The quickstart's datasets, made as README's Data section makes them.
"$H/wlb4d-prep" --input inputs/corpus/sotu-embedded.jsonl.xz --output "$P/data/sotu-train.h5" \
  --val-fraction 0.1 --val-output "$P/data/sotu-val.h5" >/dev/null
# Long documents for bench-1b-8k: synthetic tokens, document lengths drawn
# from DistCA's ProLong sample; 1 M tokens, about 30 steps of 4 x 8192.
HB=$(cd "$HOST_BUILD_DIR" && pwd)
if [ -x "$HB/bench/dataset_scale" ]; then
  "$HB/bench/dataset_scale" make-lengths "$P/data/prolong-8k.h5" inputs/dist/dist_prolong.json 1000000 >/dev/null
else
  echo "gpu-bundle: no $HOST_BUILD_DIR/bench/dataset_scale: no data/prolong-8k.h5 (gpu-check.sh skips bench-1b-8k)"
fi
# The PyTorch peer's micro-batches (gpu-check.sh step 5, tools/torch_compare.py
# --batches): packed here from the HDF5 file, since the GPU machine's Python
# may have torch but no h5py. PYTHON, else the first of python3 and
# /usr/bin/python3 with h5py and numpy; with none, no .npz (step 5 says so).
peer_py=
for py in ${PYTHON:-} python3 /usr/bin/python3; do
  if "$py" -c 'import h5py, numpy' 2>/dev/null; then peer_py=$py; break; fi
done
if [ -n "$peer_py" ]; then
  "$peer_py" bench/torch_compare.py inputs/bench-gpt2-small.ini --wlb4d "$H/wlb4d" --steps 4 \
    --write-batches "$P/data/peer-gpt2-small.npz" --data.train="$P/data/sotu-train.h5"
  if [ -f "$P/data/prolong-8k.h5" ]; then
    "$peer_py" bench/torch_compare.py inputs/bench-1b-8k.ini --wlb4d "$H/wlb4d" --steps 4 \
      --write-batches "$P/data/peer-1b-8k.npz" --data.train="$P/data/prolong-8k.h5"
  fi
else
  echo "gpu-bundle: no Python with h5py and numpy here: no data/peer-gpt2-small.npz (gpu-check.sh skips the PyTorch peer)"
fi
# CPU reference losses (fp32, 1 rank, 10 steps), the numbers gpu-check.sh's
# equivalence check compares the device against (layout equivalence makes the
# 1-rank run the reference of every layout).
ref_steps=10
one_rank=(--parallel.dp=1 --parallel.pp=1 --parallel.cp=1 --parallel.tp=1 --train.eval_every=0
          --checkpoint.every=0 --checkpoint.at_end=false --checkpoint.resume=never --log.timing_file=)
(cd "$P" && "$H/wlb4d" inputs/ci-tiny.ini --data.train=data/tiny-train.h5 --train.steps=$ref_steps \
   "${one_rank[@]}" --log.csv_file=ref/tiny.csv >ref/tiny.log 2>&1) ||
  { cat "$P/ref/tiny.log"; echo "gpu-bundle: the CPU reference run of ci-tiny failed" >&2; exit 1; }
(cd "$P" && "$H/wlb4d" inputs/quickstart.ini --data.train=data/sotu-train.h5 --data.val= \
   --train.steps=$ref_steps "${one_rank[@]}" --log.csv_file=ref/quickstart.csv >ref/quickstart.log 2>&1) ||
  { cat "$P/ref/quickstart.log"; echo "gpu-bundle: the CPU reference run of quickstart failed" >&2; exit 1; }
# The same in bf16 (train.precision = bf16): the device's cublasGemmEx against this host's bf16 GEMMs.
(cd "$P" && "$H/wlb4d" inputs/quickstart.ini --data.train=data/sotu-train.h5 --data.val= --train.precision=bf16 \
   --train.steps=$ref_steps "${one_rank[@]}" --log.csv_file=ref/quickstart_bf16.csv >ref/quickstart_bf16.log 2>&1) ||
  { cat "$P/ref/quickstart_bf16.log"; echo "gpu-bundle: the CPU bf16 reference run of quickstart failed" >&2; exit 1; }

# ---- manifest
need_glibc=$(for f in "$P"/bin/real/* "$P"/tests/real/* "$P"/lib/*.so*; do
               objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_[0-9][0-9.]*' ; done | sed 's/GLIBC_//' | sort -uV | tail -1)
{
  echo "kind=$KIND"
  echo "git=$(git -C "$SRC" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
  echo "glibc_required=$need_glibc"
  echo "glibc_bundled=$(getconf GNU_LIBC_VERSION | awk '{print $2}')"
  echo "from_target=${!from_target[*]}"
  echo "cudnn=$(sed -n 's/^WLB4D_ENABLE_CUDNN:BOOL=//p' "$BIN_BUILD/CMakeCache.txt" 2>/dev/null | head -1)"
  echo "version: $("$H/wlb4d" --version 2>/dev/null | tr '\n' ' ')"
} >"$P/MANIFEST"
(cd "$P" && find . -type f -printf '%s %p\n' | sort -k2) >"$P/FILES"

# ---- closure check (the CI test): every ELF's NEEDED entries resolve inside
# the bundle, except what the target provides; and ldd, with only the bundle
# on LD_LIBRARY_PATH, resolves nothing outside it but glibc and those.
scripts/gpu-bundle/check-closure.sh "$P"

# ---- pack
cp scripts/gpu-bundle/launcher.sh "$OUT/gpu-check.sh"
if [ "$COMPRESS" = xz ]; then
  tar -C "$P" -cf - . | xz -T2 -6 >"$OUT/wlb4d-gpu.tar.xz"
  raw=$(du -sb "$P" | cut -f1)
  rm -rf "$P"
  echo "gpu-bundle: payload $((raw / 1048576)) MiB unpacked"
fi
size=$(du -sb "$OUT" | cut -f1)
echo "gpu-bundle: $OUT is $((size / 1048576)) MiB ($size bytes), limit $MAX_MIB MiB, $((SECONDS - t0)) s"
if [ "$size" -gt $((MAX_MIB * 1048576)) ]; then
  echo "gpu-bundle: $OUT is larger than $MAX_MIB MiB" >&2
  exit 1
fi

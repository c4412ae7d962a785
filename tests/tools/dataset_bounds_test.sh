#!/usr/bin/env bash
# dataset_bounds_test.sh MPIEXEC WLB4D WLB4D_PREP WLB4D_PLAN SOURCE_DIR PYTHON
# A token dataset's declared sizes are checked against the file's real
# extents before anything is read or allocated in proportion to them, on 1
# and 2 ranks of wlb4d and in wlb4d-plan (plan.lengths): each hostile file
# below is refused within seconds, on every rank, naming the file, the
# dataset and the rule. Each run has a 30 s limit: a hang fails.
#   sparse.h5   /tokens grown to 2^40 ids, one chunk written; offsets,
#               num_tokens and the checksum attribute consistent (~300 KB)
#   holes.h5    contiguous /tokens of 2^40 ids, last id written: a 4 TiB
#               sparse file that HDF5 finds consistent
#   offsets.h5  /doc_offsets declaring 2^37 entries, none written
set -u
source "$(dirname "$0")/lib.sh"
mpiexec=$1 wlb4d=$2 prep=$3 plan=$4 src=$5 py=$6
need_h5py "$py"
scratch_dir dsbound
ulimit -v 8388608 2>/dev/null || true  # an unbounded allocation fails fast instead of taking the machine
prep_tiny "$prep" "$src"
"$py" - <<'PY' || fail "h5py patch failed"
import h5py, numpy as np, shutil
N = 1 << 40
def edit(name):
    shutil.copy("tiny-train.h5", name)
    return h5py.File(name, "r+")
def one_doc(f, n):
    del f["doc_offsets"]
    f["doc_offsets"] = np.array([0, n], dtype=np.uint64)
    f.attrs["num_tokens"] = n
    f.attrs["num_docs"] = 1
with edit("sparse.h5") as f:
    f["tokens"].resize((N,))
    one_doc(f, N)
with edit("holes.h5") as f:
    del f["tokens"]
    t = f.create_dataset("tokens", shape=(N,), dtype="<u4")
    t[0:4] = 97
    t[N - 1] = 0
    one_doc(f, N)
    del f.attrs["tokens_fnv1a64"]
with edit("offsets.h5") as f:
    del f["doc_offsets"]
    f.create_dataset("doc_offsets", shape=(1 << 37,), dtype="<u8", chunks=(1 << 16,))
PY
train() {  # train NP DATASET: output in $out, status in $rc
  run_timed 30 "$mpiexec" -n "$1" "$wlb4d" "$src/inputs/ci-tiny.ini" --parallel.dp="$1" --train.steps=1 \
    --data.train="$2" --checkpoint.dir="ckpt-$1-$2"
  printf '%s\n' "$out" | grep -v ' info: '
  [ "$rc" -eq 137 ] && fail "hung on $2 ($1 ranks)"
  [ "$rc" -ne 0 ] || fail "$2 trained on $1 ranks (rc 0)"
  expect_not_trained "$2 ($1 ranks)"
}
ranks() { out_count -E -- "\[r[01]\].*$1"; }
rule="a dataset's declared size must be backed by data stored in the file"
for np in 1 2; do
  train $np sparse.h5
  [ "$(ranks "sparse.h5: dataset 'tokens' declares 1099511627776 elements \(4398046511104 bytes\) but only [0-9]+ (compressed )?bytes are stored in the file.*: $rule")" -ge 1 ] ||
    fail "sparse.h5: no rank of $np named /tokens and the rule (said once when every rank has the same text)"
  train $np holes.h5
  [ "$(ranks "holes.h5: dataset 'tokens' declares 1099511627776 elements .* but the file occupies only [0-9]+ bytes on disk .*: $rule")" -ge 1 ] ||
    fail "holes.h5: no rank of $np named /tokens and the disk"
  train $np offsets.h5
  [ "$(ranks "offsets.h5: dataset 'doc_offsets' declares 137438953472 elements .* no data stored in the file.*: $rule")" -ge 1 ] ||
    fail "offsets.h5: no rank of $np named /doc_offsets and the rule"
done
# wlb4d-plan reads /doc_offsets of plan.lengths = a dataset.
run_timed 30 "$plan" "$src/tests/unit/balance/plan-small.ini" --plan.lengths="$work/offsets.h5"
printf '%s\n' "$out" | tail -n 2
[ "$rc" -eq 137 ] && fail "wlb4d-plan hung on offsets.h5"
[ "$rc" -ne 0 ] || fail "wlb4d-plan read offsets.h5 (rc 0)"
out_has "offsets.h5: dataset '/doc_offsets' declares 137438953472 elements.*$rule" ||
  fail "wlb4d-plan did not name /doc_offsets and the rule"
# The intact dataset still trains.
run_timed 60 "$wlb4d" "$src/inputs/ci-tiny.ini" --train.steps=1 --data.train=tiny-train.h5 --checkpoint.dir=ckpt-ok
[ "$rc" -eq 0 ] || { printf '%s\n' "$out"; fail "the intact dataset did not train"; }
echo "$test_label: ok"

#!/usr/bin/env bash
# dataset_integrity_test.sh MPIEXEC WLB4D WLB4D_PREP SOURCE_DIR PYTHON
# Token-dataset integrity at open through the trainer on 2 ranks:
#   - one token id rewritten inside the vocabulary (h5py; HDF5 metadata stays
#     consistent): every rank refuses the file at start-up naming it and the
#     checksum, before step 1;
#   - max_token_id above vocab_size: every rank refuses it naming the file;
#   - the same dataset without the new attributes (as an older wlb4d-prep
#     wrote it) still trains, with a "no checksum" warning.
set -u
source "$(dirname "$0")/lib.sh"
mpiexec=$1 wlb4d=$2 prep=$3 src=$4 py=$5
need_h5py "$py"
scratch_dir dsint
prep_tiny "$prep" "$src"
train() {  # train DATASET: output in $out, status in $rc; a hang fails
  run_step 120 "$mpiexec" -n 2 "$wlb4d" "$src/inputs/ci-tiny.ini" --parallel.dp=2 --train.steps=2 --data.train="$1"
}
ranks() { out_count -E -- "\[r[01]\].*$1"; }
cp tiny-train.h5 flipped.h5
cp tiny-train.h5 maxid.h5
cp tiny-train.h5 old.h5
"$py" - <<'PY' || fail "h5py patch failed"
import h5py
with h5py.File("flipped.h5", "r+") as f:
    t = f["tokens"]
    v = int(t[10])
    t[10] = 97 if v != 97 else 98          # another byte, inside the vocabulary
with h5py.File("maxid.h5", "r+") as f:
    f.attrs["max_token_id"] = int(f.attrs["vocab_size"]) + 40
with h5py.File("old.h5", "r+") as f:
    del f.attrs["max_token_id"]
    del f.attrs["tokens_fnv1a64"]
PY
train tiny-train.h5
[ "$rc" -eq 0 ] || fail "the intact dataset did not train"
out_has "no checksum" && fail "a 'no checksum' warning for a fresh dataset"
train flipped.h5
[ "$rc" -ne 0 ] || fail "a changed token trained (rc 0)"
[ "$(ranks "flipped.h5: dataset 'tokens' does not match its checksum")" -ge 2 ] || fail "not every rank named the checksum"
expect_not_trained
train maxid.h5
[ "$rc" -ne 0 ] || fail "max_token_id >= vocab_size trained (rc 0)"
[ "$(ranks "maxid.h5: root attribute 'max_token_id' = [0-9]+ is not below vocab_size = [0-9]+")" -ge 2 ] ||
  fail "not every rank named max_token_id"
train old.h5
[ "$rc" -eq 0 ] || fail "a dataset without checksum did not train"
out_has "old.h5: no checksum" || fail "no 'no checksum' warning"
echo "$test_label: ok"

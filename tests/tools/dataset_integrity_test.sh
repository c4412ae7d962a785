#!/usr/bin/env bash
# dataset_integrity_test.sh MPIEXEC WLB4D WLB4D_PREP SOURCE_DIR PYTHON
# Token-dataset integrity through the trainer on 2 ranks:
#   - one bit flipped in the stored bytes of a /tokens chunk (under HDF5,
#     the way a disk or a copy corrupts a file; the id stays inside the
#     vocabulary): the open reads nothing, the first read of that chunk
#     fails, naming the file, the chunk's token range and its documents
#     and the Fletcher32 checksum; the job ends non-zero, never hangs;
#   - max_token_id above vocab_size: every rank refuses it naming the file;
#   - a dataset as an older wlb4d-prep wrote it (/tokens without the
#     Fletcher32 filter, with tokens_fnv1a64): a changed id is refused at
#     open on every rank by the whole-file checksum pass;
#   - the same without tokens_fnv1a64 / max_token_id (older still) trains,
#     with a "no checksum" warning.
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
cp tiny-train.h5 old-fnv.h5
cp tiny-train.h5 old.h5
"$py" - <<'PY' || fail "h5py patch failed"
import h5py, numpy as np
# One bit of the stored chunk, in the file's bytes (h5py would rewrite the
# chunk with a fresh checksum): token 10's low byte, 'x' -> 'y' or the like.
with h5py.File("flipped.h5", "r") as f:
    info = f["tokens"].id.get_chunk_info(0)
    assert f["tokens"].fletcher32, "a fresh dataset without the Fletcher32 filter"
with open("flipped.h5", "r+b") as raw:
    raw.seek(info.byte_offset + 4 * 10)
    b = raw.read(1)[0]
    raw.seek(info.byte_offset + 4 * 10)
    raw.write(bytes([b ^ 0x01]))
with h5py.File("maxid.h5", "r+") as f:
    f.attrs["max_token_id"] = int(f.attrs["vocab_size"]) + 40
def unfiltered(f):  # /tokens as an older wlb4d-prep wrote it: chunked, no filter
    t = f["tokens"][:]
    del f["tokens"]
    f.create_dataset("tokens", data=t, chunks=(65536,), maxshape=(None,), dtype="<u4")
    return f["tokens"]
with h5py.File("old-fnv.h5", "r+") as f:
    t = unfiltered(f)
    v = int(t[10])
    t[10] = 97 if v != 97 else 98          # another byte, inside the vocabulary
with h5py.File("old.h5", "r+") as f:
    unfiltered(f)
    del f.attrs["max_token_id"]
    del f.attrs["tokens_fnv1a64"]
PY
train tiny-train.h5
[ "$rc" -eq 0 ] || fail "the intact dataset did not train"
out_has "no checksum" && fail "a 'no checksum' warning for a fresh dataset"
train flipped.h5
[ "$rc" -ne 0 ] || fail "a flipped bit in a token chunk trained (rc 0)"
out_has -E "flipped.h5: dataset 'tokens' is corrupt: the chunk of tokens \[0, [0-9]+\) \(documents 0-[0-9]+ of this file\) fails its Fletcher32 checksum" ||
  fail "no rank named the file, the chunk's range and Fletcher32"
expect_not_trained
train old-fnv.h5
[ "$rc" -ne 0 ] || fail "a changed token in an unfiltered dataset trained (rc 0)"
# Every rank meets the same file: the error is said once, by rank 0.
[ "$(ranks "old-fnv.h5: dataset 'tokens' does not match its checksum")" -eq 1 ] || fail "the checksum error was not said exactly once"
expect_not_trained
train maxid.h5
[ "$rc" -ne 0 ] || fail "max_token_id >= vocab_size trained (rc 0)"
[ "$(ranks "maxid.h5: root attribute 'max_token_id' = [0-9]+ is not below vocab_size = [0-9]+")" -eq 1 ] ||
  fail "the max_token_id error was not said exactly once"
train old.h5
[ "$rc" -eq 0 ] || fail "a dataset without checksum did not train"
out_has "old.h5: no checksum" || fail "no 'no checksum' warning"
echo "$test_label: ok"

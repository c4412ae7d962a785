#!/usr/bin/env bash
# prep_mpi_test.sh MPIEXEC WLB4D_PREP SOURCE_DIR PYTHON
# `mpiexec -n N wlb4d-prep` writes the datasets of the 1-rank run
# (docs/data.md "MPI ranks"): for each case, a plain run (no mpiexec) and
# runs on 2 (and 3) ranks, compared with prep_same_datasets.py (h5py: every
# dataset's values, dtype, chunks and filter, every attribute but `writer`):
#   - bytes: the SOTU corpus 4 times (9 MB, 188 documents: 5 batches of about
#     2 MiB), --val-fraction 0.1, --shard-tokens 2000000; on 2 and 3 ranks;
#   - --sft: sft-tiny.jsonl 120 times (8,640 records: 3 batches of at most
#     4,096), --val-fraction 0.1, --shard-tokens 100000: /loss_mask too;
#   - sentencepiece trained by rank 0 (its model broadcast to the others):
#     tests/data/tiny.jsonl 250 times (2.5 MB, 2 batches), --val-fraction 0.05.
# Each run's summary is printed once (rank 0), naming the ranks.
# Bad input on 2 ranks: a missing input, a bad option and a line that is not
# JSON, and an encoding failure on rank 1 and on rank 0 in the middle of the
# run (WLB4D_FAULT=prep_encode): the error printed once, every rank exits
# with the same non-zero code (1 data, 2 options), within 60 s (a hang is a
# failure), and no output file is left.
set -u
source "$(dirname "$0")/lib.sh"
mpiexec=$1 prep=$2 src=$3 py=$4
need_h5py "$py"
scratch_dir prep-mpi
compare="$src/tests/tools/prep_same_datasets.py"

for i in 1 2 3 4; do xz -dc "$src/inputs/corpus/sotu-embedded.jsonl.xz"; done > big.jsonl || fail "cannot read the SOTU corpus"
for i in $(seq 120); do cat "$src/inputs/corpus/sft-tiny.jsonl"; done > sft.jsonl
for i in $(seq 250); do cat "$src/tests/data/tiny.jsonl"; done > spm.jsonl

# check_case NAME RANKS... -- ARGS...: the 1-rank run into NAME-1/, then one
# run per rank count into NAME-N/, each compared with NAME-1/.
check_case() {
  local name=$1; shift
  local counts=()
  while [ "$1" != "--" ]; do counts+=("$1"); shift; done
  shift
  run_step 300 "$prep" "$@" --threads 1 --output "$name-1/train.h5" --val-output "$name-1/val.h5"
  [ "$rc" -eq 0 ] || fail "$name: the 1-rank run failed"
  for n in "${counts[@]}"; do
    run_step 300 "$mpiexec" -n "$n" "$prep" "$@" --threads 1 --output "$name-$n/train.h5" --val-output "$name-$n/val.h5"
    [ "$rc" -eq 0 ] || fail "$name: the $n-rank run failed"
    [ "$(out_count -F 'wlb4d-prep: time')" -eq 1 ] || fail "$name: the $n-rank summary is not printed once"
    out_has -F "on $n ranks x 1 thread" || fail "$name: the $n-rank summary does not name the ranks"
    "$py" "$compare" "$name-1" "$name-$n" || fail "$name: $n ranks wrote other datasets than 1"
  done
}

check_case bytes 2 3 -- --input big.jsonl --val-fraction 0.1 --shard-tokens 2000000
check_case sft 2 -- --sft --input sft.jsonl --val-fraction 0.1 --shard-tokens 100000
check_case spm 2 -- --input spm.jsonl --tokenizer sentencepiece --vocab-size 400 --val-fraction 0.05
ls sft-1/train-00001.h5 > /dev/null || fail "the sft case wrote no second shard"

# bad_case NAME CODE MESSAGE ARGS...: on 2 ranks, MESSAGE (fixed string) once,
# and every rank exits CODE.
bad_case() {
  local name=$1 code=$2 msg=$3; shift 3
  run_step 60 "$mpiexec" -n 2 sh -c '"$0" "$@"; echo "rank exit $?"' "$prep" "$@"
  [ "$(out_count -F "$msg")" -eq 1 ] || fail "$name: the error is not said exactly once: $msg"
  [ "$(out_count -F 'wlb4d-prep: error:')" -eq 1 ] || fail "$name: more than one error line"
  [ "$(out_count -x "rank exit $code")" -eq 2 ] || fail "$name: not every rank exited $code"
}
printf '{"text": "a document"}\nnot json\n' > broken.jsonl
bad_case missing 1 "wlb4d-prep: error: no-such-corpus.jsonl" --input no-such-corpus.jsonl --output bad/a.h5
bad_case option 2 "wlb4d-prep: error: --threads -1 must be >= 0" --input big.jsonl --output bad/a.h5 --threads -1
bad_case json 1 "broken.jsonl:2" --input broken.jsonl --output bad/a.h5
[ ! -e bad/a.h5 ] || fail "a failed run left bad/a.h5"
# A rank that fails in the middle of the encoding (WLB4D_FAULT=prep_encode,
# core/fault.hpp): rank 1's batch 1 (rank 0 still receives batch 3), and rank
# 0's own batch 2 (rank 1 still sends batches 1 and 3): said once, all exit 1,
# no output (not even a shard) left.
for f in 1:batch=1 0:batch=2; do
  WLB4D_FAULT=prep_encode:rank=$f bad_case "fault $f" 1 "batch ${f#*=} (documents" --input big.jsonl \
    --output bad/f.h5 --shard-tokens 1000000 --threads 1
  ls bad/f* > /dev/null 2>&1 && fail "fault $f: a failed run left output files: $(ls bad)"
done
echo "$test_label: ok"

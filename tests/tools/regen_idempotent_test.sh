#!/usr/bin/env bash
# regen_idempotent_test.sh SOURCE_DIR BUILD_DIR
# scripts/regen-references.sh on an unchanged build must leave every
# reference it reruns byte for byte as it was (no new date line, no other
# digits): a contributor's `git diff inputs/` after it shows only real
# changes. Runs the script from a copy of scripts/, inputs/ and tests/tools/
# (it writes into its own checkout's inputs/), on two decks (1 and 2 ranks),
# with one fast layout-equivalence test as its precondition.
set -u
source "$(dirname "$0")/lib.sh"
src=$1 build=$2
scratch_dir regen
mkdir -p copy/tests
cp -r "$src/scripts" "$src/inputs" copy/
cp -r "$src/tests/tools" copy/tests/
cp -r "$src/tests/data" copy/tests/
cp -r copy/inputs inputs.before
EQUIV_REGEX='^test_train_equiv_bucket_np2$' BUILD_DIR="$build" copy/scripts/regen-references.sh ci-tiny ci-wlb \
  > regen.log 2>&1 || { cat regen.log; fail "regen-references.sh failed"; }
cat regen.log | grep -E "unchanged|wrote" || true
diff -r inputs.before copy/inputs || fail "regen-references.sh rewrote references on an unchanged build"
grep -q "unchanged .*ci-tiny.ref.csv" regen.log || fail "ci-tiny.ref.csv was not reported unchanged"
grep -q "unchanged .*ci-wlb.ref.csv" regen.log || fail "ci-wlb.ref.csv was not reported unchanged"
echo "$test_label: ok"

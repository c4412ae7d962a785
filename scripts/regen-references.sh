#!/usr/bin/env bash
# Rewrites the reference losses inputs/ci-*.ref.csv of the regression decks
# inputs/ci-*.ini from fresh runs of this build — only after the
# layout-equivalence tests pass.
#
#   scripts/regen-references.sh                    # every deck that has a .ref.csv
#   scripts/regen-references.sh ci-wlb inputs/ci-1f1b.ini   # some decks (a new deck gets a new .ref.csv)
#
# Environment (defaults):
#   BUILD_DIR    build tree with app/wlb4d, app/wlb4d-prep and the tests (build)
#   EQUIV_REGEX  ctest -R pattern of the layout-equivalence tests (^test_train_equiv)
#   CTEST_JOBS   ctest -j for them (1)
#   MPIEXEC      MPI launcher (the build's MPIEXEC_EXECUTABLE, else mpiexec)
#
# Steps:
#   1. ctest -R "$EQUIV_REGEX" in BUILD_DIR; exit 1 unless every one passes
#      (and at least one ran): references are never recorded from a build that
#      breaks the layout-equivalence contract.
#   2. for each deck, in a scratch directory with tiny-train.h5 prepared from
#      tests/data/tiny.jsonl: run it on dp*pp*cp*tp ranks (its resolved
#      parallel.* keys, includes applied: wlb4d DECK --print-config); a
#      multi-rank deck is run again on 1 rank (every parallel.* = 1)
#      and the two must agree to the reference's rtol, else exit 1 and write
#      nothing for that deck.
#   3. rewrite inputs/<deck>.ref.csv: its first line (tolerance, ranks=) is
#      kept, ranks= updated; the same steps as before (a new file: 1, every
#      5th and the last, plus the step after a "# @resume step=S" line's S).
# Review the diff (git diff inputs/) before committing new references.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
want=${BUILD_DIR:-$ROOT/build}
BUILD_DIR=$(cd "$want" 2>/dev/null && pwd) || {
  echo "regen-references: build directory '$want' not found (set BUILD_DIR)" >&2; exit 1; }
EQUIV_REGEX=${EQUIV_REGEX:-^test_train_equiv}
CTEST_JOBS=${CTEST_JOBS:-1}
if [ -z "${MPIEXEC:-}" ]; then
  MPIEXEC=$(sed -n 's/^MPIEXEC_EXECUTABLE:FILEPATH=//p' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null || true)
  MPIEXEC=${MPIEXEC:-mpiexec}
fi
WLB4D=$BUILD_DIR/app/wlb4d
PREP=$BUILD_DIR/app/wlb4d-prep
CHECK=$ROOT/tests/tools/check_losses.py
for exe in "$WLB4D" "$PREP"; do
  [ -x "$exe" ] || { echo "regen-references: $exe not built (cmake --build $BUILD_DIR)" >&2; exit 1; }
done
export OMP_NUM_THREADS=1 OMP_PROC_BIND=false KOKKOS_NUM_THREADS=1   # as under ctest

# The decks: arguments (names or paths), else every inputs/ci-*.ini with a .ref.csv.
decks=()
if [ $# -gt 0 ]; then
  for d in "$@"; do
    name=$(basename "$d" .ini)
    [ -f "$ROOT/inputs/$name.ini" ] || { echo "regen-references: no deck inputs/$name.ini" >&2; exit 1; }
    decks+=("$name")
  done
else
  for r in "$ROOT"/inputs/ci-*.ref.csv; do decks+=("$(basename "$r" .ref.csv)"); done
fi
[ ${#decks[@]} -gt 0 ] || { echo "regen-references: no decks" >&2; exit 1; }

# 1. The layout-equivalence tests must pass.
echo "== layout-equivalence tests (ctest -R '$EQUIV_REGEX' in $BUILD_DIR)"
if ! ctest --test-dir "$BUILD_DIR" -R "$EQUIV_REGEX" --no-tests=error --output-on-failure -j "$CTEST_JOBS"; then
  echo "regen-references: REFUSED: the layout-equivalence tests ($EQUIV_REGEX) do not pass in $BUILD_DIR;" >&2
  echo "  references are only recorded from a build that keeps the layout-equivalence contract." >&2
  exit 1
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/wlb4d-regen.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
"$PREP" --input "$ROOT/tests/data/tiny.jsonl" --output "$WORK/tiny-train.h5" > "$WORK/prep.log" 2>&1 ||
  { cat "$WORK/prep.log" >&2; exit 1; }

# ranks of a deck: the product of its resolved parallel.dp, pp, cp, tp (its
# includes, e.g. inputs/ci-base.ini, applied: wlb4d --print-config).
deck_ranks() {
  local resolved
  resolved=$("$MPIEXEC" -n 1 "$WLB4D" "$1" --print-config) ||
    { echo "regen-references: $1 does not resolve (wlb4d $1 --print-config)" >&2; return 1; }
  python3 -c '
import configparser, sys
c = configparser.ConfigParser(inline_comment_prefixes=("#", ";"))
c.read_string(sys.stdin.read())
n = 1
for k in ("dp", "pp", "cp", "tp"):
    n *= int(c.get("parallel", k, fallback="1"))
print(n)' <<<"$resolved"
}

# run DIR RANKS LOG ARGS...: one wlb4d run in DIR (fails with the log's tail).
run() {
  local dir=$1 np=$2 log=$3
  shift 3
  mkdir -p "$dir"
  if ! (cd "$dir" && "$MPIEXEC" -n "$np" "$WLB4D" "$@" --data.train="$WORK/tiny-train.h5") > "$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "regen-references: run failed: $MPIEXEC -n $np wlb4d $* (log above)" >&2
    return 1
  fi
}

status=0
for name in "${decks[@]}"; do
  deck=$ROOT/inputs/$name.ini
  ref=$ROOT/inputs/$name.ref.csv
  np=$(deck_ranks "$deck") || { status=1; continue; }
  dir=$WORK/$name
  echo "== $name: $np rank(s)"
  if ! run "$dir/deck" "$np" "$dir/deck.log" "$deck" --log.csv_file=run.csv; then status=1; continue; fi
  note="on $np rank(s)"
  if [ "$np" -gt 1 ]; then
    if ! run "$dir/one" 1 "$dir/one.log" "$deck" --log.csv_file=run.csv \
         --parallel.dp=1 --parallel.pp=1 --parallel.cp=1 --parallel.tp=1; then status=1; continue; fi
    rtol=1e-5
    [ -f "$ref" ] && rtol=$(sed -n '1s/.*rtol=\([^ ]*\).*/\1/p' "$ref") && rtol=${rtol:-1e-5}
    if ! python3 "$CHECK" "$dir/deck/run.csv" --against "$dir/one/run.csv" --rtol "$rtol" > "$dir/cross.txt"; then
      cat "$dir/cross.txt" >&2
      echo "regen-references: $name: $np ranks and 1 rank disagree beyond rtol $rtol (layout equivalence broken);" \
           "inputs/$name.ref.csv left unchanged" >&2
      status=1; continue
    fi
    echo "   1 rank vs $np: $(tail -n 1 "$dir/cross.txt")"
    note="$note, equal on 1 rank to rtol $rtol"
  fi
  also=()
  resume=$(sed -n 's/^# *@resume step=\([0-9]*\).*/\1/p' "$deck" | head -n 1)
  [ -n "$resume" ] && also=(--also $((resume + 1)))
  version=$(sed -n 's/.*info: \(wlb4d [^|]*\) |.*/\1/p' "$dir/deck.log" | head -n 1 | sed 's/ *$//')
  python3 "$CHECK" "$dir/deck/run.csv" --record "$ref" --ranks "$np" "${also[@]}" \
    --note "step,loss of inputs/$name.ini $note; $(date +%Y-%m-%d) by scripts/regen-references.sh (${version:-wlb4d})"
done
[ $status -eq 0 ] || echo "regen-references: some decks failed (see above); their references are unchanged" >&2
exit $status

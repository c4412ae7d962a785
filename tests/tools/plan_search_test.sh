#!/bin/sh
# wlb4d-plan --search through the executables (layout search):
#   plan_search_test.sh WLB4D_PLAN WLB4D DECK RANKS OUTDIR [overrides...]
# runs `WLB4D_PLAN DECK --search --top 5 --write-deck OUTDIR/search-best.ini`,
# checks the table (5 ranked rows, the deck's row, >= 1000 candidates
# enumerated, the search under 30 s) and that the written deck passes
# `WLB4D DECK --check --check-ranks RANKS` with the layout of the best row at
# the deck's global batch (the first ranked row not marked "global batch").
set -eu
plan=$1 wlb4d=$2 deck=$3 ranks=$4 out=$5
shift 5
mkdir -p "$out"
best="$out/search-best.ini"
rm -f "$best"
"$plan" "$deck" --search --top 5 --write-deck "$best" "$@" >"$out/search.txt"
cat "$out/search.txt"
fail() { echo "plan_search_test: $*" >&2; exit 1; }
count=$(sed -n 's/.*; \([0-9][0-9]*\) candidates enumerated.*/\1/p' "$out/search.txt")
secs=$(sed -n 's/.* refined over plan.steps steps; \([0-9.]*\) s$/\1/p' "$out/search.txt")
[ -n "$count" ] || fail "no candidate count line"
[ "$count" -ge 1000 ] || fail "only $count candidates enumerated (want >= 1000)"
awk -v s="$secs" 'BEGIN { exit !(s + 0 < 30) }' || fail "search took $secs s (want < 30)"
rows=$(grep -cE '^ +[1-5] +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ ' "$out/search.txt" || true)
[ "$rows" -ge 5 ] || fail "$rows ranked rows in the top 5 (want 5)"
grep -q '<- deck' "$out/search.txt" || fail "the deck's own layout is not in the table"
[ -f "$best" ] || fail "no deck written"
# The best row at the deck's global batch is the written deck.
set -- $(grep -E '^ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ ' "$out/search.txt" | grep -v 'global batch' | head -1)
for kv in "dp = $2" "pp = $3" "cp = $4" "tp = $5" "schedule = $6" "virtual_stages = $7" "micro_batches = $8" \
          "recompute = $9"; do
  grep -qx "$kv" "$best" || fail "written deck lacks '$kv'"
done
"$wlb4d" "$best" --check --check-ranks "$ranks" || fail "wlb4d --check rejects the written deck"
# And the planner reads it back (its plan.lengths is absolute).
"$plan" "$best" --plan.steps=1 --plan.packers=fixed --plan.shardings=sequence >/dev/null ||
  fail "wlb4d-plan cannot read the written deck"
echo "plan_search_test: OK ($count candidates, $secs s)"

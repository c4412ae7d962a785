#!/usr/bin/env bash
# Core-attention disaggregation on a real long-tailed corpus:
# dp=2 on 2 ranks (one per core here), SpamAssassin bodies, three runs of
# the same deck (inputs/bench-ca-spam.ini), the same documents and steps:
#   fixed                — balance.packer=fixed (plain 4D baseline)
#   wlb                  — balance.packer=wlb (WLB-LLM Algorithm 1 + outlier queues)
#   wlb+disaggregated    — wlb and balance.attention=disaggregated
# ROUNDS (default 2) rounds, alternating the three, so machine load hits all.
# Prints per run: step time (mean wall t_total), compute per rank as CPU
# seconds (forward + backward, communication excluded: compute_cpu) max/mean
# over ranks averaged over steps, the planned group attention imbalance
# before -> after, MiB moved per step, the exposed exchange wait, and the loss
# of the last step. Needs the corpus: scripts/get-corpus.sh (npm).
#
#   bench/ca_spam.sh                     # corpus from data/corpus/spam.jsonl
#   CORPUS=/tmp/corpus/spam.jsonl STEPS=12 ROUNDS=1 bench/ca_spam.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BUILD_DIR:-build}/app
CORPUS=${CORPUS:-data/corpus/spam.jsonl}
STEPS=${STEPS:-12}
ROUNDS=${ROUNDS:-2}
RUN=runs/ca-spam
mkdir -p "$RUN/data"
[ -f "$CORPUS" ] || { echo "ca_spam: $CORPUS not found; run scripts/get-corpus.sh first" >&2; exit 1; }
if [ ! -f "$RUN/data/spam-train.h5" ]; then
  "$BIN/wlb4d-prep" --input "$CORPUS" --output "$RUN/data/spam-train.h5"
fi
export OMP_NUM_THREADS=1 KOKKOS_NUM_THREADS=1
declare -a NAMES=(fixed wlb wlb+disaggregated)
declare -a ARGS=("--balance.packer=fixed" "--balance.packer=wlb" "--balance.packer=wlb --balance.attention=disaggregated")
for ((r = 1; r <= ROUNDS; r++)); do
  for i in 0 1 2; do
    csv="$RUN/${NAMES[$i]}-r$r.csv"
    rm -f "$csv"
    # shellcheck disable=SC2086
    mpiexec -n 2 "$BIN/wlb4d" inputs/bench-ca-spam.ini --train.steps="$STEPS" --train.print_every=1000 \
        --log.csv_file="$csv" ${ARGS[$i]} > "$RUN/${NAMES[$i]}-r$r.log" 2>&1 ||
      { echo "ca_spam: ${NAMES[$i]} failed, see $RUN/${NAMES[$i]}-r$r.log" >&2; exit 1; }
  done
done
/usr/bin/python3 - "$RUN" "$ROUNDS" "${NAMES[@]}" <<'PY'
import csv, sys, statistics as st
from collections import defaultdict
run, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print(f"{'run':<20} {'round':>5} {'step s':>8} {'compute max/mean':>17} {'max cpu s':>9} "
      f"{'attn imb (plan)':>16} {'MiB/step':>8} {'exposed ms':>10} {'last loss':>10}")
for n in names:
    for r in range(1, rounds + 1):
        rows = list(csv.DictReader(open(f"{run}/{n}-r{r}.csv")))
        steps = defaultdict(list)
        for x in rows:
            steps[int(x["step"])].append(x)
        tt, imb, cmax, ib, ia, mib, exp = [], [], [], [], [], [], []
        for s, rr in sorted(steps.items()):
            c = [float(x["compute_cpu"]) for x in rr]
            tt.append(max(float(x["t_total"]) for x in rr))
            imb.append(max(c) / (sum(c) / len(c)))
            cmax.append(max(c))
            ib.append(float(rr[0]["ca_imbalance_before"]))
            ia.append(float(rr[0]["ca_imbalance"]))
            mib.append(sum(float(x["ca_bytes"]) for x in rr) / 2 / 1048576)
            exp.append(max(float(x["ca_exposed"]) for x in rr) * 1e3)
        last = float(steps[max(steps)][0]["loss"])
        plan = f"{st.mean(ib):.3f}->{st.mean(ia):.3f}" if st.mean(ib) > 0 else "-"
        print(f"{n:<20} {r:>5} {st.mean(tt):>8.3f} {st.mean(imb):>17.3f} {st.mean(cmax):>9.3f} "
              f"{plan:>16} {st.mean(mib):>8.2f} {st.mean(exp):>10.1f} {last:>10.4f}")
PY

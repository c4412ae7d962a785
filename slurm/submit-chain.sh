#!/bin/bash
# Submit N jobs that continue one training run: job k+1 starts when job k ended
# with status 0 (--dependency=afterok: the trainer stopped on SIGUSR1 before the
# time limit, wrote its checkpoint and exited 0), and a failed job (bad deck,
# crash, node failure, time limit hit without a clean stop) cancels the rest of
# the chain (--kill-on-invalid-dep=yes) instead of rerunning the failure N
# times. Every job resumes from the newest checkpoint
# (--checkpoint.resume=auto and --checkpoint.at_end=true are added unless
# given). A job that finds the run complete (newest checkpoint at
# train.steps) exits at once.
#
#   slurm/submit-chain.sh N DECK [--section.key=value ...]
#   SCRIPT=slurm/train-cpu.sbatch SBATCH_ARGS="-N 4 --time=04:00:00" slurm/submit-chain.sh 6 inputs/quickstart.ini
#   AFTER=12345 slurm/submit-chain.sh 2 DECK      # append to an existing chain
#
# Environment: SCRIPT (default slurm/train-gpu.sbatch next to this file),
# SBATCH_ARGS (word-split, before the script), AFTER (job id the first job waits
# for), STOP_LEAD_S (default 120: --signal=USR1@STOP_LEAD_S, the seconds before
# the time limit at which the trainer is told to checkpoint and stop; give it
# more than one step plus one checkpoint write). The template variables (WLB4D_BIN, RUN_DIR, LAUNCHER, ...) are passed
# through the environment (sbatch exports it). Prints the job ids, one per line.
# The chain needs checkpoint.every (or every_minutes) > 0 and a checkpoint.dir
# shared by the jobs (the same working directory: run from the same place).
set -euo pipefail
usage() { echo "usage: $0 N DECK [--section.key=value ...]" >&2; exit 2; }
[ $# -ge 2 ] || usage
N=$1 DECK=$2
shift 2
[[ "$N" =~ ^[1-9][0-9]*$ ]] || usage
STOP_LEAD_S=${STOP_LEAD_S:-120}
[[ "$STOP_LEAD_S" =~ ^[1-9][0-9]*$ ]] || { echo "submit-chain: STOP_LEAD_S=$STOP_LEAD_S: must be a positive number of seconds" >&2; exit 2; }
[ -r "$DECK" ] || { echo "submit-chain: deck '$DECK' not readable" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
SCRIPT=${SCRIPT:-$here/train-gpu.sbatch}
args=("$@")
have_resume=0 have_end=0
for a in "${args[@]}"; do
  [[ "$a" == --checkpoint.resume=* ]] && have_resume=1
  [[ "$a" == --checkpoint.at_end=* ]] && have_end=1
done
[ $have_resume = 1 ] || args+=(--checkpoint.resume=auto)
# a finished run leaves a checkpoint at train.steps, so the rest of the chain exits at once
[ $have_end = 1 ] || args+=(--checkpoint.at_end=true)
prev=${AFTER:-}
for ((k = 1; k <= N; k++)); do
  dep=()
  [ -n "$prev" ] && dep=(--dependency=afterok:"$prev" --kill-on-invalid-dep=yes)
  # shellcheck disable=SC2086
  jid=$(sbatch --parsable --signal=USR1@"$STOP_LEAD_S" ${SBATCH_ARGS:-} "${dep[@]}" "$SCRIPT" "$DECK" "${args[@]}")
  jid=${jid%%;*}
  echo "$jid"
  echo "submit-chain: job $k/$N = $jid${prev:+ (after $prev)}" >&2
  prev=$jid
done

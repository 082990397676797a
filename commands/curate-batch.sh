#!/usr/bin/env bash
# Nightly curation batch, safe to run from cron:
#   0 2 * * *  /path/to/vidforge/commands/curate-batch.sh /data/raw /data/curated
#
# - a lock (flock) so two runs never overlap: a run that finds the lock taken exits 0 and logs it;
# - reruns are incremental: `vidforge clip` skips sources already in OUT, so each night only new files work;
# - a log file per run under OUT/logs/, the JSON summary line kept in OUT/logs/last.json, and the exit
#   code in OUT/logs/last.rc (0 ok, 3 partial: see OUT/errors.jsonl, 1 failure, 2 bad input/profile).
#
# Environment: VIDFORGE (the command, default `vidforge`), VIDFORGE_PROFILE (run-profile), EXTRA_ARGS
# (e.g. "--executor ray --ray-address auto --dedup 0.95").
set -uo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 INPUT_DIR OUT_DIR" >&2
  exit 2
fi
input=$1
out=$2
vidforge=${VIDFORGE:-vidforge}
mkdir -p "$out/logs"
log="$out/logs/clip-$(date -u +%Y%m%dT%H%M%SZ).log"

exec 9>"$out/logs/.lock"
if ! flock -n 9; then
  echo "$(date -u +%FT%TZ) another curate-batch run holds $out/logs/.lock; skipping" >>"$out/logs/skipped.log"
  exit 0
fi

# shellcheck disable=SC2086  # EXTRA_ARGS is a list of words on purpose
"$vidforge" --json clip "$input" -o "$out" ${EXTRA_ARGS:-} >"$log.jsonl" 2>"$log"
rc=$?
echo "$rc" >"$out/logs/last.rc"
grep '"event": "result"' "$log.jsonl" | tail -n 1 >"$out/logs/last.json" || true
echo "$(date -u +%FT%TZ) exit $rc $(cat "$out/logs/last.json")" >>"$out/logs/history.log"
exit "$rc"

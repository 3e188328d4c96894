#!/usr/bin/env bash
# Settings compared on ONE warm `imgops serve` (800 photos relayed, --no-fsync): each setting is
# a space-separated list of IMGOPS_* assignments and `imgops gray` options (or "default"),
# separated by ";" in WARM_AB (default: switch intervals 1 ms, 0.2 ms and 0.05 ms, and 2
# deflate streams; e.g. "default;-j 12;-j 8"). The variables travel with each relayed command,
# the options are the command's; every round runs all settings, in an order rotated from
# round to round. WARM_AB_ROUNDS rounds (default 6) after one warm-up. Results:
# $OUT/warm-env-ab.txt (label|rc|ms|files|engine stats), then per setting the median wall.
# SERVE_DEVICE=cpu: no GPU (a dry run of the script).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
DEV=${SERVE_DEVICE:-cuda}
ROUNDS=${WARM_AB_ROUNDS:-6}
WARM_AB=${WARM_AB:-default;IMGOPS_SWITCH_INTERVAL=0.0002;IMGOPS_SWITCH_INTERVAL=0.00005;IMGOPS_DEFLATE_STREAMS=2}
REPORT=$OUT/warm-env-ab.txt
export PYTHONUNBUFFERED=1
. scripts/gpu-check.d/photo-batches.bash
photo_batches warm-env-ab
mkdir -p /tmp/imgops-warm-env-ab && chmod 700 /tmp/imgops-warm-env-ab
SOCKET=/tmp/imgops-warm-env-ab/server.sock
$PY -m imgops.entry serve --device "$DEV" --idle-timeout 0 --socket "$SOCKET" -v \
  2>"$OUT/warm-env-ab-server.log" &
SERVER=$!
for _ in $(seq 900); do
  grep -q "ready at" "$OUT/warm-env-ab-server.log" && break
  sleep 0.1
done
IFS=';' read -ra SETTINGS <<<"$WARM_AB"
: >"$REPORT"
gray() {  # label, setting
  local label=$1 setting=$2 words=() assignments=() options=()
  [ "$setting" != default ] && read -ra words <<<"$setting"
  for word in "${words[@]}"; do
    if [[ "$word" == IMGOPS_*=* ]]; then assignments+=("$word"); else options+=("$word"); fi
  done
  local rc ms
  read -r rc ms < <(  # the assignments hold in this subshell only
    for assignment in "${assignments[@]}"; do export "${assignment?}"; done
    IMGOPS_SERVER=$SOCKET timed_gray /tmp/imgops-warm-env-ab-out /tmp/imgops-warm-env-ab.json \
      /tmp/imgops-warm-env-ab.err "$BATCH" --device "$DEV" "${options[@]}"
    echo "$GRAY_RC $GRAY_MS"
  )
  echo "$label|$setting|rc=$rc|$ms ms|$(ls /tmp/imgops-warm-env-ab-out | wc -l) files|$(engine_stats \
    /tmp/imgops-warm-env-ab.json)" | tee -a "$REPORT"
}
gray "warm-up" default
for round in $(seq "$ROUNDS"); do
  count=${#SETTINGS[@]}
  for k in $(seq 0 $((count - 1))); do
    gray "round $round" "${SETTINGS[$(( (k + round) % count ))]}"
  done
done
$PY -m imgops.entry serve --stop --socket "$SOCKET"
wait "$SERVER"
rm -rf /tmp/imgops-warm-env-ab-out
$PY - "$REPORT" <<'PYEOF' | tee -a "$REPORT"
# Per setting: commands, the median and min wall, the median engine wall.
import re, statistics, sys
groups = {}
for line in open(sys.argv[1]):
    fields = line.rstrip("\n").split("|")
    if len(fields) < 6 or fields[0] == "warm-up":
        continue
    ms = int(re.sub(r"\D", "", fields[3]) or 0)
    engine = re.search(r"engine ([0-9.]+)", fields[5])
    g = groups.setdefault(fields[1], {"ms": [], "engine": []})
    g["ms"].append(ms)
    if engine:
        g["engine"].append(float(engine.group(1)))
for setting, g in groups.items():
    engine = statistics.median(g["engine"]) if g["engine"] else float("nan")
    print(f"summary {setting}: {len(g['ms'])} commands, median {statistics.median(g['ms'])} ms, "
          f"min {min(g['ms'])} ms, engine median {engine:.3f} s")
PYEOF

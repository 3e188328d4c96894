# Sourced by the gpu-check.d scripts that time photo batches (not a part: it is not *.sh).
# photo_batches NAME: BATCH (ENGINE_BATCH_DIR, else /tmp/imgops-photo-batch: the issue-10
# script's 800 photos, made once, its log in $OUT/NAME-batch.txt) and BIG (BATCH-x4: the same
# files hard-linked 4 times, 3200).
photo_batches() {
  BATCH=${ENGINE_BATCH_DIR:-/tmp/imgops-photo-batch}
  BIG=${BATCH}-x4
  [ -d "$BATCH" ] || $PY scripts/make_photo_batch.py "$BATCH" --count 800 --jobs "$(nproc)" \
    >"$OUT/$1-batch.txt" 2>&1
  if [ ! -d "$BIG" ]; then
    mkdir -p "$BIG"
    for k in 1 2 3 4; do for f in "$BATCH"/*; do ln "$f" "$BIG/$k-$(basename "$f")"; done; done
  fi
}
# timed_gray OUTDIR STATS ERR ARGS...: `imgops gray ARGS -d OUTDIR -q --no-fsync --stats-json
# STATS` into an emptied OUTDIR (relayed where IMGOPS_SERVER is set), its stderr in ERR; sets
# GRAY_RC and GRAY_MS (the command's wall, milliseconds). GRAY_CMD: what runs imgops (default
# "$PY -m imgops.entry"; e.g. "$PY scripts/timeline.py --caller FILE").
timed_gray() {
  local dir=$1 stats=$2 err=$3; shift 3
  rm -rf "$dir" "$stats"; mkdir -p "$dir"
  local s; s=$(date +%s%N)
  ${GRAY_CMD:-$PY -m imgops.entry} gray "$@" -d "$dir" -q --no-fsync --stats-json "$stats" 2>"$err"
  GRAY_RC=$? GRAY_MS=$(( ($(date +%s%N) - s) / 1000000 ))
}
# engine_stats STATS: one line of a --stats-json file: the decoders, the engine's wall and its
# phases over 5 ms.
engine_stats() {
  $PY -c "
import json, sys
d = json.load(open(sys.argv[1]))
e = d['engine_seconds']
print(d.get('decoders'), 'engine', round(d['wall_seconds'], 3),
      'calls', len(d.get('gpu_decode_batches') or []),
      {k: round(v, 3) for k, v in sorted(e.items()) if v > 0.005})
" "$1" 2>&1 | tail -n 1
}

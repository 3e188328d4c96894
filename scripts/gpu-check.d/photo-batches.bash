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

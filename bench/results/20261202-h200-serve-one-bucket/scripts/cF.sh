# call F: serving at rate inf, EAGLE async vs sync (engine process, HEAD), default buckets then one decode bucket
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:.
mkdir -p $OUT/serve $OUT/serve1
echo "[$(date +%T)] default buckets (t=$SECONDS)"
OUT=$OUT/serve DATA=/root/data/gsm8k_test.jsonl CACHE=/root/jcache RATES="inf" MODES="eagle-async eagle-sync" \
  timeout 250 bash bench/serve_sweep.sh 2>&1 | tail -8
echo "[$(date +%T)] one decode bucket (t=$SECONDS)"
[ $SECONDS -lt 260 ] && OUT=$OUT/serve1 DATA=/root/data/gsm8k_test.jsonl CACHE=/root/jcache RATES="inf" MODES="eagle-async eagle-sync" \
  SERVER_EXTRA="--decode-buckets 64 --prefill-buckets 1024" timeout $((585 - SECONDS)) bash bench/serve_sweep.sh 2>&1 | tail -8
tar czf $OUT/cF.tgz -C $OUT serve serve1 && rm -rf $OUT/serve $OUT/serve1
echo "done t=$SECONDS"

# call 2: GGUF part 2, assemble, convert; serving at rates inf / 8 / 32, EAGLE and none, async and sync, one decode
# bucket (64) and one prefill bucket (1024), 64 requests (3 runs at inf) and 512 requests (rate inf)
set -u
export PYTHONUNBUFFERED=1
REPO=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site .whl/*.whl || exit 1
export PYTHONPATH=/root/site:.
mkdir -p weights/.cache/smollm2-135m-instruct /root/data $OUT
if [ ! -f weights/smollm2-135m-instruct/source.json ]; then
  cp .gpu/p2/m.xz.1 /root/w/
  cat /root/w/m.xz.0 /root/w/m.xz.1 | xz -d -T8 > weights/.cache/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
  sha256sum weights/.cache/smollm2-135m-instruct/*.gguf
  python3 -m jaxspec fetch 2>&1 | tail -1
fi
for s in test train; do xz -dc .gpu/data/gsm8k_$s.jsonl.xz > /root/data/gsm8k_$s.jsonl; done
echo "=== [t=$SECONDS] serving"
R=/root/w/serve; mkdir -p $R
HEAD='{"method": "eagle", "model": "weights/eagle-smollm2-135m-instruct", "num_speculative_tokens": 3}'
ARGS=(--port 8123 --max-model-len 1024 --max-num-seqs 64 --max-num-batched-tokens 1024 --decode-buckets 64
      --prefill-buckets 1024 --layer-loop scan --compilation-cache-dir /root/jcache --disable-uvicorn-access-log
      --uvicorn-log-level warning)
bench() {  # bench LABEL RATE N [--compare-with F]
  local label=$1 rate=$2 n=$3; shift 3
  python3 -m jaxspec bench serve --base-url http://127.0.0.1:8123 --endpoint /v1/chat/completions \
    --dataset-name jsonl --dataset-path /root/data/gsm8k_test.jsonl --jsonl-output-len 256 --num-prompts $n \
    --request-rate $rate --seed 0 --disable-tqdm --label $label --save-result --result-dir $R \
    --result-filename $label.json "$@" > $R/$label.txt 2>&1
  echo "  $label: $(grep -E 'Median TPOT|Median TTFT|Engine ms/step|outputs vs' $R/$label.txt | tr -s ' ' | tr '\n' ' ')"
}
for mode in eagle-async eagle-sync none-async none-sync; do
  case $mode in
    eagle-async) F=(--speculative-config "$HEAD" --async-scheduling); base="";;
    eagle-sync) F=(--speculative-config "$HEAD" --no-async-scheduling); base=eagle-async;;
    none-async) F=(--async-scheduling); base="";;
    none-sync) F=(--no-async-scheduling); base=none-async;;
  esac
  [ $SECONDS -gt 520 ] && { echo "out of time before $mode"; break; }
  python3 -m jaxspec serve smollm2-135m-instruct "${ARGS[@]}" "${F[@]}" > $R/server-$mode.log 2>&1 &
  PID=$!; start=$SECONDS
  until curl -sf http://127.0.0.1:8123/health >/dev/null; do
    sleep 0.5; kill -0 $PID 2>/dev/null || { tail -5 $R/server-$mode.log; continue 2; }
  done
  echo "[t=$SECONDS] $mode healthy after $((SECONDS - start)) s"
  for spec in "inf 64 1" "inf 64 2" "inf 64 3" "inf 512 1" "8 64 1"; do
    set -- $spec; label=$mode-rate$1-n$2-r$3
    cmp=(); [ -n "$base" ] && [ -f $R/$base-rate$1-n$2-r$3.json ] && cmp=(--compare-with $R/$base-rate$1-n$2-r$3.json)
    bench $label $1 $2 "${cmp[@]}"
  done
  kill $PID; wait $PID
done
cd /root/w && tar czf $OUT/serve.tgz serve && ls -l $OUT
PYTHONPATH=/root/site:$REPO python3 - <<'PY'
import glob, json
from jaxspec.bench.serve import sweep_table
print(sweep_table([json.load(open(p)) for p in sorted(glob.glob("/root/w/serve/*.json"))]))
PY
echo "done t=$SECONDS"

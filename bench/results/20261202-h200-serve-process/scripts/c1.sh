# call 1: wheels, GGUF part 1, and the serving A/B on random SmolLM2 weights: engine thread vs engine process
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site .whl/*.whl || exit 1
export PYTHONPATH=/root/site:.
mkdir -p /root/w /root/tok $OUT/r && cp .gpu/p1/m.xz.1 /root/w/ && cp .gpu/tok/* /root/tok/ && xz -d /root/tok/tokenizer.json.xz
nvidia-smi --query-gpu=name,memory.used --format=csv
python3 -c "import jax, jax.numpy as jnp; x = jnp.ones((4096, 4096), jnp.bfloat16); print((x @ x).block_until_ready().shape)"
PORT=8123
run_mode() {  # name mode spec async
  [ $SECONDS -gt 480 ] && { echo "skip $1 (time)"; return; }
  local name=$1
  python3 .gpu/s/serve_dummy.py --mode $2 --spec $3 --async-scheduling $4 --port $PORT > $OUT/r/server-$name.log 2>&1 &
  local pid=$!
  local t=$SECONDS
  until python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null; do
    kill -0 $pid 2>/dev/null || { echo "$name: server died"; tail -5 $OUT/r/server-$name.log; return; }
    [ $((SECONDS - t)) -gt 240 ] && { echo "$name: no health"; kill $pid; return; }
    sleep 1
  done
  echo "$name healthy after $((SECONDS - t)) s"
  for rate in inf 32; do
    timeout 120 python3 -m jaxspec bench serve --base-url http://127.0.0.1:$PORT --endpoint /v1/completions \
      --dataset-name random --tokenizer /root/tok --random-input-len 128 --random-output-len 256 --ignore-eos \
      --num-prompts 64 --request-rate $rate --seed 0 --disable-tqdm --label $name --save-result --result-dir $OUT/r \
      --result-filename $name-rate$rate.json > $OUT/r/bench-$name-rate$rate.txt 2>&1
    echo "$name rate $rate: $(grep -E 'Median TPOT|Output token throughput|Median ITL' $OUT/r/bench-$name-rate$rate.txt | tr '\n' ' ')"
  done
  kill $pid; wait $pid 2>/dev/null
  PORT=$((PORT + 1))
}
run_mode proc-k3-async process k3 1
run_mode thread-k3-async thread k3 1
run_mode proc-k3-sync process k3 0
run_mode thread-k3-sync thread k3 0
run_mode proc-none-async process none 1
run_mode proc-none-sync process none 0
run_mode thread-none-async thread none 1
run_mode thread-none-sync thread none 0
python3 - <<'PY'
import json, glob, os
out = os.environ["OUT"] + "/r"
print("| run | rate | out tok/s | TPOT p50 | TPOT p99 | TTFT p50 | ITL p50 |")
for f in sorted(glob.glob(out + "/*-rate*.json")):
    d = json.load(open(f))
    g = lambda k: d.get(k, float("nan"))
    print(f"| {os.path.basename(f)[:-5]} | | {g('output_throughput'):.0f} | {g('median_tpot_ms'):.3f} | {g('p99_tpot_ms'):.3f} | {g('median_ttft_ms'):.1f} | {g('median_itl_ms'):.3f} |")
PY
tar czf $OUT/c1.tgz -C $OUT r && rm -rf $OUT/r

# call 2: GGUF part 2, assemble, convert; issue 17 (drafts follow the processed target; logprob rows copied): the cost of logprobs=5 + presence_penalty=0.5 against greedy at
# 96 prompts, both settings in one process on one LLM, alternating, medians of 5 (EOS ignored: equal work; then EOS)
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site .whl/gguf*.whl || exit 1
export PYTHONPATH=/root/site:.
mkdir -p weights/.cache/smollm2-135m-instruct /root/data /root/m
if [ ! -f weights/smollm2-135m-instruct/source.json ]; then
  cp .gpu/p2/m.xz.1 /root/w/
  cat /root/w/m.xz.0 /root/w/m.xz.1 | xz -d -T8 > weights/.cache/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
  sha256sum weights/.cache/smollm2-135m-instruct/*.gguf
  python3 -m jaxspec fetch 2>&1 | tail -1
fi
xz -dc .gpu/data/gsm8k_test.jsonl.xz > /root/data/gsm8k_test.jsonl
HEAD='{"method": "eagle", "model": "weights/eagle-smollm2-135m-instruct", "num_speculative_tokens": 3}'
B="python3 bench/throughput.py --model weights/smollm2-135m-instruct --dataset-path /root/data/gsm8k_test.jsonl --max-tokens 1024 --max-num-seqs 96 --prefill-buckets 2048"
for eos in ignore-eos eos; do
  echo "=== [t=$SECONDS] $eos"
  flag=$([ $eos = ignore-eos ] && echo --ignore-eos || echo --no-ignore-eos)
  timeout 280 $B --speculative-config "$HEAD" --num-prompts 96 --decode-buckets 96 --repeats 5 $flag \
    --sweep-sampling '{"logprobs": 5, "presence_penalty": 0.5}' --results-dir /root/m \
    --output-json /root/m/cost-$eos.json > /root/m/cost-$eos.log 2>&1
  echo "rc $? t=$SECONDS"; grep -E "^\[bench" /root/m/cost-$eos.log | cut -c1-160 | head -3
  cp /root/m/cost-$eos.json /root/m/cost-$eos.log $OUT/
done
python3 - <<'PY'
import json
for eos in ("ignore-eos", "eos"):
    r = json.load(open(f"/root/m/cost-{eos}.json"))
    pts = {p["mode"]: p for p in r["points"]}
    for m, p in pts.items():
        print(eos, m, "| tok/s", round(p["output_tokens_per_s"]), "runs", [round(x) for x in p.get("repeats_output_tokens_per_s", [])],
              "| steps", p["num_steps"], "| ms/step wall %.3f host %.3f" % (p["wall_per_step_ms"], p["host_busy_per_step_ms"]), "| tokens", p["output_tokens"], "| acceptance length %.3f" % p["mean_acceptance_length"])
    a, b = list(pts.values())
    print(eos, "cost: tok/s %+.1f %%, ms/step %+.1f %%" % (100 * (a["output_tokens_per_s"] / b["output_tokens_per_s"] - 1),
          100 * (b["wall_per_step_ms"] / a["wall_per_step_ms"] - 1)))
PY
echo "done t=$SECONDS"

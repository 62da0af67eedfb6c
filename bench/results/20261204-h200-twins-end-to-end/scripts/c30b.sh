# call 2 (right after c30a.sh): GGUF part 2, assemble, convert; a cold and a warm `jaxspec generate` (start-up with
# twin programs); issue 17's cost command (greedy vs logprobs=5 + presence_penalty=0.5 in one process, EOS ignored)
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site .whl/gguf*.whl || exit 1
export PYTHONPATH=/root/site:.
mkdir -p weights/.cache/smollm2-135m-instruct /root/data /root/m
cp .gpu/p2/m.xz.1 /root/w/ || exit 1
cat /root/w/m.xz.0 /root/w/m.xz.1 | xz -d -T8 > weights/.cache/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf || exit 1
python3 -m jaxspec fetch 2>&1 | tail -1
echo "converted t=$SECONDS"
xz -dc .gpu/data/gsm8k_test.jsonl.xz > /root/data/gsm8k_test.jsonl
cp .gpu/data/held_out.jsonl /root/data/held_out.jsonl
rm -rf ~/.cache/jaxspec/xla
for r in cold warm; do
  /usr/bin/time -f "wall %e s" python3 -m jaxspec generate > /root/m/generate-$r.log 2>&1
  echo "generate $r rc $?"; grep -E "wall|tok/s|compil|accept" /root/m/generate-$r.log | tail -5
done
cp /root/m/generate-*.log $OUT/
HEAD='{"method": "eagle", "model": "weights/eagle-smollm2-135m-instruct", "num_speculative_tokens": 3}'
B="python3 bench/throughput.py --model weights/smollm2-135m-instruct --dataset-path /root/data/gsm8k_test.jsonl --max-tokens 1024 --max-num-seqs 96 --prefill-buckets 2048"
echo "=== [t=$SECONDS] cost"
timeout $((560 - SECONDS)) $B --speculative-config "$HEAD" --num-prompts 96 --decode-buckets 96 --repeats 5 --ignore-eos \
  --sweep-sampling '{"logprobs": 5, "presence_penalty": 0.5}' --results-dir /root/m \
  --output-json /root/m/cost.json > /root/m/cost.log 2>&1
echo "rc $? t=$SECONDS"
cp /root/m/cost.json /root/m/cost.log $OUT/
python3 - <<'PY'
import json
r = json.load(open("/root/m/cost.json"))
pts = {p["mode"]: p for p in r["points"]}
for m, p in pts.items():
    print(m[-40:], "| tok/s", round(p["output_tokens_per_s"]), "runs", [round(x) for x in p.get("repeats_output_tokens_per_s", [])],
          "| steps", p["num_steps"], "| ms/step wall %.3f host %.3f" % (p["wall_per_step_ms"], p["host_busy_per_step_ms"]), "| acc %.3f" % p["mean_acceptance_length"])
a, b = list(pts.values())
print("cost: tok/s %+.1f %%, ms/step %+.1f %%" % (100 * (b["output_tokens_per_s"] / a["output_tokens_per_s"] - 1),
      100 * (b["wall_per_step_ms"] / a["wall_per_step_ms"] - 1)))
PY
echo "done t=$SECONDS"

# call 2 (right after c13.sh): GGUF part 2, assemble, convert; issue 17: the 96-prompt cost run (greedy vs logprobs=5 +
# presence_penalty=0.5 alternating in one process, EOS ignored, medians of 5) with this change (block maxima behind a
# barrier, BLOCK 16), then with HEAD 0aa58e1's processors.py, one process each
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site .whl/gguf*.whl || exit 1
export PYTHONPATH=/root/site:.
mkdir -p weights/.cache/smollm2-135m-instruct /root/data /root/m
cp .gpu/p2/m.xz.1 /root/w/
cat /root/w/m.xz.0 /root/w/m.xz.1 | xz -d -T8 > weights/.cache/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf
python3 -m jaxspec fetch 2>&1 | tail -1
echo "converted t=$SECONDS"
xz -dc .gpu/data/gsm8k_test.jsonl.xz > /root/data/gsm8k_test.jsonl
cp .gpu/data/held_out.jsonl /root/data/held_out.jsonl
HEAD='{"method": "eagle", "model": "weights/eagle-smollm2-135m-instruct", "num_speculative_tokens": 3}'
B="python3 bench/throughput.py --model weights/smollm2-135m-instruct --dataset-path /root/data/gsm8k_test.jsonl --max-tokens 1024 --max-num-seqs 96 --prefill-buckets 2048"
cp jaxspec/engine/processors.py /root/processors_new.py
for v in new base; do
  [ $v = base ] && cp .gpu/processors_base.py jaxspec/engine/processors.py
  echo "=== [t=$SECONDS] $v"
  timeout 250 $B --speculative-config "$HEAD" --num-prompts 96 --decode-buckets 96 --repeats 5 --ignore-eos \
    --sweep-sampling '{"logprobs": 5, "presence_penalty": 0.5}' --results-dir /root/m \
    --output-json /root/m/cost-$v.json > /root/m/cost-$v.log 2>&1
  echo "rc $? t=$SECONDS"
  cp /root/m/cost-$v.json /root/m/cost-$v.log $OUT/
done
cp /root/processors_new.py jaxspec/engine/processors.py
python3 - <<'PY'
import json
for v in ("new", "base"):
    r = json.load(open(f"/root/m/cost-{v}.json"))
    pts = {p["mode"]: p for p in r["points"]}
    for m, p in pts.items():
        print(v, m[-40:], "| tok/s", round(p["output_tokens_per_s"]), "runs", [round(x) for x in p.get("repeats_output_tokens_per_s", [])],
              "| steps", p["num_steps"], "| ms/step wall %.3f host %.3f" % (p["wall_per_step_ms"], p["host_busy_per_step_ms"]), "| acc %.3f" % p["mean_acceptance_length"])
    a, b = list(pts.values())
    print(v, "cost: tok/s %+.1f %%, ms/step %+.1f %%" % (100 * (b["output_tokens_per_s"] / a["output_tokens_per_s"] - 1),
          100 * (b["wall_per_step_ms"] / a["wall_per_step_ms"] - 1)))
PY
echo "done t=$SECONDS"

# one call: random SmolLM2-shaped weights and head, synthetic acceptance 0.6, 96 prompts, k = 3: greedy against
# greedy constrained by a regex that allows every text; kernel totals of one traced run each (async)
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site .whl/outlines*.whl || exit 1
export PYTHONPATH=/root/site:.
mkdir -p /root/m $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
B="python3 bench/throughput.py --load-format dummy --hf-config smollm2-135m --tokenizer .gpu/tok --speculative-config {\"method\":\"eagle\",\"model\":\"dummy\",\"num_speculative_tokens\":3} --synthetic-acceptance 0.6 --dataset-name random --input-len 128 --max-tokens 128 --num-prompts 96 --max-num-seqs 96 --decode-buckets 96 --prefill-buckets 2048 --ignore-eos --repeats 1 --profile-prompts 96 --profile-max-tokens 48 --profile-repeats 1 --no-enable-prefix-caching"
for n in greedy regex; do
  X=""; [ $n = regex ] && X='{"regex": "(.|\\n)*"}'
  echo "=== [t=$SECONDS] $n"
  if [ $n = regex ]; then timeout 85 $B --structured-outputs "$X" --profile-dir /root/m/p-$n --output-json $OUT/$n.json > /root/m/$n.log 2>&1
  else timeout 85 $B --profile-dir /root/m/p-$n --output-json $OUT/$n.json > /root/m/$n.log 2>&1; fi
  echo "rc $?"; grep -E "ms/step|busy|ERROR" /root/m/$n.log | head -4
  python3 .gpu/kt.py /root/m/p-$n $OUT/kernels-$n.json | head -24
done
echo "done t=$SECONDS"

# call 2 (right after i1.sh): GGUF part 2, assemble, convert; issue 17's cost command, this tree then d257358;
# acceptance with repetition_penalty 1.2 and frequency_penalty 0.5 (GSM8K test, 96 prompts, 256 tokens), both trees
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site .whl/gguf*.whl || exit 1
mkdir -p weights/.cache/smollm2-135m-instruct /root/m $OUT
cat /root/w/gg.00 .gpu/p2/gg.01 > weights/.cache/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf || exit 1
PYTHONPATH=/root/site:. python3 -m jaxspec fetch 2>&1 | tail -1
echo "converted t=$SECONDS"
[ -d /root/old ] || { mkdir /root/old && tar -xf .gpu/old.tar -C /root/old; }
rm -rf /root/old/weights && ln -sfn $PWD/weights /root/old/weights && cp bench/acceptance.py /root/old/bench/
D=$PWD/.gpu/data
HEAD='{"method": "eagle", "model": "weights/eagle-smollm2-135m-instruct", "num_speculative_tokens": 3}'
B="python3 bench/throughput.py --model weights/smollm2-135m-instruct --dataset-path $PWD/.gpu/data/gsm8k_test.jsonl --max-tokens 1024 --max-num-seqs 96 --prefill-buckets 2048 --compilation-cache-dir /root/xla --no-enable-prefix-caching"
for t in $PWD /root/old; do
  n=$(basename $t)
  echo "=== [t=$SECONDS] cost $t"
  (cd $t && PYTHONPATH=/root/site:. timeout $((300 - SECONDS)) $B --speculative-config "$HEAD" --num-prompts 96 --decode-buckets 96 \
    --repeats 5 --ignore-eos --sweep-sampling '{"logprobs": 5, "presence_penalty": 0.5}' --results-dir /root/m \
    --output-json /root/m/cost-$n.json > /root/m/cost-$n.log 2>&1)
  echo "rc $? t=$SECONDS"
  cp /root/m/cost-$n.json $OUT/ 2>/dev/null
  python3 .gpu/cost.py  # = ../../20261205-h100-cost-sweep/scripts/cost.py /root/m/cost-$n.json
done
for t in $PWD /root/old; do
  n=$(basename $t)
  echo "=== [t=$SECONDS] acceptance $t"
  (cd $t && PYTHONPATH=/root/site:. timeout $((570 - SECONDS)) python3 bench/acceptance.py --model weights/smollm2-135m-instruct \
    --speculative-config "$HEAD" --dataset gsm8k_test=$D/gsm8k_test.jsonl --num-prompts 96 --max-tokens 256 \
    --sampling '{"repetition_penalty": 1.2}' --output-json $OUT/acc-rep-$n.json 2>&1 | grep -E "mean acceptance|Error")
  (cd $t && PYTHONPATH=/root/site:. timeout $((570 - SECONDS)) python3 bench/acceptance.py --model weights/smollm2-135m-instruct \
    --speculative-config "$HEAD" --dataset gsm8k_test=$D/gsm8k_test.jsonl --num-prompts 96 --max-tokens 256 \
    --sampling '{"frequency_penalty": 0.5}' --output-json $OUT/acc-freq-$n.json 2>&1 | grep -E "mean acceptance|Error")
done
echo "done t=$SECONDS"

# call R2 (right after r1.sh): GGUF part 2, assemble and convert (jaxspec fetch); SmolLM2-135M-Instruct, the first
# GSM8K test prompt, 1,024 tokens, EOS ignored, batch 1, no speculation, medians of 3 rounds
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site .whl/gguf*.whl || exit 1
mkdir -p weights/.cache/smollm2-135m-instruct /root/m $OUT/r
cat /root/w/gg.00 .gpu/p2/gg.01 > weights/.cache/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf || exit 1
export PYTHONPATH=/root/site:.
# the preset names the EAGLE-3 head, which comes with r4.sh (the 64 MiB a call): the tracked EAGLE-1 head meanwhile
sed -i 's/"eagle3"/"eagle"/; s/eagle3-smollm2/eagle-smollm2/' models/smollm2-135m-instruct.json
python3 -m jaxspec fetch 2>&1 | tail -2
echo "converted t=$SECONDS"
B="python3 bench/throughput.py --model weights/smollm2-135m-instruct --dataset-path .gpu/data/gsm8k_test.jsonl --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 --prefill-buckets 512 --repeats 3 --compilation-cache-dir /root/xla --results-dir /root/m"
run() { n=$1; shift; timeout 150 "$@" --output-json $OUT/r/$n.json > $OUT/r/$n.log 2>&1; echo "$n rc $? t=$SECONDS: $(grep -o '[0-9.]* output tokens/s' $OUT/r/$n.log | tr '\n' ' ')"; }
run plain-m1 $B
echo "done t=$SECONDS"

# call S4 (no files needed): random SmolLM2 weights, a random EAGLE-1 head accepting with p = 0.6 (synthetic: the
# same acceptance whatever k, so every mode emits the same number of tokens a step per draft), K = 3; issue 20's
# sweep at 1, 24, 96 and 256 prompts with the step-time model measured in 5 interleaved rounds and ranked
# non-decreasing in k. Argument: the seconds it may run
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
D=${1:-590}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
timeout $((D - SECONDS)) python3 bench/throughput.py --load-format dummy --hf-config smollm2-135m \
  --speculative-config '{"method": "eagle", "num_speculative_tokens": 3}' --synthetic-acceptance 0.6 \
  --dataset-name random --input-len 128 --max-tokens 256 --ignore-eos --sweep --sweep-k --sweep-no-plain \
  --sweep-prompts 1,24,96,256 --decode-buckets 1,24,96,256 --prefill-buckets 2048 --max-num-seqs 256 \
  --layer-loop scan --repeats 3 --time-budget-s $((D - SECONDS - 25)) --output-json $OUT/sweep-synthetic.json \
  > $OUT/sweep-synthetic.log 2>&1
echo "rc $? t=$SECONDS"
grep -o "step times (ms).*" $OUT/sweep-synthetic.log | cut -c1-400
sed -n "/Dynamic k against/,/^$/p" $OUT/sweep-synthetic.log
echo "done t=$SECONDS"

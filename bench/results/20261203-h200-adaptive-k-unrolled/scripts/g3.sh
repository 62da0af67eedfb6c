# call 3: Llama-3-8B shapes, unrolled layers, synthetic p = 0.3 and 0.9 (programs from the compilation cache)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
mkdir -p /root/r
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader; nproc
run8b() {  # p, process timeout
  echo "=== [t=$SECONDS] p=$1"
  timeout $2 python3 bench/throughput.py --load-format dummy --hf-config llama-3-8b \
    --speculative-config '{"method": "eagle", "num_speculative_tokens": 4}' --synthetic-acceptance $1 \
    --dataset-name random --input-len 128 --max-tokens 256 --sweep --sweep-k --sweep-no-plain \
    --sweep-prompts 1,8,24,48,96,128,256 --decode-buckets 1,8,24,48,96,128,256 --prefill-buckets 2048 \
    --max-num-seqs 256 --time-budget-s $(($2 - 15)) --results-dir /root/r/p$1 \
    --output-json /root/r/sweep-p$1.json > /root/r/sweep-p$1.log 2>&1
  echo "rc $? t=$SECONDS"; grep -E "^\[bench" /root/r/sweep-p$1.log | cut -c1-200 | head -12
  grep -c "side by side" /root/r/sweep-p$1.log; grep "side by side" /root/r/sweep-p$1.log | tail -2 | cut -c1-160
  cp /root/r/sweep-p$1.json /root/r/sweep-p$1.log $OUT/ 2>/dev/null
}
run8b 0.3 250
run8b 0.9 $((585 - SECONDS))
python3 .gpu/ratios.py /root/r/sweep-p0.3.json /root/r/sweep-p0.9.json
echo "done t=$SECONDS"

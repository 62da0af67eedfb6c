# call G1 (issue 19's busy criterion; no files to carry): where the device's idle time lies. Random SmolLM2 weights,
# plain decoding at 1 prompt and EAGLE k = 3 at synthetic acceptance 0.6 at 1 / 24 / 64 / 96 prompts, max_tokens
# 256, async, single steps, --profile-dir: busy by NVML (untraced) and by the trace, the traced idle time binned by
# gap length (< 2 / 2-10 / 10-100 / >= 100 us). Short gaps lie between one program's kernels (fewer, longer kernels
# close them), long ones are the device waiting for the next program (the host). Argument: the seconds it may run
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
D=${1:-590}
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
timeout 100 python3 bench/throughput.py --load-format dummy --hf-config smollm2-135m --dataset-name random \
  --input-len 128 --num-prompts 1 --max-tokens 64 --decode-buckets 1 --prefill-buckets 128 > $OUT/r/warm.log 2>&1
run() {  # name, prompts, extra flags...
  local name=$1 n=$2; shift 2
  [ $((D - SECONDS)) -lt 110 ] && { echo "$name: no time left"; return; }
  timeout 100 python3 bench/throughput.py --load-format dummy --hf-config smollm2-135m --dataset-name random \
    --input-len 128 --max-tokens 256 --prefill-buckets 2048 --num-prompts $n --decode-buckets $n \
    --profile-dir /root/prof-$name --profile-prompts $n "$@" --output-json $OUT/r/$name.json > $OUT/r/$name.log 2>&1
  echo "$name rc $? t=$SECONDS: $(grep -o '[0-9.]* output tokens/s' $OUT/r/$name.log | head -1)"
  grep -o "profile .* async: .*" $OUT/r/$name.log | head -1
}
E='{"num_speculative_tokens": 3}'
run eagle-96 96 --speculative-config "$E" --synthetic-acceptance 0.6
run plain-1 1
for n in 24 1 64; do
  run eagle-$n $n --speculative-config "$E" --synthetic-acceptance 0.6
done
echo "done t=$SECONDS"

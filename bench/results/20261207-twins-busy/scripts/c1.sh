# call 1 (issue 19's busy criterion): is launching a twin executable while the other runs what leaves the device
# idle? (20261207-graph-updates-b1/gpu-c3: in step_time's back-to-back multi-step loop a launch blocked the host for
# about the running graph's length with twins, not with one executable.) Random SmolLM2 weights, EAGLE k = 3 at
# synthetic acceptance 0.6, max_tokens 256, async, --profile-dir (busy: NVML untraced, traced kernel time), 4 and 1
# scheduler steps a dispatch, twin executables on and off (JAXSPEC_TWIN_PROGRAMS), one process each.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
PYTHONPATH=. timeout 100 python3 bench/throughput.py --load-format dummy --hf-config smollm2-135m --dataset-name random \
  --input-len 128 --num-prompts 1 --max-tokens 64 --decode-buckets 1 --prefill-buckets 128 > $OUT/r/warm.log 2>&1
E='{"num_speculative_tokens": 3}'
for n in 96 24; do
  for m in 4 1; do
    for t in 1 0; do
      [ $SECONDS -gt 150 ] && break 3
      f=$OUT/r/busy-$n-m$m-twins$t
      JAXSPEC_TWIN_PROGRAMS=$t PYTHONPATH=. timeout 100 python3 bench/throughput.py --load-format dummy --hf-config smollm2-135m \
        --dataset-name random --input-len 128 --max-tokens 256 --prefill-buckets 2048 --num-prompts $n --decode-buckets $n \
        --speculative-config "$E" --synthetic-acceptance 0.6 --num-scheduler-steps $m --profile-dir /root/prof-$n-$m-$t \
        --profile-prompts $n --output-json $f.json > $f.log 2>&1
      echo "n=$n M=$m twins=$t rc $? t=$SECONDS: $(grep -o '[0-9.]* output tokens/s' $f.log | head -1) | $(grep -A3 'busy, untraced (NVML)' $f.log | grep '| async |' | cut -d'|' -f5,6,10,11,12)"
    done
  done
done
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"

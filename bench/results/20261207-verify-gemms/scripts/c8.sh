# call 8 (issue 19, for the next GPU session, after c7.sh): if the stable scratch (the program's scratch buffer kept
# as a persistent allocation, so its CUDA graphs are not updated) is what stalls multi-step dispatches back to back,
# the engine's busy fraction with 4 steps a dispatch should rise with it off. EAGLE k = 3,
# synthetic 0.6, 24 and 96 prompts, max_tokens 256, M = 4 with JAXSPEC_STABLE_SCRATCH 1 and 0, M = 1 as is, NVML
# busy over untraced runs as long as the timed ones. Random SmolLM2 weights, one process each.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
for n in 24 96; do
  for m in 4 1; do
    for ss in $([ $m = 4 ] && echo "1 0" || echo 1); do
      name=n$n-m$m-ss$ss
      echo "=== [t=$SECONDS] $name"
      JAXSPEC_STABLE_SCRATCH=$ss PYTHONPATH=. timeout 110 python3 bench/throughput.py --load-format dummy \
        --hf-config smollm2-135m --dataset-name random --input-len 128 --max-tokens 256 --prefill-buckets 2048 \
        --num-prompts $n --decode-buckets $n --speculative-config '{"num_speculative_tokens": 3}' \
        --synthetic-acceptance 0.6 --num-scheduler-steps $m --profile-dir /root/prof-$name --profile-repeats 3 \
        --output-json $OUT/r/$name.json > $OUT/r/$name.log 2>&1; echo "rc $?"
      grep -h "^Throughput\|ms/step wall\|busy" $OUT/r/$name.log | grep -v "^|" | head -3
    done
  done
done
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"

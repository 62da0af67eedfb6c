# call 3 (issue 19), after c2: twin executables for multi-step programs. verify-gemms call 7 (bench/step_time.py,
# plain, batch 1, 8 steps a dispatch, back to back): 1.630 ms a step with twin executables against 0.936 with one
# (JAXSPEC_TWIN_PROGRAMS=0, which relaunches one executable and updates its graph at every call, 7 updates), no graph
# update with twins; launching one twin's 1,341-node graph while the other's runs took 7.8 ms of host time, as long
# as the running graph. Here the engine at batch 1, EAGLE k = 3 (synthetic 0.6), 4 steps a dispatch and 1, with
# page_reserve_whole (the default since 2eaf37f), twins on and off, alternating, one process each, two rounds; then
# step_time plain M = 1 / 4 / 8, twins on and off.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
B="--load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 --prefill-buckets 128"
LOG="TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=command_buffer_thunk=3"
PYTHONPATH=. timeout 150 python3 bench/throughput.py $B > $OUT/r/warm.log 2>&1  # a fresh machine's first process
for r in 1 2; do
  for m in 4 1; do
    for t in 1 0; do
      f=$OUT/r/engine-m$m-twins$t-$r
      env $LOG JAXSPEC_TWIN_PROGRAMS=$t PYTHONPATH=. timeout 150 python3 bench/throughput.py $B \
        --speculative-config '{"num_speculative_tokens": 3}' --synthetic-acceptance 0.6 --num-scheduler-steps $m \
        --output-json $f.json > $f.log 2>&1
      echo "M=$m twins=$t round $r: $(grep -o '[0-9.]* output tokens/s' $f.log | head -1), $(grep -o '[0-9.]* ms/step wall' $f.log), updates $(grep -c 'Updated command buffer' $f.log)"
    done
  done
done
for m in 1 4 8; do
  for t in 1 0; do
    echo "step_time plain M=$m twins=$t: $(JAXSPEC_TWIN_PROGRAMS=$t PYTHONPATH=. timeout 90 python3 bench/step_time.py \
      --hf-config smollm2-135m --context 256 --iters 32 --batches 1 --k 0 --num-steps $m 2>&1 | grep ' step ' | cut -c1-90)"
  done
done
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"

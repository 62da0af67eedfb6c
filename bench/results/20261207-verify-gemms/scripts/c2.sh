# call 2 (issue 19): why a 4-step EAGLE dispatch costs the host ~3.3 ms at batch 1 (the jitted call's own time under
# cProfile: 117 calls, 0.391 s, against 0.38 ms for a single step; call 3 of 20261207-unrolled-steps). The engine at
# batch 1, EAGLE k = 3, synthetic 0.6, M = 1 and 4, each traced (host TraceMes at level 2) over 512 tokens; the
# trace's host events per dispatch and the device's idle gaps (tracehost.py). Then step_time M = 4 with the
# warm-up fixed (both twin executables compiled before the timed round). Random SmolLM2 weights.
set -u
export PYTHONUNBUFFERED=1
S=bench/results/20261207-verify-gemms/scripts
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
B1="--load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --num-prompts 1 --max-tokens 512 --ignore-eos --decode-buckets 1 --prefill-buckets 128 --speculative-config {\"num_speculative_tokens\":3} --synthetic-acceptance 0.6"
for m in 1 4; do
  echo "=== [t=$SECONDS] engine b1 M=$m traced"
  PYTHONPATH=. timeout 150 python3 $S/traced.py $B1 --num-scheduler-steps $m --profile-dir /root/tr-m$m --profile-repeats 1 --output-json $OUT/r/engine-m$m.json > $OUT/r/engine-m$m.log 2>&1; echo "rc $?"
  grep -h "^Throughput\|ms/step wall\|busy" $OUT/r/engine-m$m.log | head -4
  d=$(python3 -c "import math; print(round(222 / $m))")
  PYTHONPATH=. python3 $S/tracehost.py /root/tr-m$m/*-async $d > $OUT/r/trace-m$m.txt 2>&1; cat $OUT/r/trace-m$m.txt
  find /root/tr-m$m/*-async -name "*.trace.json.gz" -exec cp {} $OUT/r/trace-m$m.json.gz \;
done
echo "=== [t=$SECONDS] step_time M=4"
PYTHONPATH=. timeout 120 python3 bench/step_time.py --hf-config smollm2-135m --context 256 --iters 32 --batches 1 --k 3 --num-steps 4 --output-json $OUT/r/step-m4.json > $OUT/r/step-m4.log 2>&1; echo "rc $?"
grep " step " $OUT/r/step-m4.log | grep -v "^\["
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"

# call 2 (issue 19): why a 4-step dispatch with EAGLE k = 3 at batch 1 runs each step ~0.1 ms slower than single
# steps (call 1: 1.34 against 1.24 ms a step in the engine): device time per step by kernel, 1 and 4 steps a
# dispatch (bench/step_time.py --profile-dir, steps back to back), and both programs' optimized HLO.
set -u
export PYTHONUNBUFFERED=1
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
for m in 1 4; do
  echo "=== [t=$SECONDS] M=$m"
  XLA_FLAGS="--xla_dump_to=/root/hlo$m --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*decode_step.*" PYTHONPATH=. timeout 200 python3 bench/step_time.py --hf-config smollm2-135m --context 256 --iters 30 --batches 1 --k 3 --num-steps $m --profile-dir /root/prof$m --output-json $OUT/r/prof-m$m.json > $OUT/r/prof-m$m.log 2>&1; echo "rc $?"
  grep -v "^INFO\|^\[" $OUT/r/prof-m$m.log | head -40
  mkdir -p $OUT/r/hlo$m; cp /root/hlo$m/*after_optimizations.txt $OUT/r/hlo$m/ 2>/dev/null; ls /root/hlo$m | grep -c after_optimizations.txt
done
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"

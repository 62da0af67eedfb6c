# call 7 (issue 19, for the next GPU session): (a) why multi-step dispatches back to back leave the device idle
# (call 6: plain, 1.262 / 1.543 ms a step at M = 4 / 8 against 0.823 single): bench/step_time.py plain at batch 1, M = 1
# and 8, as is, with twin executables off (JAXSPEC_TWIN_PROGRAMS=0: one graph, relaunched), with the stable scratch
# off (JAXSPEC_STABLE_SCRATCH=0: the scratch not kept as a persistent allocation; the graph updated when it moves),
# and with XLA's command buffers off (no graphs: kernels launched one by one); (b) what the batch-1 EAGLE step's
# fusions hold (hlo_fusions.py over its optimized HLO: the pad / multiply / transpose fusions, the 62 scatters and
# 62 others).
# Random SmolLM2 weights, one process each.
set -u
export PYTHONUNBUFFERED=1
S=bench/results/20261207-verify-gemms/scripts
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
ST="bench/step_time.py --hf-config smollm2-135m --context 256 --iters 32 --batches 1"
for v in default twins-off scratch-off graphs-off; do
  case $v in
    default) env="";;
    twins-off) env="JAXSPEC_TWIN_PROGRAMS=0";;
    scratch-off) env="JAXSPEC_STABLE_SCRATCH=0";;
    graphs-off) env="XLA_FLAGS=--xla_gpu_enable_command_buffer=";;
  esac
  for m in 1 8; do
    f=$OUT/r/plain-$v-m$m
    echo "=== [t=$SECONDS] plain $v M=$m"
    env $env PYTHONPATH=. timeout 90 python3 $ST --k 0 --num-steps $m --output-json $f.json > $f.log 2>&1; echo "rc $?"
    grep " step " $f.log | grep -v "^\["
  done
done
echo "=== [t=$SECONDS] EAGLE k=3 M=1, optimized HLO"
XLA_FLAGS="--xla_dump_to=/root/dump --xla_dump_hlo_as_text --xla_dump_hlo_module_re=decode_step" PYTHONPATH=. timeout 120 python3 $ST --k 3 --output-json $OUT/r/eagle-dump.json > $OUT/r/eagle-dump.log 2>&1; echo "rc $?"
H=$(ls /root/dump/*jit_decode_step*after_optimizations.txt 2>/dev/null | head -1)
[ -n "$H" ] && cp $H $OUT/r/decode_step_after_optimizations.txt && python3 $S/hlo_fusions.py $H > $OUT/r/fusions.txt 2>&1
head -40 $OUT/r/fusions.txt
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"

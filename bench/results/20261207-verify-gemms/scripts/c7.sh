# call 7 (issue 19, for the next GPU session): (a) why multi-step dispatches back to back are slower than single steps
# (call 6: plain, 1.262 / 1.543 ms a step at M = 4 / 8 against 0.823 single; its rounds read no output until they
# ended, which d5e6086 changed to the engine's way): bench/step_time.py plain at batch 1, M = 1
# and 8, as is, with twin executables off (JAXSPEC_TWIN_PROGRAMS=0: one graph, relaunched), with the stable scratch
# off (JAXSPEC_STABLE_SCRATCH=0: the scratch not kept as a persistent allocation; the graph updated when it moves),
# and with XLA's command buffers off (no graphs: kernels launched one by one); (b) what the batch-1 EAGLE step's
# fusions hold (hlo_fusions.py over its optimized HLO: the pad / multiply / transpose fusions, the 62 scatters and
# 62 others); (c) the engine at batch 1, EAGLE M = 4 and 1, untraced, unwatched: does XLA update the 4-step graph
# in the timed run? Every run logs XLA's graph records and updates (command_buffer_thunk at level 3).
# Random SmolLM2 weights, one process each.
set -u
export PYTHONUNBUFFERED=1
S=bench/results/20261207-verify-gemms/scripts
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
ST="bench/step_time.py --hf-config smollm2-135m --context 256 --iters 32 --batches 1"
LOG="TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=command_buffer_thunk=3"
graphs() {  # XLA's graph records and updates in a run's log, by graph size
  echo "  records: $(grep -c 'Initialized command buffer' $1), updates: $(grep -c 'Updated command buffer' $1); by size:"
  grep -o "\(Initialized\|Updated\) command buffer.*num_commands=[0-9]*" $1 | sed 's/ in [0-9]* [^;]*;//' | sort | uniq -c
}
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
    env $env $LOG PYTHONPATH=. timeout 90 python3 $ST --k 0 --num-steps $m --output-json $f.json > $f.log 2>&1; echo "rc $?"
    grep " step " $f.log | grep -v "^\["
    graphs $f.log
  done
done
B="--load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --num-prompts 1 --max-tokens 1024"
for m in 4 1; do
  f=$OUT/r/engine-eagle-m$m
  echo "=== [t=$SECONDS] engine, batch 1, EAGLE k=3, M=$m, XLA's command-buffer log"
  env $LOG PYTHONPATH=. timeout 100 python3 bench/throughput.py $B --ignore-eos --decode-buckets 1 --prefill-buckets 128 \
    --speculative-config '{"num_speculative_tokens": 3}' --synthetic-acceptance 0.6 --num-scheduler-steps $m \
    --output-json $f.json > $f.log 2>&1; echo "rc $?"
  grep -h "^Throughput\|ms/step wall" $f.log
  graphs $f.log
done
echo "=== [t=$SECONDS] EAGLE k=3 M=1, optimized HLO"
XLA_FLAGS="--xla_dump_to=/root/dump --xla_dump_hlo_as_text --xla_dump_hlo_module_re=decode_step" PYTHONPATH=. timeout 120 python3 $ST --k 3 --output-json $OUT/r/eagle-dump.json > $OUT/r/eagle-dump.log 2>&1; echo "rc $?"
H=$(ls /root/dump/*jit_decode_step*after_optimizations.txt 2>/dev/null | head -1)
[ -n "$H" ] && cp $H $OUT/r/decode_step_after_optimizations.txt && python3 $S/hlo_fusions.py $H > $OUT/r/fusions.txt 2>&1
head -40 $OUT/r/fusions.txt
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"

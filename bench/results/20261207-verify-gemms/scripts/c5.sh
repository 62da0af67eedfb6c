# call 5 (issue 19): no argument of a step program moves (call 4), yet XLA updates its CUDA graph with one updated
# allocation, about once per plan write. Is the stable scratch (SKIP_TEMP) in effect in this XLA, and what does its
# VA remapping log? The engine at batch 1, EAGLE k = 3 synthetic 0.6, 512 tokens, with stable_scratch on (default)
# and off, XLA logging at level 3 for the command-buffer and executable modules. Random SmolLM2 weights.
set -u
export PYTHONUNBUFFERED=1
S=bench/results/20261207-verify-gemms/scripts
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
PYTHONPATH=. python3 -c "import jax; from jaxspec.engine.step import stable_scratch_supported as s; print('jax', jax.__version__, 'stable_scratch_supported', s())" 2>&1 | tail -1
B="--load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --max-tokens 512 --ignore-eos --prefill-buckets 128 --num-prompts 1 --decode-buckets 1"
E="--speculative-config {\"num_speculative_tokens\":3} --synthetic-acceptance 0.6"
V=command_buffer_thunk=3,gpu_executable=3,gpu_executable_buffer_allocator=3,command_buffer_va_remapping=3,va_remapping=3,buffer_allocations=3
for ss in 1 0; do
  name=eagle-m1-ss$ss
  echo "=== [t=$SECONDS] $name"
  JAXSPEC_STABLE_SCRATCH=$ss TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=$V PYTHONPATH=. timeout 120 python3 bench/throughput.py $B $E --output-json $OUT/r/$name.json > $OUT/r/$name.log 2>&1; echo "rc $?"
  grep -h "^Throughput\|ms/step wall" $OUT/r/$name.log
  echo "updates: $(grep -c 'needs_update=true' $OUT/r/$name.log); log lines by file:"
  grep -o "[a-z_]*\.cc:[0-9]*\]" $OUT/r/$name.log | sed 's/:[0-9]*\]//' | sort | uniq -c | sort -rn | head -8
  grep -i "remap\|persistent\|skip_temp\|dynamic" $OUT/r/$name.log | sed 's/^.*\.cc:[0-9]*\] //' | cut -c1-220 | sort | uniq -c | sort -rn | head -8
done
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"

# call 4 (issue 19): which buffers the step programs find moved. Call 3 refuted the first guess (a donated plan
# buffer still read by a dispatch in flight keeps its address on the GPU too), and giving each twin executable its
# own plan buffers made the updates more frequent (25 in 32 plan writes against 14 in 18) and the engine slower.
# Here every step program call is watched (moved.py: its argument leaves by device address, per executable), with
# XLA's command-buffer thunk logging at level 3, at batch 1 (EAGLE k = 3 synthetic 0.6, M = 1 and 4; plain) and
# at 24 prompts (EAGLE). Random SmolLM2 weights, one process each.
set -u
export PYTHONUNBUFFERED=1
S=bench/results/20261207-verify-gemms/scripts
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
B="--load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --max-tokens 512 --ignore-eos --prefill-buckets 128"
E="--speculative-config {\"num_speculative_tokens\":3} --synthetic-acceptance 0.6"
run() {  # name, args...
  local name=$1; shift
  echo "=== [t=$SECONDS] $name"
  TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=command_buffer_thunk=3 PYTHONPATH=. timeout 120 python3 $S/moved.py $B "$@" --output-json $OUT/r/$name.json > $OUT/r/$name.log 2>&1; echo "rc $?"
  grep -h "^Throughput\|ms/step wall" $OUT/r/$name.log
  grep "^moved" $OUT/r/$name.log | cut -c1-400
  echo "xla log lines: $(grep -c command_buffer_thunk $OUT/r/$name.log); with 'pdate': $(grep command_buffer_thunk $OUT/r/$name.log | grep -ci update)"
  grep command_buffer_thunk $OUT/r/$name.log | grep -i update | sed 's/^.*command_buffer_thunk.cc:[0-9]*\] //' | cut -c1-160 | sort | uniq -c | sort -rn | head -4
}
run eagle-m1 $E --num-prompts 1 --decode-buckets 1
run eagle-m4 $E --num-prompts 1 --decode-buckets 1 --num-scheduler-steps 4
run plain-m1 --num-prompts 1 --decode-buckets 1
run eagle-n24 $E --num-prompts 24 --decode-buckets 24
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"

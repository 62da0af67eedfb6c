# call 3 (issue 19): each twin executable reads resident plan buffers of its own. Before, a plan write donated
# buffers that the other twin's dispatch in flight still read, its outputs landed elsewhere, and both twins' CUDA
# graphs were updated at their next launches (call 2: 17 updates of ~1.0 ms in 223 steps at M = 1, 14 of ~5.6 ms
# in 56 dispatches at M = 4). The write probe on the GPU; the engine at batch 1 (EAGLE k = 3 synthetic 0.6, M = 1
# and 4; plain M = 1), before (model_runner.py of 7b9ff61, in a copy of the tree) and after, alternating, one
# process each, 1,024 tokens; then M = 4 traced after, with its graph updates counted. Random SmolLM2 weights.
set -u
export PYTHONUNBUFFERED=1
S=bench/results/20261207-verify-gemms/scripts
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
rm -rf /root/before && mkdir -p /root/before && cp -r jaxspec bench /root/before/ && cp $S/model_runner_before.py /root/before/jaxspec/engine/model_runner.py  # 7b9ff61; the tree ran with per-twin-plans.patch applied
echo "=== [t=$SECONDS] plan write probe"
PYTHONPATH=. timeout 90 python3 $S/plan_addresses.py 2>&1 | grep -v "^INFO" | tail -6
B="--load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 --prefill-buckets 128"
E="--speculative-config {\"num_speculative_tokens\":3} --synthetic-acceptance 0.6"
run() {  # name, tree, args...
  local name=$1 tree=$2; shift 2
  echo "=== [t=$SECONDS] $name"
  (cd $tree && PYTHONPATH=. timeout 120 python3 bench/throughput.py $B "$@" --output-json $OUT/r/$name.json > $OUT/r/$name.log 2>&1); echo "rc $?"
  grep -h "^Throughput\|ms/step wall" $OUT/r/$name.log
}
W=$PWD
run eagle-m4-after $W $E --num-scheduler-steps 4
run eagle-m4-before /root/before $E --num-scheduler-steps 4
run eagle-m1-after $W $E
run eagle-m1-before /root/before $E
run plain-m1-after $W
run plain-m1-before /root/before
run eagle-m4-after2 $W $E --num-scheduler-steps 4
run eagle-m4-before2 /root/before $E --num-scheduler-steps 4
echo "=== [t=$SECONDS] eagle M=4 after, traced"
PYTHONPATH=. timeout 120 python3 $S/traced.py $B $E --max-tokens 512 --num-scheduler-steps 4 --profile-dir /root/tr-m4 --profile-repeats 1 --output-json $OUT/r/traced-m4.json > $OUT/r/traced-m4.log 2>&1; echo "rc $?"
grep -h "^Throughput\|ms/step wall\|busy" $OUT/r/traced-m4.log | head -3
T=$(find /root/tr-m4/*-async -name "*.trace.json.gz" | head -1)
PYTHONPATH=. python3 $S/updates.py $T | tail -4
PYTHONPATH=. python3 $S/tracehost.py /root/tr-m4/*-async 56 | grep -i "update\|cuGraphLaunch\|device:"
cd $OUT && tar czf r.tgz r && rm -rf r
echo "done t=$SECONDS"

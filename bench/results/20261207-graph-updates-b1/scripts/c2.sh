# call 2 (issue 19): page_reserve_whole off and on in one process (ab.py: alternating timed rounds of one LLM, so one
# compile), batch 1, EAGLE k = 3 at synthetic acceptance 0.6, 4 steps a dispatch, random SmolLM2 weights, 1,024
# tokens, XLA's graph updates counted per round. (Call 1 could not start: no machine.)
set -u
export PYTHONUNBUFFERED=1
S=bench/results/20261207-graph-updates-b1/scripts
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
B="--load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 --prefill-buckets 128"
TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=command_buffer_thunk=3 PYTHONPATH=. timeout 200 python3 $S/ab.py $B \
  --speculative-config '{"num_speculative_tokens":3}' --synthetic-acceptance 0.6 --num-scheduler-steps 4 \
  --repeats 6 --output-json $OUT/r/ab-m4.json > $OUT/r/ab-m4.log 2>&1; echo "rc $?"
awk '/^MARK round .* start/{n=0; r=$3" "$4} /Updated command buffer/{n++} /^MARK round .* end/{print r, $6, $7, $8, $9, "plan writes", $13, "updates", n}' $OUT/r/ab-m4.log
grep "^page_reserve_whole" $OUT/r/ab-m4.log
echo "done t=$SECONDS"

# call 4: EAGLE k = 3 at batch 1 with the fused layer for forwards of up to 4 and 16 tokens (the verify fused too)
export PYTHONUNBUFFERED=1 PYTHONPATH=.; mkdir -p $OUT/r
T="python3 bench/throughput.py --load-format dummy --hf-config smollm2-135m --dataset-name random --input-len 128 --num-prompts 1 --max-tokens 1024 --ignore-eos --decode-buckets 1 --prefill-buckets 128 --repeats 3"
for n in 4 16; do
  JAXSPEC_FUSED_DECODE=1 JAXSPEC_FUSED_DECODE_TOKENS=$n timeout 120 $T --speculative-config '{"num_speculative_tokens": 3}' \
    --synthetic-acceptance 0.6 --output-json $OUT/r/tp-eagle-f1-t$n.json > $OUT/r/tp-eagle-f1-t$n.log 2>&1; echo "tokens=$n rc $?"
done

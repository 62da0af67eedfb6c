# data call (SEED=6 right after q1.sh: GGUF part 2 carried, assembled and converted; SEED=7 after that: the target
# is already on the machine): Magpie prompts from the target, greedy answers, no GSM8K (the seed-4 mix holds it);
# held-out splits of seeds 0-5, those made on this machine, GSM8K test and the human-written set excluded; the
# token dataset back as a compact npz
set -u
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/site .whl/*.whl || exit 1
export PYTHONPATH=/root/site:.
mkdir -p weights/.cache/smollm2-135m-instruct /root/data /root/m $OUT
if [ -f .gpu/p2/gg.01 ]; then
  cat /root/w/gg.00 .gpu/p2/gg.01 > weights/.cache/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf || exit 1
  python3 -m jaxspec fetch 2>&1 | tail -1
  cp -r weights/smollm2-135m-instruct /root/w/target
else
  mkdir -p weights/smollm2-135m-instruct && cp -rn /root/w/target/. weights/smollm2-135m-instruct/
fi
for f in .gpu/data2/*.xz; do xz -dc $f > /root/data/$(basename $f .xz); done; wc -l /root/data/*
EXC=""
for f in /root/data/gsm8k_test.jsonl bench/prompts/general_chat.jsonl /root/data/held_out_seed*.jsonl /root/w/work/*/prompts/held_out.jsonl; do
  [ -f $f ] && EXC="$EXC --exclude $f"
done
echo "excluded: $EXC"
echo "=== [t=$SECONDS] data seed $SEED"
W=/root/w/work/self100000-seed$SEED
mkdir -p $W
timeout $((570 - SECONDS)) python3 -m jaxspec train-eagle --model smollm2-135m-instruct --seq-len 512 --max-tokens 384 \
  --gen-batch 1024 --seed $SEED --dataset-cache $W/mix.npz --data-only --data self:100000 $EXC --prompts-out $W/prompts \
  --prompts-time-budget-s $PROMPT_S --gen-time-budget-s $GEN_S > /root/w/data-seed$SEED.log 2>&1
echo "rc $? t=$SECONDS"
grep -v "it/s\]" /root/w/data-seed$SEED.log | tail -24
ls -l $W $W/prompts
python3 .gpu/s6/pack_data.py $W/mix.npz /root/m/mix-seed$SEED.npz && cp /root/m/mix-seed$SEED.npz $OUT/
cp /root/w/data-seed$SEED.log $OUT/ && tar cf - -C $W prompts | xz -T8 > $OUT/prompts-seed$SEED.tar.xz
ls -l $OUT; echo "done t=$SECONDS"

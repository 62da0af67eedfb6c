# call C (right after n2.sh): both heads fine-tuned on the seed-3 mix (warm start from the shipped heads; EAGLE-1
# unrolled 3 steps; cuDNN target attention), then evaluated; the heads back as one split tar
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:.
ls -l /root/w/work/self100000-seed3/mix.npz || exit 1
python3 bench/train_default_heads.py /root/w/run --data-dir /root/data --self-prompts 100000 --seed 3 \
  --work-dir /root/w/work --warm-start weights --eagle-ttt-steps 3 --deadline-s 575 --eval-reserve-s 110 --eval-k 3,5 \
  --eval-args "--dataset held_out_seed2=/root/data/held_out_seed2.jsonl --dataset held_out_seed0=/root/data/held_out_seed0.jsonl"
echo "rc $? t=$SECONDS"
rm -f /root/w/run/prompts/train.jsonl
tar cf - -C /root/w run | split -b 15000000 -d -a 1 - $OUT/run.tar.
ls -l $OUT; echo "done t=$SECONDS"

# call F: both heads fine-tuned on the new mix (warm start from the shipped heads), then evaluated
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=/root/site:.
ls -l /root/w/work/self80000-seed1/mix.npz || exit 1
python3 bench/train_default_heads.py $OUT/heads --data-dir /root/data --self-prompts 80000 --seed 1 \
  --work-dir /root/w/work --warm-start weights --deadline-s 555 --eval-reserve-s 125 --eval-k 3,5 \
  --eval-args "--dataset held_out_seed0=bench/results/20261201-h200-general-heads/held_out.jsonl"
echo "done t=$SECONDS"

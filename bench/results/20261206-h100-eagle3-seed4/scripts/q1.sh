# call 1: GGUF part 1 to /root/w; the card
set -u
mkdir -p /root/w $OUT
cp .gpu/p1/gg.00 /root/w/ && echo "part 1 copied"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

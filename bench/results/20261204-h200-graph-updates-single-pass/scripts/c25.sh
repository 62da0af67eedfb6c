# issue 19 item 1: XLA command-buffer updates caused by a fresh output buffer (micro-benchmark, .gpu/cbuf.py)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=.
for L in 60 200; do timeout 200 python3 .gpu/cbuf.py $L 2>&1 | grep -E "^L=|Error"; done
echo "done t=$SECONDS"

# call 2: GGUF part 2 onto the machine
mkdir -p /root/w && cp .gpu/p2/m.xz.2 /root/w/ && ls -l /root/w && echo "done t=$SECONDS"

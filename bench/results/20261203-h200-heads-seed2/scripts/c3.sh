# call 3: GGUF part 3 onto the machine
mkdir -p /root/w && cp .gpu/p3/m.xz.3 /root/w/ && ls -l /root/w && echo "done t=$SECONDS"

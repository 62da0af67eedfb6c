# call 4: GGUF part 4 onto the machine
mkdir -p /root/w && cp .gpu/p4/m.xz.4 /root/w/ && ls -l /root/w && echo "done t=$SECONDS"

#!/usr/bin/env bash
# A swarm of processes with one worker on the GPU, as a user runs it
# (docs/serving.md's swarm by hand with -device cuda:0 on w1): its logits
# must equal local mode's byte for byte. Needs a GPU; in the project root:
#   source .device-go/env.sh && bash kernels/cuda/swarmcheck.sh
# (W1_DEVICE=cpu runs the same swarm without a GPU.)
set -euo pipefail
out=${OUT:-cuda-out}
mkdir -p "$out"
d=$(mktemp -d)
b=$d/odmoe-cuda
CGO_ENABLED=0 go build -tags cuda -o "$b" .
"$b" gen-tiny -out "$d/tiny" >/dev/null 2>&1
"$b" certs -out "$d/certs" -nodes main,w1,w2 >/dev/null 2>&1
"$b" convert -model "$d/tiny" -out "$d/store" >/dev/null 2>&1
"$b" run -role worker -listen 127.0.0.1:7411 -store "$d/store" -certs "$d/certs" -name w1 -device-mem 256MiB -device "${W1_DEVICE:-cuda:0}" >"$out/w1.log" 2>&1 &
w1=$!
"$b" run -role worker -listen 127.0.0.1:7412 -store "$d/store" -certs "$d/certs" -name w2 -device-mem 256MiB >"$out/w2.log" 2>&1 &
w2=$!
trap 'kill $w1 $w2 2>/dev/null || true' EXIT
"$b" run -role main -model "$d/tiny" -workers 127.0.0.1:7411,127.0.0.1:7412 -certs "$d/certs" \
  -prompt "Hello" -n 32 -dump "$d/swarm" -stats "$out/stats.json" >"$out/main.log" 2>&1
"$b" run -role local -model "$d/tiny" -prompt "Hello" -n 32 -dump "$d/local" >"$out/local.log" 2>&1
grep -h "worker ready" "$out/w1.log" "$out/w2.log"
grep -h "mainnode: worker" "$out/main.log"
cmp "$d/swarm/logits.npy" "$d/local/logits.npy" && cmp "$d/swarm/tokens.json" "$d/local/tokens.json" &&
  echo "swarm with a GPU worker: logits.npy ($(stat -c %s "$d/swarm/logits.npy") bytes) and tokens.json identical to local mode's"

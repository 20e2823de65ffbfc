#!/usr/bin/env bash
# The measurements two shared cores cannot make, as one run on a machine
# of 16 cores with an NVIDIA GPU (issue 60; docs/BENCHMARKS.md "On a
# 16-core GPU machine"):
#
#  1. the CUDA tag's checks (make test-cuda), the PTX rebuilt with this
#     machine's nvcc first;
#  2. the paper's headline on a GPU: a swarm of CUDA workers sharing the
#     GPU (gpu-cores.rig: a 1 GiB budget each, main node and shadow on
#     cores of their own) on qwen3-moe-small and gpt-oss-small, resident
#     against reactive and shadow mode, with each worker's GPU memory;
#  3. paper.rig's ten nodes each on cores of their own (paper-cores.rig),
#     resident, resident-shadow, reactive and shadow on the small preset,
#     and bench serve with the swarm and its clients on separate cores.
#
# In the project root, with Go (../shared/tools/device-go there):
#   source .device-go/env.sh && bash testbed/gpumachine.sh
# Everything lands in $OUT (or ./gpumachine-out): summary.txt, the logs,
# and results.tar.gz (every report). GPU=cpu runs the same on CPU workers
# and CPUS=0-1 squeezes every pin onto the given cores, PRESETS picks
# the models of step 2 (a dry run here: GPU=cpu CPUS=0-1 ROUNDS=1
# SMALL=tiny PRESETS="qwen3-moe-tiny gpt-oss-tiny-mxfp4"). DEADLINE is
# the seconds the whole run may take (each step gets what is left);
# STEPS picks steps (tests gpu paper serve).
set -uo pipefail
out=${OUT:-gpumachine-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
res=/tmp/gpumachine
rm -rf "$res" && mkdir -p "$res"
t0=$(date +%s)
deadline=${DEADLINE:-560}
gpu=${GPU:-cuda:0}
rounds=${ROUNDS:-3}
gpurounds=${GPUROUNDS:-2}
small=${SMALL:-small}
presets=${PRESETS:-qwen3-moe-small gpt-oss-small}
steps=${STEPS:-tests gpu paper serve} # which of the steps to run
has() { [[ " $steps " == *" $1 "* ]]; }
bin=$PWD/bin/odmoe-cuda
models=/tmp/gpumachine-models
log() { echo "[$(($(date +%s) - t0))s] $*" | tee -a "$out/summary.txt"; }
left() { echo $((deadline - ($(date +%s) - t0))); }
# within SECONDS CMD...: CMD, stopped at SECONDS or at what is left before
# the deadline less a reserve for packing, whichever is sooner
within() {
  local cap=$1 l
  shift
  l=$(($(left) - 15))
  ((l < cap)) && cap=$l
  if ((cap < 5)); then
    log "skipped (no time left): $*"
    return 124
  fi
  timeout --kill-after=5 "$cap" "$@"
}
# rig FILE: the rig, its pins squeezed onto $CPUS when set, the workers'
# device $GPU
rig() {
  local f=$res/$(basename "$1")
  sed -e "s/-device cuda:0/-device $gpu/" "$1" >"$f"
  [ -n "${CPUS:-}" ] && sed -i -E "s/cpus=[0-9,-]+/cpus=$CPUS/" "$f"
  echo "$f"
}
benchcpus=${CPUS:-14,15}
pack() { tar -C "$res" -czf "$out/results.tar.gz" --exclude='*.npy' --exclude='store' . 2>/dev/null; }

: >"$out/summary.txt"
log "== the machine"
{
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  nvcc --version | tail -2
  lscpu | grep -E '^Model name|^CPU\(s\)|^Thread|^Core|^Socket|^NUMA node'
  echo "cpu flags: $(grep -o 'avx512[a-z_0-9]*\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  free -g | head -2
  command -v taskset
  go version
} 2>&1 | tee -a "$out/summary.txt"

log "== PTX and the binary"
(cd kernels/cuda && command -v nvcc >/dev/null && go generate -tags cuda . && cp expert.ptx "$out/expert.ptx") 2>&1 | tail -5 | tee -a "$out/summary.txt"
CGO_ENABLED=0 go build -tags cuda -o "$bin" . || {
  log "build failed"
  exit 1
}
"$bin" version 2>&1 | tail -2 | tee -a "$out/summary.txt"

log "== models (in the background, beside the tests)"
mkdir -p "$models"
(
  has paper || small=
  for p in $small $presets; do
    [ -d "$models/$p.store" ] || { "$bin" gen-tiny -preset "$p" -seed 1 -out "$models/$p" -log-level warn && "$bin" convert -model "$models/$p" -out "$models/$p.store" -log-level warn; }
    echo "model $p: $?"
  done
) >"$res/models.log" 2>&1 &
gen=$!

if [ "$gpu" != cpu ] && has tests; then
  log "== make test-cuda"
  if command -v make >/dev/null; then
    tc=(make test-cuda TESTFLAGS=-v)
  else # the Makefile's recipe itself
    tc=(env CGO_ENABLED=0 go test -tags cuda -count=1 -p 1 -v -run 'Forward|MatMul|SwiGLU|Open|CUDA' ./kernels/cuda ./worker ./mainnode)
  fi
  log "${tc[*]}"
  within 220 "${tc[@]}" 2>&1 | tee "$out/test-cuda.log" | grep -E '^(--- |PASS|FAIL|ok|panic)|_test.go:' | tee -a "$out/summary.txt"
  log "make test-cuda rc ${PIPESTATUS[0]}"
fi
wait $gen
cat "$res/models.log" | tee -a "$out/summary.txt"

# the GPU's memory by process while the GPU swarms run
sample() {
  while :; do
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null | while IFS=', ' read -r pid mib; do
      echo "$(date +%s) $pid $mib $(tr '\0' ' ' </proc/$pid/cmdline 2>/dev/null | grep -o -- '-name [a-z0-9]*')"
    done
    echo "$(date +%s) total $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null)"
    sleep 1
  done
}
if [ "$gpu" != cpu ]; then
  sample >"$res/gpumem.txt" 2>/dev/null &
  sampler=$!
fi
has gpu || presets=
for p in $presets; do
  log "== the GPU swarm on $p: resident, reactive, shadow"
  within 170 taskset -c "$benchcpus" "$bin" bench rig -via local -rig "$(rig testbed/rigs/gpu-cores.rig)" -model "$models/$p" -store "$models/$p.store" \
    -cases 16x64,128x64 -modes resident,reactive,shadow -repeat "$gpurounds" -out "$res/gpu-$p" -log-level warn >"$res/gpu-$p.log" 2>&1
  log "bench rig $p rc $?"
  [ -f "$res/gpu-$p/report.md" ] && sed -n '/^|/p' "$res/gpu-$p/report.md" | head -12 | tee -a "$out/summary.txt"
  tail -3 "$res/gpu-$p.log" | tee -a "$out/summary.txt"
  pack
done
[ -n "${sampler:-}" ] && kill "$sampler" 2>/dev/null
if [ -s "$res/gpumem.txt" ]; then
  log "GPU memory per worker, MiB at most (nvidia-smi):"
  # by node name where /proc shows the PID nvidia-smi gives, else by PID
  # (a VM's driver may name PIDs this machine cannot see)
  awk '$2 != "total" { k = ($5 != "" ? $5 : "pid " $2); if ($3 > m[k]) m[k] = $3 } $2 == "total" && $3 > t { t = $3 } END { for (k in m) print k, m[k]; print "whole GPU at most", t }' "$res/gpumem.txt" | sort -V | tr '\n' ';' | tee -a "$out/summary.txt"
  echo | tee -a "$out/summary.txt"
fi

has paper && {
log "== paper.rig, every node on cores of its own ($small)"
within 220 taskset -c "$benchcpus" "$bin" bench rig -via local -rig "$(rig testbed/rigs/paper-cores.rig)" -model "$models/$small" -store "$models/$small.store" \
  -cases 16x64,128x64 -modes resident,resident-shadow,reactive,shadow -repeat "$rounds" -out "$res/paper-cores" -log-level warn >"$res/paper-cores.log" 2>&1
log "bench rig paper-cores rc $?"
[ -f "$res/paper-cores/report.md" ] && sed -n '/^|/p' "$res/paper-cores/report.md" | head -14 | tee -a "$out/summary.txt"
tail -3 "$res/paper-cores.log" | tee -a "$out/summary.txt"
pack
}

has serve && {
log "== bench serve, the swarm on cores apart from its clients"
nodecpus=0-13
[ -n "${CPUS:-}" ] && nodecpus=$CPUS
within 150 taskset -c "$benchcpus" "$bin" bench serve -preset tiny -clients 1,4 -text-rounds 3 -node-cpus "$nodecpus" -out "$res/serve" -log-level warn >"$res/serve.log" 2>&1
log "bench serve rc $?"
[ -f "$res/serve/report.md" ] && grep -E '^\||CPUs' "$res/serve/report.md" | head -20 | tee -a "$out/summary.txt"
tail -3 "$res/serve.log" | tee -a "$out/summary.txt"
pack
}
log "done; $(ls -la "$out" | wc -l) entries in $out"

#!/usr/bin/env bash
# The GPU checks of the cuda tag, as one run on a machine with an NVIDIA
# GPU, nvcc and .device-go (../shared/tools/device-go): rebuild the PTX,
# run every cuda-tagged test, then the GPU benchmarks. Logs go to $OUT
# (or ./cuda-out). Usage, in the project root:
#   source .device-go/env.sh && bash kernels/cuda/devicecheck.sh
set -uo pipefail
out=${OUT:-cuda-out}
mkdir -p "$out"
export CGO_ENABLED=0 # purego: the cuda tag needs no cgo (the cu probe below turns it on for itself)
nvidia-smi -L | tee "$out/gpu.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee -a "$out/gpu.txt"
nvcc --version | tail -2 | tee -a "$out/gpu.txt"
lscpu | grep -E '^Model name|^CPU\(s\)' | tee -a "$out/gpu.txt"
echo "cpu flags: $(grep -o 'avx512[a-z_0-9]*\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')" | tee -a "$out/gpu.txt"
go run . version 2>&1 | tail -3 | tee -a "$out/gpu.txt"

echo "== gorgonia.org/cu v0.9.6 against this CUDA's headers" | tee "$out/cu-probe.txt"
if [ -d .cuprobe ]; then
  (cd .cuprobe && CGO_ENABLED=1 CGO_CFLAGS=-I/usr/local/cuda/include CGO_LDFLAGS="-L/usr/local/cuda/lib64/stubs -L/usr/local/cuda/lib64" \
    timeout 120 go build -mod=vendor -o /dev/null . 2>&1 | head -40) | tee -a "$out/cu-probe.txt"
  echo "rc ${PIPESTATUS[0]}" | tee -a "$out/cu-probe.txt"
fi

echo "== PTX"
go generate -tags cuda ./kernels/cuda 2>&1 | tee "$out/generate.txt"
cp kernels/cuda/expert.ptx "$out/expert.ptx"
(cd kernels/cuda && nvcc -cubin -arch=sm_90 -fmad=false -ftz=false -prec-div=true -O3 --resource-usage -o /tmp/expert.cubin expert.cu) 2>&1 | tee "$out/resources.txt"

echo "== tests"
timeout 300 go test -tags cuda -count=1 -p 1 -v -run 'Forward|MatMul|SwiGLU|Open|CUDA' ./kernels/cuda ./worker ./main 2>&1 | tee "$out/test.log" \
  | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic)|_test.go' | grep -v '=== RUN' | tail -40
echo "tests rc ${PIPESTATUS[0]}"

echo "== benchmarks"
timeout 240 go test -tags cuda -run '^$' -bench . -benchtime 0.5s -count ${BENCH_COUNT:-1} ./kernels/cuda 2>&1 | tee "$out/bench.txt" | grep -E 'Benchmark|ok|FAIL'
echo "== a swarm of processes, one worker on the GPU"
bash kernels/cuda/swarmcheck.sh

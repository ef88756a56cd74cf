# The two Quick-start commands (README): `make audit` and `make test`.
PRESET ?= default
BUILD_DIR := build/$(PRESET)
# Parallel build and test jobs: the machine's CPUs, at most one per 1.5 GB of available memory
# (ci/jobs.sh says why). `make test JOBS=n` overrides it.
ifndef JOBS
JOBS := $(shell ci/jobs.sh)
endif
ifeq ($(strip $(JOBS)),)
$(error JOBS is empty: ci/jobs.sh printed no job count (see its message above))
endif

.PHONY: deps configure build test audit sanitize clean

deps:
	@ci/install-deps.sh

configure: deps
	@cmake --preset $(PRESET) >/dev/null

build: configure
	@cmake --build --preset $(PRESET) -j $(JOBS)

# glibc malloc settings for the test processes (results do not depend on them): the oracle
# allocates and frees many large zeroed vectors per case (sparse MLA floors at production
# shapes); with glibc's defaults most of them were fresh mmap/brk pages, zeroed by the kernel
# on first touch. Keeping freed memory in the process (trim threshold 1 GiB, mmap threshold
# 32 MiB, glibc's largest) cut Prop_reference.smla_* from 390k-558k page faults and 19.1-25.7 s
# CPU to 50k-54k and 8.6-14.8 s (perf stat, 2-core dev box, 2026-12-01). Blocks past 32 MiB
# (FP8 many-row draws) were still mmapped per allocation: without mmap (MALLOC_MMAP_MAX_ 0,
# the heap serves them) TileLimits.MutantsFailAtLevel0OnEverySeed_fp8_ops_rows_past_tile_zero
# took 39 s instead of 109 s CPU (1.5M instead of 5.6M page faults), peak RSS 1.84 GB instead
# of 1.94 GB. Values already in the environment win; other allocators (ASan's) ignore them.
export MALLOC_MMAP_THRESHOLD_ ?= 33554432
export MALLOC_TRIM_THRESHOLD_ ?= 1073741824
export MALLOC_MMAP_MAX_ ?= 0

# The sanitizer fuzz pass runs first so that ctest's summary closes the output.
test: build
ifeq ($(PRESET),default)
	@JOBS=$(JOBS) ci/sanitize.sh fuzz
endif
	@ctest --preset $(PRESET) -j $(JOBS)

# Every CPU test that builds without LibTorch, under ASan + UBSan.
sanitize: deps
	@JOBS=$(JOBS) ci/sanitize.sh all

audit: build
	@$(BUILD_DIR)/cli/dsa-verify audit

clean:
	rm -rf build

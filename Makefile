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

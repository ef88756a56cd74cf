# The two Quick-start commands (README): `make audit` and `make test`.
PRESET ?= default
BUILD_DIR := build/$(PRESET)
JOBS ?= 2

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
	@ci/sanitize.sh fuzz
endif
	@ctest --preset $(PRESET) -j $(JOBS)

# Every CPU test that builds without LibTorch, under ASan + UBSan.
sanitize: deps
	@ci/sanitize.sh all

audit: build
	@$(BUILD_DIR)/cli/dsa-verify audit

clean:
	rm -rf build

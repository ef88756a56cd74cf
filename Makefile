# The two Quick-start commands (README): `make audit` and `make test`.
PRESET ?= default
BUILD_DIR := build/$(PRESET)
JOBS ?= 2

.PHONY: deps configure build test audit clean

deps:
	@ci/install-deps.sh

configure: deps
	@cmake --preset $(PRESET) >/dev/null

build: configure
	@cmake --build --preset $(PRESET) -j $(JOBS)

test: build
	@ctest --preset $(PRESET) -j $(JOBS)

audit: build
	@$(BUILD_DIR)/cli/dsa-verify audit

clean:
	rm -rf build

#!/usr/bin/env bash
# Kept for older notes: the device-side script is ci/gpu/test.sh.
exec "$(dirname "$0")/../../ci/gpu/test.sh" "$@"

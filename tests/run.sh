#!/usr/bin/env bash
# Every test: the Rust workspace (`cargo test --workspace`), then the browser demo in
# headless Chromium and the npm package under Node (tests/browser/run.sh). Where Node or
# Chromium is missing, that part prints why and is skipped, unless RB_REQUIRE_BROWSER=1.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace
tests/browser/run.sh

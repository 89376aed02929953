#!/usr/bin/env bash
# The whole test suite: unit, property and integration tests of every crate, and a
# one-iteration smoke run of every benchmark so they cannot rot.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked
cargo bench --workspace --locked -- --test

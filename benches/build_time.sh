#!/usr/bin/env bash
# Build time is part of performance for a type-heavy DSL. Prints:
#   1. a clean release build of the whole workspace's libraries and binaries
#      (fresh target directory; tests, benches and examples are not built),
#   2. an incremental release rebuild of the CNN training example after
#      touching the file that defines its model (examples/src/train/mod.rs).
# Usage: bash benches/build_time.sh   (takes minutes; uses its own target dir)
set -euo pipefail
cd "$(dirname "$0")/.."
target=$(mktemp -d "${TMPDIR:-/tmp}/forma-build-time.XXXXXX")
trap 'rm -rf "$target"' EXIT
export CARGO_TARGET_DIR="$target"
cores=$(nproc)
echo "rustc $(rustc --version | cut -d' ' -f2), $cores cores, target dir $target"
cargo fetch -q
ms() { date +%s%3N; }
seconds() { printf "%d.%d" $(($1 / 1000)) $((($1 % 1000) / 100)); }
start=$(ms)
cargo build -q --release --workspace
echo "clean release build of the workspace (libraries and binaries): $(seconds $(($(ms) - start))) s"
# Build the example once (it and its dev-dependencies are not part of the
# workspace build above), so the timed build below is the incremental one.
cargo build -q --release -p forma-examples --example train
touch examples/src/train/mod.rs
start=$(ms)
cargo build -q --release -p forma-examples --example train
echo "incremental rebuild of --example train after touching its model: $(seconds $(($(ms) - start))) s"

#!/usr/bin/env bash
# Build time is part of performance for a type-heavy DSL. Prints:
#   1. a clean release build of the whole workspace's libraries and binaries
#      (fresh target directory; tests, benches and examples are not built);
#   2. the rebuild of the `03-module` example after an edit to its model
#      (a hidden layer widened from 16 to 24, restored on exit), with the
#      `fast` profile (release code, incremental; the README's advice for the
#      edit-run loop) and with `--release`, beside the 15 s target.
# Usage: bash benches/build_time.sh [--rebuild-only]
#   Minutes; builds in a new target directory. `--rebuild-only` skips the
#   clean build, and uses $CARGO_TARGET_DIR when it is set (a warm cache).
set -euo pipefail
cd "$(dirname "$0")/.."
example=examples/examples/03-module.rs
backup=$(mktemp)
cp "$example" "$backup"
if [ "${1:-}" = "--rebuild-only" ] && [ -n "${CARGO_TARGET_DIR:-}" ]; then
    target=$CARGO_TARGET_DIR
    trap 'cp "$backup" "$example"; rm -f "$backup"' EXIT
else
    target=$(mktemp -d "${TMPDIR:-/tmp}/forma-build-time.XXXXXX")
    trap 'cp "$backup" "$example"; rm -rf "$target" "$backup"' EXIT
fi
export CARGO_TARGET_DIR="$target"
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
echo "rustc $(rustc --version | cut -d' ' -f2), $(nproc) cores ($cpu), target dir $target"
cargo fetch -q
ms() { date +%s%3N; }
seconds() { printf "%d.%d" $(($1 / 1000)) $((($1 % 1000) / 100)); }
if [ "${1:-}" != "--rebuild-only" ]; then
    start=$(ms)
    cargo build -q --release --workspace
    echo "clean release build of the workspace (libraries and binaries): $(seconds $(($(ms) - start))) s"
fi
widen() { sed -i 's/fc2: Linear<16, 16>,/fc2: Linear<16, 24>,/; s/fc3: Linear<16, 1>,/fc3: Linear<24, 1>,/' "$example"; }
for profile in fast release; do
    cp "$backup" "$example"
    # Build once, so the timed build is the rebuild after the edit.
    cargo build -q --profile "$profile" -p forma-examples --example 03-module
    widen
    grep -q "Linear<16, 24>" "$example" || { echo "the edit did not apply to $example" >&2; exit 1; }
    start=$(ms)
    cargo build -q --profile "$profile" -p forma-examples --example 03-module
    echo "rebuild of --example 03-module after editing its model, --profile $profile: $(seconds $(($(ms) - start))) s (target: 15 s)"
done

#!/usr/bin/env bash
# Follows the README's "Use Forma in your project" section as a new user
# would: a new crate outside the checkout, the section's `Cargo.toml` lines
# (the path pointed at this checkout) and its `src/main.rs`, then `cargo run`.
# Fails if the section's program does not build, does not run, does not
# print the shape it promises, or prints other losses in a release build.
# CI runs it (.ci/run).
# Usage: bash tools/fresh-crate.sh
set -euo pipefail
checkout=$(cd "$(dirname "$0")/.." && pwd)
dir=$(mktemp -d "${TMPDIR:-/tmp}/forma-fresh-crate.XXXXXX")
trap 'rm -rf "$dir"' EXIT

# The section's first ```toml block and first ```rust block.
block() {
    awk -v lang="$1" '
        /^## / { inside = ($0 == "## Use Forma in your project") }
        inside && !done && $0 == "```" lang { grab = 1; next }
        grab && $0 == "```" { grab = 0; done = 1 }
        grab { print }
    ' "$checkout/README.md"
}
toml=$(block toml)
main=$(block rust)
[ -n "$toml" ] && [ -n "$main" ] || { echo "README: no toml/rust block in the section" >&2; exit 1; }
grep -q 'path = "../forma"' <<<"$toml" || { echo "README: the dependency line changed; update this script" >&2; exit 1; }

cd "$dir"
cargo new -q --bin --vcs none hello-forma
cd hello-forma
# `cargo new`'s package table, then the README's lines as they are (they
# start with `[dependencies]`), with the checkout's real path.
sed -i '/^\[dependencies\]$/d' Cargo.toml
printf '%s\n' "${toml//..\/forma/$checkout}" >> Cargo.toml
printf '%s\n' "$main" > src/main.rs
echo "== $dir/hello-forma/Cargo.toml"
cat Cargo.toml
out=$(cargo run -q 2>&1) || { echo "$out" >&2; exit 1; }
echo "$out"
grep -q '^\[16, 2\]$' <<<"$out" || { echo "the program did not print [16, 2]" >&2; exit 1; }
grep -q '^step 0: loss ' <<<"$out" || { echo "the program did not print its loss" >&2; exit 1; }
# The same seed gives the same bits in debug and release builds: the
# kernels pick their code paths at run time, never by build profile.
release=$(cargo run -q --release 2>&1) || { echo "$release" >&2; exit 1; }
if [ "$release" != "$out" ]; then
    echo "debug and release printed different losses:" >&2
    diff <(echo "$out") <(echo "$release") >&2 || true
    exit 1
fi
echo "fresh crate: built and ran the README's program; debug and release agree"

#!/usr/bin/env bash
# CUDA check in two steps, for a GPU machine without a Rust toolchain.
#
#   tools/gpu-check.sh build [BUNDLE]   # here (Rust, no GPU needed): builds the
#                                       # CUDA test and bench binaries and packs
#                                       # them with the fixtures into BUNDLE
#                                       # (default target/gpu-bundle) and BUNDLE.tar.gz
#   BUNDLE/run.sh                       # there (NVIDIA driver, CUDA libraries,
#                                       # PyTorch; no Rust): finds libcuda,
#                                       # libnvrtc and libcublas, sets
#                                       # LD_LIBRARY_PATH, runs every test binary
#                                       # and the bench beside PyTorch's figures
#
# run.sh writes BUNDLE/results/*.log and prints a summary; its exit status is
# non-zero when a test binary failed.
set -euo pipefail

cmd=${1:-}
root=$(cd "$(dirname "$0")/.." && pwd)

build() {
    local bundle=${1:-$root/target/gpu-bundle}
    cd "$root"
    rm -rf "$bundle"
    mkdir -p "$bundle/bin" "$bundle/tools"
    local list
    list=$(mktemp)
    # Test binaries of the root crate (every suite, the CUDA variants
    # included), of forma-cuda (NVRTC compile check, unit tests), and the bench.
    cargo test -p forma --features cuda --tests --no-run --message-format=json >"$list.1"
    cargo test -p forma-cuda --features cuda --tests --lib --no-run --message-format=json >"$list.2"
    cargo bench -p forma-benches --features cuda --bench cuda --no-run --message-format=json >"$list.3"
    # NcclGroup on one GPU (world size 1).
    cargo test -p forma-distributed --features nccl --test nccl --no-run --message-format=json >"$list.4"
    cat "$list".1 "$list".2 "$list".3 "$list".4 | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])
' | sort -u >"$list"
    while read -r exe; do
        cp "$exe" "$bundle/bin/"
    done <"$list"
    rm -f "$list" "$list".1 "$list".2 "$list".3 "$list".4
    cp -r tools/fixtures "$bundle/tools/fixtures"
    cp benches/cuda_bench.py "$bundle/"
    cp tools/gpu-check.sh "$bundle/gpu-check.sh"
    cat >"$bundle/run.sh" <<'RUN'
#!/usr/bin/env bash
here=$(cd "$(dirname "$0")" && pwd)
exec bash "$here/gpu-check.sh" run "$here"
RUN
    chmod +x "$bundle/run.sh" "$bundle/gpu-check.sh"
    tar -C "$(dirname "$bundle")" -czf "$bundle.tar.gz" "$(basename "$bundle")"
    echo "bundle: $bundle ($(ls "$bundle/bin" | wc -l) binaries), archive: $bundle.tar.gz"
}

# The first directory holding a file matching $1 among the usual places.
find_lib() {
    local pat=$1 d f
    local dirs=(/usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib/wsl/lib /usr/local/cuda/lib64 /usr/local/cuda-*/lib64
        /usr/local/cuda*/targets/x86_64-linux/lib)
    local py
    for py in python3 python; do
        if command -v "$py" >/dev/null 2>&1; then
            while read -r d; do dirs+=("$d"); done < <("$py" -c '
import glob, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for d in sorted(glob.glob(r + "/nvidia/*/lib")) + sorted(glob.glob(r + "/nvidia/*/*/lib")) + [r + "/torch/lib"]:
        print(d)
' 2>/dev/null)
            break
        fi
    done
    for d in "${dirs[@]}"; do
        for f in "$d"/$pat; do
            if [ -e "$f" ]; then
                echo "$d"
                return 0
            fi
        done
    done
    return 1
}

run() {
    local bundle=${1:-$(cd "$(dirname "$0")" && pwd)}
    local extra="" lib d
    for lib in 'libcuda.so*' 'libnvrtc.so*' 'libcublas.so*' 'libcublasLt.so*' 'libnccl.so*'; do
        if d=$(find_lib "$lib"); then
            echo "found $lib in $d"
            case ":$extra:" in *":$d:"*) ;; *) extra="$extra:$d" ;; esac
        else
            echo "warning: $lib not found; tests needing it will say so"
        fi
    done
    export LD_LIBRARY_PATH="${extra#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export FORMA_ROOT="$bundle"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
    mkdir -p "$bundle/results"
    local failed=0 exe name
    for exe in "$bundle"/bin/*; do
        name=$(basename "$exe")
        case "$name" in cuda-*) continue ;; esac # the bench runs below
        if "$exe" --test-threads=1 >"$bundle/results/$name.log" 2>&1; then
            echo "PASS $name: $(grep -E '^test result' "$bundle/results/$name.log" | tail -1)"
        else
            failed=1
            echo "FAIL $name (see results/$name.log):"
            grep -E '^test .* FAILED|panicked' "$bundle/results/$name.log" | head -20
        fi
    done
    local bench
    bench=$(ls "$bundle"/bin/cuda-* 2>/dev/null | head -1 || true)
    if [ -n "$bench" ]; then
        python3 "$bundle/cuda_bench.py" --forma "$bench" 2>&1 | tee "$bundle/results/bench.log" || true
    fi
    return $failed
}

case "$cmd" in
    build) shift; build "$@" ;;
    run) shift; run "$@" ;;
    *) sed -n '2,17p' "$0"; exit 2 ;;
esac

#!/usr/bin/env bash
# Fuzzes every loader: builds the targets (stable toolchain: `--sanitizer none`), writes
# the seed corpus, then runs each target for a number of executions or seconds and prints
# a table (target, executions, seconds, executions/s, crashes).
#
#   fuzz/run.sh runs 10000000 [targets...]   # the documented runs (docs/fuzzing.md)
#   fuzz/run.sh seconds 20 [targets...]      # CI's short run
#
# Needs cargo-fuzz (`cargo install cargo-fuzz --locked`). A crash stops that target and
# leaves its input in fuzz/artifacts/<target>/; the run exits non-zero. RB_FUZZ_ONNX=1
# adds the ONNX target (tract is a long build).
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:?runs N or seconds N}"; amount="${2:?how many}"; shift 2
all=(rbw opt rbl peft hf gguf tokenizer_config network_json npy idx csv token_file openai_request)
features=()
if [ "${RB_FUZZ_ONNX:-0}" = 1 ]; then all+=(onnx); features=(--features onnx); fi
targets=("${@:-${all[@]}}")

# One thread: the loaders are what is fuzzed, and rayon's idle spinning would take
# half the executions.
export RAYON_NUM_THREADS=1
workspace_target="${CARGO_TARGET_DIR:-target}"
export CARGO_TARGET_DIR="${RB_FUZZ_TARGET_DIR:-$workspace_target/fuzz}"
# The seeds come from the workspace's own test build (native/tests/fuzz_seeds.rs), in
# the workspace's target folder: the fuzz folder's code is built with coverage hooks.
RB_FUZZ_SEEDS="$PWD/fuzz/corpus" CARGO_TARGET_DIR="$workspace_target" \
    cargo test -q -p rusting_brain --test fuzz_seeds >/dev/null
cargo fuzz build --sanitizer none -O "${features[@]}"
bin="$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release"

case "$mode" in
    runs) limit=(-runs="$amount") ;;
    seconds) limit=(-max_total_time="$amount") ;;
    *) echo "mode is runs or seconds" >&2; exit 2 ;;
esac

status=0
table="${RB_FUZZ_TABLE:-fuzz/last-run.md}"
printf '\n| target | executions | seconds | executions/s | crashes |\n|---|---:|---:|---:|---:|\n' >"$table"
for t in "${targets[@]}"; do
    mkdir -p "fuzz/artifacts/$t"
    log="fuzz/artifacts/$t/log.txt"
    start=$(date +%s)
    # -rss_limit_mb / -malloc_limit_mb: a loader that allocates what the file cannot hold
    # is a crash. -timeout: a hang is one too.
    if "$bin/$t" "fuzz/corpus/$t" -artifact_prefix="fuzz/artifacts/$t/" "${limit[@]}" \
        -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10 -print_final_stats=1 >"$log" 2>&1; then
        crashes=0
    else
        crashes=1; status=1
        echo "== $t crashed: see $log and fuzz/artifacts/$t/" >&2
        tail -30 "$log" >&2
    fi
    secs=$(( $(date +%s) - start ))
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    printf '| %s | %s | %s | %s | %s |\n' "$t" "${runs:-?}" "$secs" \
        "$(( ${runs:-0} / (secs > 0 ? secs : 1) ))" "$crashes" | tee -a "$table"
done
cat "$table"
exit $status

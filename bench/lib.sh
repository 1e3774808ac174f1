# SPDX-License-Identifier: Apache-2.0
# bench/lib.sh — the preamble that bench/run_*.sh and scripts/device/*.sh
# share, sourced from the repository root (`cd` there first, then
# `. bench/lib.sh`).  One place for what every script that builds, runs and
# files a result does the same way: a scratch folder, the output folder, the
# time left of a deadline, the machine banner, the build that fails with the
# log's tail, the CUDA toolkit, reading a JSON field, and where results go
# (bench/results on the cuda backend, $OUT or the build folder elsewhere).
# gm_commit_id (bench/commit_id.sh) comes with it.
# Nothing here runs on its own: each function is called by the script.

. bench/commit_id.sh

# gm_workdir: $work, a scratch folder removed when the script exits.
gm_workdir() {
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
}

# gm_outdir: $OUT (default build-device/out) made, and made absolute.
gm_outdir() {
    OUT="${OUT:-build-device/out}"
    mkdir -p "$OUT" || { echo "FAILED: cannot make $OUT"; exit 1; }
    OUT="$(cd "$OUT" && pwd)"
}

# gm_deadline_start: the clock `left` reads ($DEADLINE seconds from now).
gm_deadline_start() {
    start_all=$SECONDS
}

# left N: the seconds left of DEADLINE, at most N and at least 1.
left() {
    local l=$((DEADLINE - (SECONDS - start_all)))
    [ "$l" -lt 1 ] && l=1
    [ "$l" -lt "$1" ] && echo "$l" || echo "$1"
}

# gm_time_for PART MIN MAX: $t = the seconds left of DEADLINE for a part, at
# most MAX; status 1, with a line that says the part is skipped, when fewer
# than MIN are left.
gm_time_for() {
    t=$(left "$3")
    [ "$t" -ge "$2" ] && return 0
    echo "=== $1 skipped: ${t} s left of DEADLINE"
    return 1
}

# gm_trace_cli WHO: the replay scripts' inputs: $tdir, when empty, becomes
# ../shared/traces where that exists; $cli is $GPUMEM or build/gpumem, which
# must be built (else WHO says so and the script exits 1).
gm_trace_cli() {
    [ -n "${tdir:-}" ] || { [ -d ../shared/traces ] && tdir=../shared/traces; } || true
    cli=${GPUMEM:-build/gpumem}
    [ -x "$cli" ] || { echo "$1: $cli not built (run make)" >&2; exit 1; }
}

# gm_trace_list ENDING: append to the array traces the real traces in $tdir
# (*.csv, *.csv.gz) and the five synthetic workloads (seed 1), written by
# $cli to $work/KIND.ENDING.
gm_trace_list() {
    local f k
    if [ -n "$tdir" ]; then
        for f in "$tdir"/*.csv "$tdir"/*.csv.gz; do [ -f "$f" ] && traces+=("$f"); done
    fi
    for k in kv_inference kv_paged vit_train multistream varbatch_train; do
        "$cli" synth "$k" --seed 1 -o "$work/$k.$1" 2>/dev/null
        traces+=("$work/$k.$1")
    done
}

# gm_banner [TEXT]: the GPUs (when nvidia-smi answers) and a host line with
# the cores, the memory and TEXT.
gm_banner() {
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>/dev/null || true
    echo "host: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo) of memory${1:+; $1}"
}

# gm_build LOG DIR TARGETS [CMAKE_ARG...]: configure DIR with the arguments
# and build TARGETS (space separated; empty: everything), the output in LOG.
# On failure: the log's tail, a FAILED line, status 1.
gm_build() {
    local log=$1 dir=$2 targets=$3 t=() x
    shift 3
    for x in $targets; do t+=(--target "$x"); done
    if ! { cmake -S . -B "$dir" "$@" >"$log" 2>&1 &&
           cmake --build "$dir" -j "$(nproc)" "${t[@]}" >>"$log" 2>&1; }; then
        tail -n 30 "$log"
        echo "FAILED: building ${targets:-$dir} (log above)"
        return 1
    fi
}

# gm_cuda_toolkit: $cuda (CUDA_HOME, else nvcc's, else /usr/local/cuda) and
# $cudalib (its lib64, else lib).
gm_cuda_toolkit() {
    cuda="${CUDA_HOME:-}"
    if [ -z "$cuda" ]; then
        if command -v nvcc >/dev/null; then cuda="$(dirname "$(dirname "$(command -v nvcc)")")"; else cuda=/usr/local/cuda; fi
    fi
    cudalib="$cuda/lib64"
    [ -d "$cudalib" ] || cudalib="$cuda/lib"
}

# gm_json FILE EXPR: a Python expression over the object `d` loaded from FILE.
gm_json() {
    "${PYTHON:-python3}" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2" 2>/dev/null
}

# gm_publish NAME RESULT LOG: file RESULT.json and RESULT.md (a bench's
# output, with "backend" and "gpu" keys) as DATE-LABEL-NAME.{json,md} and
# set $base to that path without its ending.  On the cuda backend they go to
# bench/results, labelled with the GPU's name; on another backend to $OUT
# (else $BUILD_DIR/bench-results), labelled BACKEND-Ncore, never to
# bench/results.  With $OUT set, the files and LOG (as NAME-bench-log.txt)
# are copied there too.  Exits 1 when they cannot be written.
gm_publish() {
    local name=$1 res=$2 log=$3 backend gpu label dest
    backend="$(gm_json "$res.json" 'd.get("backend") or ""')"
    gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"
    [ -n "$gpu" ] || gpu="$(gm_json "$res.json" 'd.get("gpu") or ""')"
    label="$(tr ' ' '-' <<<"${gpu:-unknown-GPU}" | tr -cd 'A-Za-z0-9._-')"
    [ "$backend" = cuda ] || label="${backend:-unknown}-$(nproc)core"
    if [ "$backend" = cuda ]; then
        dest=bench/results
    else
        dest="${OUT:-$BUILD_DIR/bench-results}"
        echo "WARNING: the bench ran on the '${backend:-unknown}' backend, not cuda: results go to $dest only"
    fi
    mkdir -p "$dest" || { echo "FAILED: cannot make $dest"; exit 1; }
    base="$dest/$(date -u +%Y-%m-%d)-$label-$name"
    if ! cp "$res.json" "$base.json" || ! cp "$res.md" "$base.md"; then
        echo "FAILED: cannot write $base.{json,md}"
        exit 1
    fi
    if [ -n "${OUT:-}" ]; then
        mkdir -p "$OUT"
        [ "$(cd "$OUT" && pwd)" = "$(cd "$dest" && pwd)" ] || cp "$base.md" "$base.json" "$OUT/"
        cp "$log" "$OUT/$name-bench-log.txt"
    fi
}

# gm_run_bench NAME RESULT COMMAND...: run the bench COMMAND, its output shown
# and kept in $work/log.txt; $st is its exit status.  Exits 1 when it wrote
# no RESULT.json; warns when it failed but wrote one.
gm_run_bench() {
    local name=$1 res=$2 start=$SECONDS
    shift 2
    echo "=== $name"
    "$@" 2>&1 | tee "$work/log.txt"
    st=${PIPESTATUS[0]}
    echo "--- $name: exit $st, $((SECONDS - start)) s"
    [ -f "$res.json" ] || { echo "FAILED: $name wrote no results (exit $st)"; exit 1; }
    [ "$st" = 0 ] || echo "WARNING: $name failed (exit $st): see the errors in the JSON and the log"
}

# gm_build_all LOG DIR SECONDS [CMAKE_ARG...]: configure DIR with the
# arguments (exit 1 when that fails, with the log's tail) and build all it
# can in at most SECONDS (make -k).  Status 1 when some target failed, with
# the errors shown; the script goes on with what was built.
gm_build_all() {
    local log=$1 dir=$2 secs=$3
    shift 3
    if ! cmake -S . -B "$dir" "$@" >"$log" 2>&1; then
        echo "configure failed"
        tail -30 "$log"
        exit 1
    fi
    timeout "$secs" cmake --build "$dir" -j "$(nproc)" -- -k >>"$log" 2>&1 ||
        { echo "build: some targets failed"; grep -E 'error|Error' "$log" | head -20; return 1; }
}

# gm_default NAME=VALUE...: each NAME keeps its value from the environment
# when that is set and not empty, else takes VALUE (the knobs of a script).
gm_default() {
    local a n
    for a; do
        n=${a%%=*}
        [ -n "${!n:-}" ] || printf -v "$n" '%s' "${a#*=}"
    done
}

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/run_alloc_bench.sh — build and run the side-by-side allocator
# benchmark (bench/alloc_bench.c) on the GPU machine, one process per
# allocator, and merge the parts into bench/results/DATE-GPU-alloc.{md,json}.
#
# usage: bench/run_alloc_bench.sh [TRACE_DIR]     (from anywhere)
#   TRACE_DIR  RMM traces (*.csv, *.csv.gz) to replay; default .device-traces
# Environment:
#   OUT        where copies of the results and the logs go (default: none)
#   BUILD_DIR  gpumem build directory (default build-device)
#   QUICK=1    short mixes, for a smoke test
#   ALLOCATORS subset to run (default: gpumem cudaMallocAsync cudaMalloc torch torch_expandable)
# Needs: cmake, a C compiler, the CUDA toolkit (nvcc on PATH or CUDA_HOME),
# python3; torch (pip package) for the two torch rows, which are skipped
# when it is missing.  Prints the table last.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. bench/lib.sh
tdir="${1:-.device-traces}"
BUILD_DIR="${BUILD_DIR:-build-device}"
ALLOCATORS_SET="${ALLOCATORS:+1}"
ALLOCATORS="${ALLOCATORS:-gpumem cudaMallocAsync cudaMalloc torch torch_expandable}"
quick=()
[ "${QUICK:-0}" = 1 ] && quick=(--quick)
gm_workdir

gm_cuda_toolkit

echo "=== build gpumem ($BUILD_DIR)"
gm_build "$work/cmake.log" "$BUILD_DIR" gpumem_tools -DCMAKE_BUILD_TYPE=RelWithDebInfo || exit 1

echo "=== build alloc_bench"
bench="$BUILD_DIR/alloc_bench"
zl=-lz
grep -q 'GM_HAVE_ZLIB' "$BUILD_DIR/compile_commands.json" 2>/dev/null || zl=
${CC:-cc} -O2 -std=c11 -D_GNU_SOURCE -Wall -Wextra -Iinclude -Isrc -Itools -I"$cuda/include" \
    bench/alloc_bench.c "$BUILD_DIR/libgpumem_tools.a" "$BUILD_DIR/libgpumem.a" -L"$cudalib" -lcudart -Wl,-rpath,"$cudalib" \
    $zl -lpthread -ldl -lm -o "$bench" || { echo "alloc_bench build failed"; exit 1; }

shim=""
if [[ " $ALLOCATORS " == *" torch"* ]]; then
    echo "=== build torch shim"
    tinfo="$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.__version__, torch.version.cuda)' 2>/dev/null)"
    if [ -n "$tinfo" ]; then
        tdirp="$(sed -n 1p <<<"$tinfo")" abi="$(sed -n 2p <<<"$tinfo")"
        echo "torch $(sed -n 3p <<<"$tinfo") at $tdirp (cxx11 abi $abi)"
        shim="$PWD/$BUILD_DIR/libtorch_shim.so"
        for std in c++20 c++17; do
            if ${CXX:-g++} -O2 -std=$std -shared -fPIC -D_GLIBCXX_USE_CXX11_ABI="$abi" \
                -I"$tdirp/include" -I"$tdirp/include/torch/csrc/api/include" -I"$cuda/include" \
                bench/torch_shim.cpp -L"$tdirp/lib" -lc10_cuda -lc10 -Wl,-rpath,"$tdirp/lib" \
                -o "$shim" 2>"$work/shim-$std.log"; then
                echo "shim built with -std=$std"
                break
            fi
            head -n 30 "$work/shim-$std.log"
            shim=""
        done
    else
        echo "torch not found: the torch rows are skipped"
    fi
fi

echo "=== run"
parts=()
for a in $ALLOCATORS; do
    args=(--allocator "$a" --traces "$tdir" --json "$work/part-$a.json" "${quick[@]}")
    envs=()
    case $a in
    torch | torch_expandable)
        [ -n "$shim" ] || { echo "skip $a (no torch shim)"; continue; }
        args=(--allocator torch --name "$a" --torch-shim "$shim" --traces "$tdir" --json "$work/part-$a.json" "${quick[@]}")
        [ "$a" = torch_expandable ] && envs=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
        ;;
    esac
    start=$(date +%s)
    env "${envs[@]}" timeout --kill-after=5 180 "$bench" "${args[@]}" 2>&1 | tee "$work/log-$a.txt"
    st=${PIPESTATUS[0]}
    echo "--- $a: exit $st, $(($(date +%s) - start)) s"
    [ -f "$work/part-$a.json" ] && parts+=("$work/part-$a.json")
done

date="$(date -u +%Y-%m-%d)"
gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"
gpu="${gpu:-unknown-GPU}"
label="$(tr ' ' '-' <<<"$gpu")"
driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
# GM_COMMIT overrides the label (a copy of the tree without its git history).
commit="$(gm_commit_id)"
mkdir -p bench/results
base="bench/results/$date-$label-alloc"
cmdline="${ALLOCATORS_SET:+ALLOCATORS=\"$ALLOCATORS\" }${ALLOC_BENCH_THREAD_SLACK:+ALLOC_BENCH_THREAD_SLACK=$ALLOC_BENCH_THREAD_SLACK }${ALLOC_BENCH_THREAD_ROUNDS:+ALLOC_BENCH_THREAD_ROUNDS=$ALLOC_BENCH_THREAD_ROUNDS }${ALLOC_BENCH_THREAD_WARMUPS:+ALLOC_BENCH_THREAD_WARMUPS=$ALLOC_BENCH_THREAD_WARMUPS }${ALLOC_BENCH_PER_CPU:+ALLOC_BENCH_PER_CPU=$ALLOC_BENCH_PER_CPU }${ALLOC_BENCH_PIN:+ALLOC_BENCH_PIN=$ALLOC_BENCH_PIN }bench/run_alloc_bench.sh $tdir"
python3 - "$base" "$date" "$gpu" "$driver" "$commit" "$cmdline" "${parts[@]}" <<'PY'
import json, math, sys
base, date, gpu, driver, commit, cmdline, *parts = sys.argv[1:]
names = ["gpumem", "cudaMalloc", "cudaMallocAsync", "torch", "torch_expandable"]
P = {}
for p in parts:
    try:
        d = json.load(open(p))
        P[d["allocator"]] = d
    except Exception as e:  # a crashed process leaves no part or a partial one
        print("merge: cannot read", p, e, file=sys.stderr)
sizes = ["512B", "64KiB", "2MiB", "64MiB", "1GiB"]
traces = sorted({t for d in P.values() for t in d.get("trace_ratio", {})})
out = {
    "date": date, "gpu": gpu, "driver": driver, "commit": commit,
    "command": cmdline,
    "pair_ns": {a: P[a]["pair_ns"] for a in names if a in P},
    "mix_ns_per_op": {a: P[a]["mix_ns_per_op"] for a in names if a in P},
    "mix_p50_ns": {a: P[a].get("mix_p50_ns") for a in names if a in P},
    "mix_p99_ns": {a: P[a].get("mix_p99_ns") for a in names if a in P},
    "mix_ratio": {a: P[a]["mix_ratio"] for a in names if a in P},
    "trace_ratio": {a: P[a]["trace_ratio"] for a in names if a in P},
    "threads16_speedup": {a: P[a]["threads16_speedup"] for a in names if a in P},
    "threads16_speedup_first_round": {a: P[a].get("threads16_speedup_first_round") for a in names if a in P},
    "threads16_speedup_rounds": {a: P[a].get("threads16_speedup_rounds") for a in names if a in P},
    "threads16_speedup_warmups": {a: P[a].get("threads16_speedup_warmups") for a in names if a in P},
    "threads16_speedup_one_heap": P.get("gpumem", {}).get("threads16_speedup_one_heap"),
    "threads16_heaps": P.get("gpumem", {}).get("threads16_heaps"),
    "threads16_speedup_slack": P.get("gpumem", {}).get("threads16_speedup_slack"),
    "threads16_backend_calls": P.get("gpumem", {}).get("threads16_backend_calls"),
    "threads16_backend_calls_first_round": P.get("gpumem", {}).get("threads16_backend_calls_first_round"),
    "threads16_slack": P.get("gpumem", {}).get("threads16_slack"),
    "threads16_reserved_over_requested": P.get("gpumem", {}).get("threads16_reserved_over_requested"),
    "host_parallel_ceiling": {a: P[a].get("host_parallel_ceiling") for a in names if a in P},
    "host_parallel_ceiling_rounds": {a: P[a].get("host_parallel_ceiling_rounds") for a in names if a in P},
    "threads16_of_ceiling": {a: P[a].get("threads16_of_ceiling") for a in names if a in P},
    "threads16_of_ceiling_rounds": {a: P[a].get("threads16_of_ceiling_rounds") for a in names if a in P},
    "threads16_speedup_cpu_mean": {a: P[a].get("threads16_speedup_cpu_mean") for a in names if a in P},
    "host_parallel_ceiling_cpu_mean": {a: P[a].get("host_parallel_ceiling_cpu_mean") for a in names if a in P},
    "threads16_of_ceiling_cpu_mean": {a: P[a].get("threads16_of_ceiling_cpu_mean") for a in names if a in P},
    "steady_state_driver_calls": {a: P[a]["steady_state_driver_calls"] for a in names if a in P},
    "details": P,
}
json.dump(out, open(base + ".json", "w"), indent=1)

def f(v, fmt):
    return "—" if v is None else fmt.format(v)
def pct_down(v):  # a share, rounded down to 0.1 %: 0.89997 shows as 89.9 %, not 90 %
    return "—" if v is None else "{:.1f}%".format(math.floor(v * 1000) / 10)
def ns(v):
    if v is None: return "—"
    return "{:.0f}".format(v) if v >= 100 else "{:.1f}".format(v)
present = [a for a in names if a in P]
L = []
L.append(f"# Allocators side by side — {gpu}, {date}\n")
L.append(f"- command: `{cmdline}` (one `alloc_bench` process per allocator; torch twice, the second with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`)")
L.append(f"- code: commit {commit}; GPU {gpu}, driver {driver}; gpumem built RelWithDebInfo (-O2, GM_DEBUG=1)")
L.append("- mix p99: a third run of the same sequence with each op timed alone (the clock reads add to each op; not the ns/op run)")
L.append("- pair: median over 21 batches of the mean alloc+free pair time (2000 pairs per batch; cudaMalloc 5)")
L.append("- mix: 512 slots, log-uniform 256 B–64 MiB, one op = one alloc or one free, seed 12345; ns/op on the second (warm) run of the same sequence; ratio = reserved peak / requested-bytes peak of the first run from a trimmed allocator. cudaMalloc: 20 000 ops, one cold run, ratio 1.0 by definition")
L.append("- threads: 16 threads, each its own non-blocking stream and mix (100 000 ops; cudaMalloc 1 000), aggregate ops/s / one thread's ops/s; three untimed warm-up runs of each, then timed rounds (one thread alone, then 16), the median of the rounds' speedups (every round's, and the warm-ups', below the table; the second warm-up is what this bench reported before 2026-11-27); gpumem with `heaps = 16` (a heap per thread), and with its default of one heap in the line below the table")
L.append("- host ceiling: the same mix loop with the allocator taken out (200 rounds of each thread's sequence), 16 threads / 1 thread, measured in each allocator's process in every round of its leading thread run (gpumem: 16 heaps), just before the allocator's own runs; host ceiling = the median of the rounds; of ceiling = the median of each round's speedup over that round's ceiling")
L.append("- traces: reserved peak over 3 passes / trace live peak; cudaMalloc: 1 pass, peak of device memory in use (cudaMemGetInfo) above the start")
L.append("- steady calls: driver calls in passes 2..3, summed over the traces — " + "; ".join(f"{a}: {P[a]['steady_state_calls_label']}" for a in present))
L.append("")
hdr = ["allocator"] + [f"pair {s} ns" for s in sizes] + ["mix ns/op", "mix p99 ns", "mix ratio"] + [f"{t} ratio" for t in traces] + ["16-thread speedup", "host ceiling", "of ceiling", "steady calls"]
L.append("| " + " | ".join(hdr) + " |")
L.append("|---" + "|---:" * (len(hdr) - 1) + "|")
for a in present:
    d = P[a]
    row = [a] + [ns(d["pair_ns"].get(s)) for s in sizes]
    row += [ns(d["mix_ns_per_op"]), ns(d.get("mix_p99_ns")), f(d["mix_ratio"], "{:.3f}")]
    row += [f(d["trace_ratio"].get(t), "{:.3f}") for t in traces]
    row += [f(d["threads16_speedup"], "{:.2f}"), f(d.get("host_parallel_ceiling"), "{:.2f}"),
            pct_down(d.get("threads16_of_ceiling")), f(d["steady_state_driver_calls"], "{:.0f}")]
    L.append("| " + " | ".join(row) + " |")
L.append("\n16-thread speedup by round, and the host ceiling by round: " + "; ".join(
    f"{a}: " + " ".join(f(v, "{:.2f}") for v in (P[a].get("threads16_speedup_rounds") or []))
    + " (warm-ups " + " ".join(f(v, "{:.2f}") for v in (P[a].get("threads16_speedup_warmups") or [])) + "; ceiling "
    + " ".join(f(v, "{:.2f}") for v in (P[a].get("host_parallel_ceiling_rounds") or [])) + "; of ceiling "
    + " ".join(f(v, "{:.3f}") for v in (P[a].get("threads16_of_ceiling_rounds") or [])) + ", median "
    + f(P[a].get("threads16_of_ceiling"), "{:.4f}") + ")"
    for a in present))
if any(P[a].get("threads16_speedup_cpu_mean") for a in present):
    L.append("\nThe same 16-thread rates over one thread's mean rate on each of 16 CPUs (the one thread, and the ceiling loop's, run once on each CPU in every round, after the timed runs; 16 threads scaling perfectly would do the sum of those rates), medians of the rounds: " + "; ".join(
        f"{a}: speedup {f(P[a].get('threads16_speedup_cpu_mean'), '{:.2f}')}, host ceiling "
        + f"{f(P[a].get('host_parallel_ceiling_cpu_mean'), '{:.2f}')}, of ceiling {pct_down(P[a].get('threads16_of_ceiling_cpu_mean'))} (rounds "
        + " ".join(f(v, "{:.3f}") for v in (P[a].get("threads16_of_ceiling_cpu_mean_rounds") or [])) + ")"
        for a in present))
missing = [a for a in names if a not in P]
if missing:
    L.append("\nNot measured: " + ", ".join(missing))
L.append("\nsteady calls per trace: " + "; ".join(
    f"{a}: " + ", ".join(f"{t} {f(v, '{:.0f}')}" for t, v in P[a]["steady_state_driver_calls_by_trace"].items()) for a in present))
L.append("\nmix peaks: " + "; ".join(
    f"{a}: reserved {P[a]['mix_reserved_peak']/1e9:.3f} GB / requested {P[a]['mix_requested_peak']/1e9:.3f} GB"
    + (f" (vs the allocator's own allocated peak: {P[a]['mix_ratio_vs_own_allocated']:.3f})" if P[a].get('mix_ratio_vs_own_allocated') else "")
    for a in present))
L.append("\ndriver calls (or proxy) during the warm mix: " + "; ".join(
    f"{a}: {f(P[a].get('mix_warm_driver_calls'), '{:.0f}')}" for a in present))
if "gpumem" in P:
    g = P["gpumem"]
    bc = g.get("threads16_backend_calls") or {}
    L.append(f"\ngpumem 16 threads: {f(g.get('threads16_speedup'), '{:.2f}')}x with {g.get('threads16_heaps')} heaps "
             f"(median of the rounds; a timed run made {f(bc.get('heaps'), '{:.0f}')} backend calls, median), "
             f"{f(g.get('threads16_speedup_slack'), '{:.2f}')}x with 16 heaps and reserve slack {g.get('threads16_slack')} "
             f"({f(bc.get('heaps_slack'), '{:.0f}')} calls), "
             f"{f(g.get('threads16_speedup_one_heap'), '{:.2f}')}x with the default of one heap ({f(bc.get('one_heap'), '{:.0f}')} calls)")
    bf = g.get("threads16_backend_calls_first_round") or {}
    L.append(f"\ngpumem 16 heaps, first timed round: {f(g.get('threads16_speedup_first_round'), '{:.2f}')}x "
             f"({f(bf.get('heaps'), '{:.0f}')} backend calls); warm-up runs: "
             + " ".join(f(v, "{:.2f}") for v in (g.get("threads16_speedup_warmups") or [])))
    rr = g.get("threads16_reserved_over_requested") or {}
    L.append(f"\ngpumem 16 threads, the pool's reserved peak over the threads' requested peaks summed: "
             f"{f(rr.get('heaps'), '{:.3f}')} with 16 heaps, {f(rr.get('heaps_slack'), '{:.3f}')} with slack "
             f"{g.get('threads16_slack')}, {f(rr.get('one_heap'), '{:.3f}')} with one heap")
    L.append(f"\ngpumem backend calls by kind — warm mix: {g.get('gpumem_mix_warm_calls_by_kind') or 'none'} "
             f"({f(g.get('gpumem_mix_warm_backend_ms'), '{:.1f}')} ms inside the backend); steady passes: "
             + "; ".join(f"{t}: {v or 'none'}" for t, v in g.get("gpumem_steady_calls_by_kind", {}).items()))
open(base + ".md", "w").write("\n".join(L) + "\n")
PY
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    cp "$base.md" "$base.json" "$OUT/" 2>/dev/null
    cat "$work"/log-*.txt >"$OUT/alloc-bench-logs.txt" 2>/dev/null
fi
echo
cat "$base.md"

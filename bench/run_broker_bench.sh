#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/run_broker_bench.sh — run the broker benchmark (bench/broker_bench.c:
# `gpumem broker` with real processes — quota overshoot under 32 racing
# clients, lease latency warm and cold, reclaim after kill -9, steady
# alloc+free with and without the broker) and, where PyTorch sees a GPU,
# scripts/device/plugins/broker_torch.py (training under a broker's quota:
# losses bit-identical to a run without it, the tenant's peak, a clean OOM
# over a too-small quota); merge both into bench/results/DATE-GPU-broker.
# {json,md} and print the summary.
#
# usage: bench/run_broker_bench.sh            (from anywhere)
# Environment:
#   BUILD_DIR  a gpumem build that has bench/broker_bench, the gpumem CLI and
#              libgpumem.so (default build; `make` makes them).  This script
#              builds nothing.
#   OUT        also copy the results and the logs there (default: none; off
#              the cuda backend the results go to OUT, else BUILD_DIR/bench-results)
#   QUICK=1    fewer runs (broker_bench --quick)
#   TORCH=0|1  skip / insist on the PyTorch part (default: run it when the
#              bench ran on cuda and PyTorch sees a GPU)
#   PYTHON     python3 (default)
#   GM_COMMIT  the commit recorded (default: HEAD's short hash, +changes when the tree differs; bench/commit_id.sh)
#   BENCH_TIMEOUT, TORCH_TIMEOUT  seconds for each part (120, 120); broker_bench
#              skips a part that might not end 20 s before its timeout, and
#              broker_torch.py a run that would not end 10 s before its own
# The bench runs with GPUMEM_BACKEND as given (unset: auto, cuda where an
# NVIDIA driver is installed; GPUMEM_BACKEND=sim for the sim).  Results of
# another backend than cuda never go to bench/results.  About 2 minutes on
# a GPU machine; at most BENCH_TIMEOUT + TORCH_TIMEOUT seconds.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. bench/lib.sh
gm_default BUILD_DIR="build" PYTHON="python3" QUICK="0" TORCH="auto" BENCH_TIMEOUT="120" \
    TORCH_TIMEOUT="120"
gm_workdir

bench="$BUILD_DIR/bench/broker_bench"
cli="$BUILD_DIR/gpumem"
lib="$BUILD_DIR/libgpumem.so"
missing=()
for f in "$bench" "$cli"; do [ -x "$f" ] || missing+=("$f"); done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "FAILED: ${missing[*]} missing: build first (make, or cmake --build $BUILD_DIR --target" \
         "broker_bench gpumem_cli gpumem_shared)"
    exit 1
fi
command -v "$PYTHON" >/dev/null || { echo "FAILED: no $PYTHON (needed to merge the results)"; exit 1; }

gm_banner "open files limit $(ulimit -n) (hard $(ulimit -Hn)); backend ${GPUMEM_BACKEND:-auto}"

GM_COMMIT="$(gm_commit_id)"
export GM_COMMIT
command="bench/run_broker_bench.sh"
args=()
if [ "$QUICK" = 1 ]; then
    command="QUICK=1 $command"
    args+=(--quick)
fi
[ -n "${GPUMEM_BACKEND:-}" ] && command="GPUMEM_BACKEND=$GPUMEM_BACKEND $command"

gm_run_bench broker_bench "$work/broker" env -u GPUMEM_BROKER -u GPUMEM_LIMIT \
    timeout --kill-after=10 "$BENCH_TIMEOUT" "$bench" --json "$work/broker.json" --md "$work/broker.md" \
    --command "$command" --deadline "$((BENCH_TIMEOUT - 20))" ${args[@]+"${args[@]}"}
backend="$(gm_json "$work/broker.json" 'd.get("backend") or ""')"

# ---- PyTorch ------------------------------------------------------------------------
tst=0
torch_why=""
if [ "$TORCH" = 0 ]; then
    torch_why="TORCH=0"
elif [ "$TORCH" != 1 ] && [ "$backend" != cuda ]; then
    torch_why="the bench ran on the '${backend:-unknown}' backend (TORCH=1 runs it anyway)"
elif ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    torch_why="PyTorch with CUDA is not available to $PYTHON"
elif [ ! -f "$lib" ]; then
    torch_why="no $lib (build gpumem_shared)"
fi
if [ -z "$torch_why" ]; then
    echo "=== broker_torch.py"
    start=$(date +%s)
    env -u GPUMEM_BROKER -u GPUMEM_LIMIT GPUMEM_CLI="$(cd "$(dirname "$cli")" && pwd)/gpumem" \
        GPUMEM_LIBRARY="$(cd "$BUILD_DIR" && pwd)/libgpumem.so" \
        PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" \
        timeout --kill-after=10 "$TORCH_TIMEOUT" "$PYTHON" scripts/device/plugins/broker_torch.py \
        --out "$work/torch.json" --budget "$((TORCH_TIMEOUT - 10))" >"$work/torch-log.txt" 2>&1
    tst=$?
    tail -n 5 "$work/torch-log.txt"
    echo "--- broker_torch.py: exit $tst, $(($(date +%s) - start)) s"
    [ -f "$work/torch.json" ] || echo '{"torch_error": "broker_torch.py wrote no results (exit '"$tst"'): see the log"}' >"$work/torch.json"
    [ "$tst" = 0 ] || echo "WARNING: broker_torch.py failed (exit $tst): see torch_errors and the log"
else
    echo "=== broker_torch.py skipped: $torch_why"
    "$PYTHON" -c 'import json, sys; json.dump({"torch_skipped": sys.argv[1]}, open(sys.argv[2], "w"))' \
        "$torch_why" "$work/torch.json"
fi

# ---- merge --------------------------------------------------------------------------
"$PYTHON" - "$work/broker.json" "$work/broker.md" "$work/torch.json" <<'EOF' || { echo "FAILED: merging the results"; exit 1; }
import json, sys
jpath, mpath, tpath = sys.argv[1:4]
d = json.load(open(jpath))
try:
    t = json.load(open(tpath))
except (OSError, ValueError) as e:
    t = {"torch_error": "unreadable torch results: %s" % e}
for k, v in t.items():
    d[k if k.startswith("torch_") else "torch_" + k] = v
goals, meets = d.setdefault("goals", {}), d.setdefault("meets", {})
if "torch_skipped" not in t and "torch_losses_identical" in t:
    goals["torch_losses_identical"] = True
    goals["torch_over_quota_error"] = True
    meets["torch_losses_identical"] = bool(t.get("torch_losses_identical"))
    meets["torch_over_quota_error"] = bool(t.get("torch_over_quota_error"))
json.dump(d, open(jpath, "w"), indent=1)

def yes(v):
    return "—" if v is None else "yes" if v else "NO"

def ms(v):
    return "—" if v is None else "%.2f" % v

def mib(v):
    return "—" if v is None else "%.1f MiB" % (v / 2**20)

with open(mpath, "a") as md:
    md.write("## PyTorch under the broker\n\n")
    if "torch_skipped" in t:
        md.write("Not run: %s.\n" % t["torch_skipped"])
    elif "torch_losses_identical" not in t:
        md.write("Failed: %s\n" % (t.get("torch_error") or "; ".join(t.get("torch_errors") or []) or "no results"))
    else:
        md.write("- command: `%s`; PyTorch %s (CUDA %s), %s; model %s, %s layers, batch %s x %s tokens, "
                 "%s steps of AdamW, seeds fixed, torch.use_deterministic_algorithms(True, warn_only=True); "
                 "each run a fresh process with gpumem.torch.enable(); the broker: `gpumem broker --config`, "
                 "started and stopped by the script, tenant quota %s\n\n"
                 % (t.get("torch_command"), t.get("torch_version"), t.get("torch_cuda"), t.get("torch_gpu"),
                    t.get("torch_model"), t.get("torch_layers"), t.get("torch_batch"), t.get("torch_seq"),
                    t.get("torch_steps"), mib(t.get("torch_quota_bytes"))))
        md.write("| figure | value | goal | met |\n|---|---:|---:|:---:|\n")
        md.write("| torch_losses_identical (broker vs no broker, every step) | %s | true | %s |\n"
                 % (t.get("torch_losses_identical"), yes(t.get("torch_losses_identical"))))
        md.write("| median step ms, steps 5+ (broker; no broker) | %s; %s | | |\n"
                 % (ms(t.get("torch_median_step_ms_broker")), ms(t.get("torch_median_step_ms_local"))))
        md.write("| the tenant's peak by the broker's books (quota %s) | %s | | |\n"
                 % (mib(t.get("torch_quota_bytes")), mib(t.get("torch_tenant_peak_bytes"))))
        md.write("| gpumem reserved_peak (broker; no broker) | %s; %s | | |\n"
                 % (mib(t.get("torch_reserved_peak_broker")), mib(t.get("torch_reserved_peak_local"))))
        md.write("| torch_over_quota_error (quota %s: a clean OOM) | %s | true | %s |\n\n"
                 % (mib(t.get("torch_small_quota_bytes")), t.get("torch_over_quota_error"),
                    yes(t.get("torch_over_quota_error"))))
        if t.get("torch_over_quota_exception"):
            md.write("Over the small quota: %s at %s: %s (CUDA works after: %s).\n"
                     % (t.get("torch_over_quota_exception"), t.get("torch_over_quota_phase"),
                        t.get("torch_over_quota_message"), t.get("torch_over_quota_cuda_works_after")))
        elif t.get("torch_over_quota_note"):
            md.write("Over the small quota: %s\n" % t["torch_over_quota_note"])
        if t.get("torch_errors"):
            md.write("\nFailures:\n\n" + "".join("- %s\n" % e for e in t["torch_errors"]))
    md.write("\n")
EOF

# ---- where the results go -----------------------------------------------------------
gm_publish broker "$work/broker" "$work/log.txt"
if [ -n "${OUT:-}" ]; then
    [ -f "$work/torch-log.txt" ] && cp "$work/torch-log.txt" "$OUT/broker-torch-log.txt"
fi

echo
echo "=== $base.md"
cat "$base.md"
echo "=== summary"
"$PYTHON" - "$base.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
m = d.get("meets", {})
def show(key, unit=""):
    v = d.get(key)
    met = m.get(key)
    print("%-26s %s%s%s" % (key, json.dumps(v), unit, "" if met is None else "  (goal met)" if met else "  (GOAL NOT MET)"))
for k, u in (("quota_overshoot_bytes", " B"), ("clients", ""), ("lease_us", " µs"), ("lease_p90_us", " µs"),
             ("lease_cold_us", " µs"), ("reclaim_ms", " ms"), ("reclaim_max_ms", " ms"),
             ("steady_alloc_ns", " ns"), ("steady_alloc_ns_local", " ns"), ("steady_alloc_no_slower", ""),
             ("torch_losses_identical", ""), ("torch_tenant_peak_bytes", " B"), ("torch_over_quota_error", "")):
    if k in d:
        show(k, u)
if "torch_skipped" in d:
    print("torch: skipped (%s)" % d["torch_skipped"])
print("errors: %d%s" % (len(d.get("errors", [])) + len(d.get("torch_errors", []) or []),
                        "".join("\n  " + e for e in d.get("errors", []) + (d.get("torch_errors") or []))))
EOF
[ "$st" = 0 ] && [ "$tst" = 0 ]

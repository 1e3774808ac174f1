#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/behaviour_check.sh — the figures a change that promises "no behaviour
# change" is checked against, measured on the sim backend (no GPU needed), and
# the comparison of two such measurements.
#
# usage:
#   bench/behaviour_check.sh measure GPUMEM_CLI TRACE_DIR [-o OUT.json]
#   bench/behaviour_check.sh compare BEFORE.json AFTER.json [--tolerance PCT]
#   bench/behaviour_check.sh check GPUMEM_CLI TRACE_DIR BEFORE.json [-o AFTER.json]
#
# measure: for every *.csv / *.csv.gz in TRACE_DIR and every kind that
#   `gpumem help synth` lists (written by `gpumem synth KIND --seed 1`), runs
#   `gpumem replay --backend sim --repeat 3 --json` and keeps, per workload,
#   everything the replay reports except its timings (*ns_per_op): ops, live
#   and reserved peak, ratio, backend calls by kind, steady_backend_calls (calls
#   in passes 2..3), failed allocations and trace-bug counters, modeled device
#   time, plus a SHA-256 of the trace's uncompressed text.  Then it counts
#   instructions with callgrind on two small programs built from this folder
#   against the library of the CLI's build (libgpumem.a next to the CLI, the
#   header from the source folder that build names; same compiler, LTO in one
#   partition when the build used LTO):
#     pair_ops.c  alloc+free pairs of 512 B, 64 KiB, 2 MiB, 64 MiB and 1 GiB
#                 (alloc_bench's sizes) on one stream: a run of 1 000 pairs
#                 subtracted from one of 101 000 (64 MiB: 11 000, 1 GiB:
#                 3 000), over the difference, so start-up and pool creation
#                 cancel;
#     sim_mix.c   alloc_bench's random mix (seed 12345, 400 000 ops; one op is
#                 one alloc or one free): 3 passes minus 2, i.e. one warm pass.
#   Start-up varies by up to ~50 000 instructions from run to run (the tick
#   calibration busy-waits 1 ms); over these differences that moves a figure
#   by under 0.2 %.
#   Every GPUMEM_* variable of the caller's environment is unset first; the
#   callgrind runs set GPUMEM_SIM_CAPACITY=8GiB.  The JSON goes to OUT.json
#   (default: stdout).  Needs python3, valgrind, and the CLI's build to hold
#   libgpumem.a (cmake --build BUILD --target gpumem_cli gpumem_static).
# compare: exit 1 when any workload's ratio, peaks, op count, call count (by
#   kind, total, steady) or failure counter differs, when a workload or trace
#   of BEFORE is missing or its trace text differs, when the mix's calls per
#   pass differ, or when instructions per pair or per mix operation rise by
#   more than PCT % (default 2).  Differences that do not fail (modeled device
#   time: the sim's cost model, not the allocator; new keys or workloads;
#   another compiler, valgrind or driver program) are printed as notes.
# check: measure, then compare with BEFORE.json.
#
# Keep the machine's other users in mind: run it under `nice`.  It takes about
# a minute on one core (callgrind runs most of it).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
prog=bench/behaviour_check.sh
PAIR_RUNS="512:1000:101000 65536:1000:101000 2097152:1000:101000 67108864:1000:11000 1073741824:1000:3000"
MIX_OPS=400000
MIX_SEED=12345
SIM_CAPACITY=8GiB
REPEAT=3
SYNTH_SEED=1

usage() {
    sed -n '/^# usage:/,/^#$/p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
die() { echo "$prog: $*" >&2; exit 1; }

# ---- compare ------------------------------------------------------------------------
compare() {
    local before=$1 after=$2 tol=$3
    python3 - "$before" "$after" "$tol" <<'PY'
import json, sys
bpath, apath, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
b, a = json.load(open(bpath)), json.load(open(apath))
fails, notes = [], []
INFO_KEYS = {"modeled_device_ms"}   # the sim's cost model, not the allocator's behaviour

print("before: %s (commit %s, %s)" % (bpath, b.get("commit"), b.get("date")))
print("after:  %s (commit %s, %s)" % (apath, a.get("commit"), a.get("date")))

def flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, prefix + k + "."))
        else:
            out[prefix + k] = v
    return out

bw, aw = b["replay"]["workloads"], a["replay"]["workloads"]
for name in bw:
    if name not in aw:
        fails.append("%s: workload missing after" % name)
        continue
    fb, fa = flat(bw[name]), flat(aw[name])
    if fb.get("trace_sha256") != fa.get("trace_sha256"):
        fails.append("%s: the trace itself differs (sha256 of its text): not the same input" % name)
    for k in sorted(set(fb) | set(fa)):
        if k == "trace_sha256":
            continue
        if k not in fa:
            fails.append("%s: %s missing after (was %r)" % (name, k, fb[k]))
        elif k not in fb:
            # a call kind at 0 before may simply not have been printed
            if k.startswith("backend_calls.") and fa[k] == 0:
                continue
            (fails if k.startswith("backend_calls.") else notes).append(
                "%s: %s new after: %r" % (name, k, fa[k]))
        elif fb[k] != fa[k]:
            (notes if k.split(".")[-1] in INFO_KEYS else fails).append(
                "%s: %s %r -> %r" % (name, k, fb[k], fa[k]))
for name in aw:
    if name not in bw:
        notes.append("%s: workload new after (not compared)" % name)

cb, ca = b.get("callgrind"), a.get("callgrind")
if cb and not ca:
    fails.append("callgrind: no instruction counts after")
elif cb and ca:
    for k in ("compiler", "cflags", "valgrind"):
        if cb.get(k) != ca.get(k):
            notes.append("callgrind: %s differs (%r -> %r): instruction counts move with it" %
                         (k, cb.get(k), ca.get(k)))
    for k in sorted(set(cb.get("driver_sha256", {})) | set(ca.get("driver_sha256", {}))):
        if cb.get("driver_sha256", {}).get(k) != ca.get("driver_sha256", {}).get(k):
            notes.append("callgrind: the driver program %s differs" % k)
    def per_op(what, x, y):
        if y is None:
            fails.append("callgrind: %s missing after" % what)
            return
        pct = (y - x) / x * 100.0
        line = "callgrind: %s %.1f -> %.1f instructions (%+.2f %%)" % (what, x, y, pct)
        print(line)
        if pct > tol:
            fails.append(line + ", more than %+g %%" % tol)
    for size, v in cb["pair"].items():
        per_op("per alloc+free pair of %s B" % size, v["ir_per_pair"],
               ca.get("pair", {}).get(size, {}).get("ir_per_pair"))
    per_op("per mix operation", cb["mix"]["ir_per_op"], ca.get("mix", {}).get("ir_per_op"))
    pb, pa = cb["mix"].get("pass_calls"), ca.get("mix", {}).get("pass_calls")
    if pb != pa:
        fails.append("mix: backend calls per pass differ: %r -> %r" % (pb, pa))

print("replay: %d workloads before, %d after" % (len(bw), len(aw)))
for n in notes:
    print("note: " + n)
for f in fails:
    print("DIFFERS: " + f)
print("%s: %d difference(s) that fail, %d note(s)" % ("FAIL" if fails else "SAME", len(fails), len(notes)))
sys.exit(1 if fails else 0)
PY
}

# ---- measure ------------------------------------------------------------------------
cache_get() { sed -n "s/^$1:[A-Z]*=//p" "$2" | head -n1; }

callgrind_ir() { # OUTFILE CMD... : prints the instruction count of one run
    local out=$1
    shift
    valgrind --tool=callgrind --callgrind-out-file="$out" "$@" >"$out.stdout" 2>"$out.log" ||
        { cat "$out.log" >&2; die "callgrind run failed: $*"; }
    awk '/^(summary|totals):/ { print $2; exit }' "$out"
}

measure() {
    local cli=$1 tdir=$2 out=$3
    [ -x "$cli" ] || die "$cli: not an executable (the gpumem CLI of a build)"
    [ -d "$tdir" ] || die "$tdir: not a folder of traces"
    command -v python3 >/dev/null || die "needs python3"
    command -v valgrind >/dev/null || die "needs valgrind (callgrind)"
    cli=$(cd "$(dirname "$cli")" && pwd)/$(basename "$cli")
    local build cache src lib cc
    build=$(dirname "$cli")
    cache=$build/CMakeCache.txt
    [ -f "$cache" ] || die "$build: no CMakeCache.txt: the CLI must sit in its cmake build folder"
    src=$(cache_get gpumem_SOURCE_DIR "$cache")
    lib=$build/libgpumem.a
    [ -f "$lib" ] || die "$lib missing: cmake --build $build --target gpumem_static"
    [ -f "$src/include/gpumem.h" ] || die "$src/include/gpumem.h missing (source folder of $build)"
    cc=$(cache_get CMAKE_C_COMPILER "$cache")
    local cflags=(-O2 -g) libs=(-lm -lpthread -ldl)
    if [ "$(cache_get GM_LTO "$cache")" = ON ] && [ "$(cache_get GM_HAVE_LTO "$cache")" = 1 ]; then
        # One partition: where -flto=auto cuts the library into partitions
        # moves with code added anywhere in it, and with it what is inlined on
        # the hot path (+4 % per 64 MiB pair from an options.c change once).
        cflags+=(-flto=auto -flto-partition=one)
    fi
    [ "$(cache_get GM_HAVE_ZLIB "$cache")" = 1 ] && libs+=(-lz)

    # The options come from the command line and the lines below, never from the caller.
    local v
    for v in $(compgen -e | grep '^GPUMEM_' || true); do unset "$v"; done

    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT

    # -- the workloads
    local traces=() f k kinds=()
    for f in "$tdir"/*.csv "$tdir"/*.csv.gz; do [ -f "$f" ] && traces+=("$f"); done
    mapfile -t kinds < <("$cli" help synth | awk '/^kinds:/ { on = 1; next } on && NF == 0 { exit } on { print $1 }')
    [ ${#kinds[@]} -gt 0 ] || die "\`$cli help synth\` lists no kinds"
    mkdir "$work/synth"
    for k in "${kinds[@]}"; do
        "$cli" synth "$k" --seed "$SYNTH_SEED" -o "$work/synth/$k.csv.gz" 2>/dev/null ||
            die "gpumem synth $k failed"
        traces+=("$work/synth/$k.csv.gz")
    done
    echo "$prog: replaying ${#traces[@]} workloads (--repeat $REPEAT)" >&2
    "$cli" replay --backend sim --repeat "$REPEAT" --json "${traces[@]}" >"$work/replay.jsonl"

    # -- instructions
    echo "$prog: building the callgrind programs against $lib" >&2
    "$cc" "${cflags[@]}" -I"$src/include" -I"$here" "$here/pair_ops.c" "$lib" "${libs[@]}" \
        -o "$work/pair_ops"
    "$cc" "${cflags[@]}" -I"$src/include" -I"$here" "$here/sim_mix.c" "$lib" "${libs[@]}" \
        -o "$work/sim_mix"
    local run size nlo nhi lo hi cg="$work/cg.tsv"
    : >"$cg"
    for run in $PAIR_RUNS; do
        IFS=: read -r size nlo nhi <<<"$run"
        echo "$prog: callgrind pair_ops --size $size --pairs $nlo and $nhi" >&2
        lo=$(GPUMEM_SIM_CAPACITY=$SIM_CAPACITY callgrind_ir "$work/cg" "$work/pair_ops" --size "$size" --pairs "$nlo")
        hi=$(GPUMEM_SIM_CAPACITY=$SIM_CAPACITY callgrind_ir "$work/cg" "$work/pair_ops" --size "$size" --pairs "$nhi")
        printf 'pair\t%s\t%s\t%s\t%s\t%s\n' "$size" "$nlo" "$nhi" "$lo" "$hi" >>"$cg"
    done
    echo "$prog: callgrind sim_mix --ops $MIX_OPS --passes 2 and 3" >&2
    lo=$(GPUMEM_SIM_CAPACITY=$SIM_CAPACITY callgrind_ir "$work/cg" "$work/sim_mix" --ops $MIX_OPS --passes 2 --seed $MIX_SEED)
    hi=$(GPUMEM_SIM_CAPACITY=$SIM_CAPACITY callgrind_ir "$work/cg" "$work/sim_mix" --ops $MIX_OPS --passes 3 --seed $MIX_SEED)
    cp "$work/cg.stdout" "$work/mix3.txt"
    printf 'mix\t%s\t2\t3\t%s\t%s\n' $MIX_OPS "$lo" "$hi" >>"$cg"

    local commit
    # shellcheck disable=SC1091
    commit=$(cd "$src" && . "$here/commit_id.sh" && gm_commit_id)
    local cmdline="$prog measure BUILD/gpumem TRACE_DIR"
    python3 - "$work" "$cli" "$commit" "$cmdline" "$here" "$cc" "$REPEAT" "$SYNTH_SEED" \
        "$SIM_CAPACITY" "${cflags[*]}" "${kinds[@]}" >"$work/out.json" <<'PY'
import gzip, hashlib, json, os, platform, re, subprocess, sys, time
work, cli, commit, cmdline, here, cc, repeat, seed, cap, cflags = sys.argv[1:11]
kinds = sys.argv[11:]

def text_sha256(path):
    opener = gzip.open if path.endswith(".gz") else open
    h = hashlib.sha256()
    with opener(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

def first_line(cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
        return (r.stdout or r.stderr).splitlines()[0].strip()
    except (OSError, IndexError):
        return None

synth_dir = os.path.join(work, "synth")
workloads = {}
for line in open(os.path.join(work, "replay.jsonl")):
    if not line.strip():
        continue
    d = json.loads(line)
    path = d.pop("trace")
    base = re.sub(r"\.csv(\.gz)?$", "", os.path.basename(path))
    if os.path.dirname(path) == synth_dir:
        name = "synth/" + base
        source = "gpumem synth %s --seed %s" % (base, seed)
    else:
        name, source = base, os.path.basename(path)
    for k in [k for k in d if k.endswith("ns_per_op")]:
        del d[k]                      # timings: they vary from run to run
    d["backend_calls_total"] = sum(d.get("backend_calls", {}).values())
    d["source"] = source
    d["trace_sha256"] = text_sha256(path)
    workloads[name] = d

pair, mix = {}, None
for line in open(os.path.join(work, "cg.tsv")):
    f = line.split()
    if f[0] == "pair":
        size, lo, hi, ilo, ihi = f[1], int(f[2]), int(f[3]), int(f[4]), int(f[5])
        pair[size] = {"pairs": [lo, hi], "instructions": [ilo, ihi],
                      "ir_per_pair": round((ihi - ilo) / (hi - lo), 2)}
    else:
        ops, plo, phi, ilo, ihi = int(f[1]), int(f[2]), int(f[3]), int(f[4]), int(f[5])
        mix = {"ops_per_pass": ops, "passes": [plo, phi], "instructions": [ilo, ihi],
               "ir_per_op": round((ihi - ilo) / ((phi - plo) * ops), 2)}
# The mix's backend calls per pass (exact on the sim), from sim_mix's lines.
calls = []
for line in open(os.path.join(work, "mix3.txt")):
    m = re.search(r"calls (.*) total=(\d+)", line)
    if m:
        calls.append(dict(kv.split("=") for kv in m.group(1).split()) | {"total": m.group(2)})
mix["pass_calls"] = [{k: int(v) for k, v in c.items()} for c in calls]

drivers = {}
for n in ("pair_ops.c", "sim_mix.c", "mix.h"):
    with open(os.path.join(here, n), "rb") as f:
        drivers[n] = hashlib.sha256(f.read()).hexdigest()[:16]

out = {
    "what": "behaviour check: gpumem replay figures and callgrind instructions (bench/behaviour_check.sh)",
    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "commit": commit,
    "backend": "sim",
    "gpu": "sim",
    "machine": "%s %s, %d cores, %s" % (platform.system(), platform.machine(), os.cpu_count() or 0,
                                         next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                                               if l.startswith("model name")), "?")),
    "command": cmdline,
    "replay": {
        "command": "gpumem replay --backend sim --repeat %s --json TRACE..." % repeat,
        "synth_kinds": kinds,
        "workloads": workloads,
    },
    "callgrind": {
        "command": "GPUMEM_SIM_CAPACITY=%s valgrind --tool=callgrind PROGRAM; the difference of two "
                   "operation counts over their difference" % cap,
        "compiler": first_line([cc, "--version"]),
        "cflags": cflags + " (the library as its build made it)",
        "valgrind": first_line(["valgrind", "--version"]),
        "driver_sha256": drivers,
        "pair": pair,
        "mix": mix,
    },
}
json.dump(out, sys.stdout, indent=1, sort_keys=False)
sys.stdout.write("\n")
PY
    if [ -n "$out" ]; then
        cp "$work/out.json" "$out"
        echo "$prog: wrote $out" >&2
    else
        cat "$work/out.json"
    fi
}

# ---- command line -------------------------------------------------------------------
[ $# -ge 1 ] || usage
mode=$1
shift
out="" tol=2 args=()
while [ $# -gt 0 ]; do
    case "$1" in
    -o) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
    --tolerance) [ $# -ge 2 ] || usage; tol=$2; shift 2 ;;
    -h|--help) usage ;;
    -*) echo "$prog: unknown option $1" >&2; usage ;;
    *) args+=("$1"); shift ;;
    esac
done
case "$mode" in
measure)
    [ ${#args[@]} -eq 2 ] || usage
    measure "${args[0]}" "${args[1]}" "$out" ;;
compare)
    [ ${#args[@]} -eq 2 ] || usage
    compare "${args[0]}" "${args[1]}" "$tol" ;;
check)
    [ ${#args[@]} -eq 3 ] || usage
    [ -f "${args[2]}" ] || die "${args[2]}: no such file"
    [ -n "$out" ] || out=$(mktemp --suffix=.json)
    measure "${args[0]}" "${args[1]}" "$out"
    compare "${args[2]}" "$out" "$tol" ;;
*) usage ;;
esac

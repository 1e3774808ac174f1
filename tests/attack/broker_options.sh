#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `gpumem broker` options and config paths: every bad option value is refused
# with exit 2 and a message naming the option, the bad value and what is
# accepted (before, each said "a bad option value (--socket is an absolute
# path)"); a config path that is not a regular file (a FIFO, a directory, a
# device) is refused at once, naming the path and what it is (before, a FIFO
# hung --check until a writer came and a directory said "no socket").
# Every run is under `timeout`, so a hang fails instead of stalling the suite.
# usage: broker_options.sh GPUMEM [unused]
set -u
gpumem=$1
dir=$(mktemp -d "${TMPDIR:-/tmp}/gmbopt.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
fail=0
export GPUMEM_MONITOR_DIR=$dir  # no process rows in metrics

# refused WHAT WANT... -- ARGS: exit 2 and every WANT (fixed strings) in the message.
refused() {
    local what=$1; shift
    local want=()
    while [ "$1" != "--" ]; do want+=("$1"); shift; done
    shift
    out=$(timeout 20 "$gpumem" broker "$@" 2>&1 </dev/null); rc=$?
    if [ $rc != 2 ]; then echo "FAIL: $what: exit $rc (want 2), said: $out"; fail=1; return; fi
    for w in "${want[@]}"; do
        grep -qF -- "$w" <<<"$out" || { echo "FAIL: $what: no '$w' in: $out"; fail=1; }
    done
    grep -qF "a bad option value" <<<"$out" && { echo "FAIL: $what: the old catch-all message: $out"; fail=1; }
}

s=(--socket "$dir/b.sock" --check)
refused "--capacity abc" "--capacity" "'abc'" "GiB" -- "${s[@]}" --capacity abc
refused "--capacity none" "--capacity" "'none'" "GiB" -- "${s[@]}" --capacity none
refused "--capacity=-1" "--capacity" "'-1'" -- "${s[@]}" --capacity=-1
refused "--device x" "--device" "'x'" "0 to" -- "${s[@]}" --device x
refused "--device -1" "--device" "'-1'" "0 to" -- "${s[@]}" --device -1
refused "--device 99999" "--device" "'99999'" "0 to" -- "${s[@]}" --device 99999
refused "--backend gpu" "--backend" "'gpu'" "auto" "sim" "cuda" -- "${s[@]}" --backend gpu
refused "--default-quota lots" "--default-quota" "'lots'" "none" -- "${s[@]}" --default-quota lots
refused "--socket relative" "--socket" "'rel.sock'" "absolute" -- --socket rel.sock --check
long=/$(head -c 200 /dev/zero | tr '\0' s)
refused "--socket too long" "--socket" "absolute" "107" -- --socket "$long" --check
refused "--stats-file too long" "--stats-file" -- "${s[@]}" --stats-file "/$(head -c 5000 /dev/zero | tr '\0' f)"
# The same values in a config file: the file, the line, the key, the value and what is accepted.
printf 'socket = %s\ncapacity = lots\n' "$dir/b.sock" >"$dir/v.conf"
refused "capacity = lots" "v.conf:2" "'lots'" "capacity" "GiB" -- --config "$dir/v.conf" --check
printf 'socket = %s\nbackend = gpu\n' "$dir/b.sock" >"$dir/v.conf"
refused "backend = gpu" "v.conf:2" "'gpu'" "auto, sim or cuda" -- --config "$dir/v.conf" --check
printf 'socket = %s\nscrub = sometimes\n' "$dir/b.sock" >"$dir/v.conf"
refused "scrub = sometimes" "v.conf:2" "'sometimes'" "tenant, always or never" -- --config "$dir/v.conf" --check

# Tenant names: [A-Za-z0-9._-], 1 to 63 characters, refused otherwise with the
# file and line, and the bad name shown without its raw bytes.
tname() { # what name ok|bad
    printf 'socket = %s\n# a comment\n[tenant %s]\nquota = 1GiB\n' "$dir/b.sock" "$2" >"$dir/t.conf"
    out=$(timeout 20 "$gpumem" broker --config "$dir/t.conf" --check 2>&1); rc=$?
    if [ "$3" = ok ]; then
        [ $rc = 0 ] || { echo "FAIL: tenant name $1 refused: $out"; fail=1; }
        return
    fi
    [ $rc = 2 ] && grep -q "t.conf:3: " <<<"$out" ||
        { echo "FAIL: tenant name $1: exit $rc, said: $(printf %q "$out")"; fail=1; }
    LC_ALL=C grep -q '[^[:print:]]' <<<"$out" &&
        { echo "FAIL: tenant name $1: raw bytes in the message: $(printf %q "$out")"; fail=1; }
}
tname "with an escape sequence" $'a\e[31mred' bad
tname "with a quote" 'a"b' bad
tname "with a backslash" 'a\b' bad
tname "with braces" 'x}{y' bad
tname "with a byte over 127" $'caf\xc3\xa9' bad
tname "with DEL" $'a\x7fb' bad
tname "of 64 characters" "$(head -c 64 /dev/zero | tr '\0' a)" bad
tname "named uid:N" 'uid:7' bad
tname "of 63 characters" "$(head -c 63 /dev/zero | tr '\0' a)" ok
tname "of letters, digits, - _ ." 'Team-1_a.b' ok

# Config paths that are not regular files.
mkfifo "$dir/fifo" || exit 1
refused "--config FIFO --check" "$dir/fifo" "FIFO" "not a regular file" -- --config "$dir/fifo" --check
refused "--config FIFO" "$dir/fifo" "FIFO" -- --config "$dir/fifo" --socket "$dir/b.sock" --backend sim
mkdir "$dir/cdir"
refused "--config DIRECTORY" "$dir/cdir" "directory" -- --config "$dir/cdir" --check
refused "--config DIRECTORY with --socket" "$dir/cdir" "directory" -- --config "$dir/cdir" "${s[@]}"
refused "--config /dev/null" "/dev/null" "character device" -- --config /dev/null "${s[@]}"
if command -v python3 >/dev/null 2>&1 &&
   python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1])' "$dir/sockfile"; then
    refused "--config SOCKET" "$dir/sockfile" "socket" -- --config "$dir/sockfile" --check
fi
refused "--config missing" "$dir/none.conf" "No such file" -- --config "$dir/none.conf" --check
# Through a symlink to a regular file, the config is read (the path is resolved at start).
printf 'socket = %s\n' "$dir/b.sock" >"$dir/ok.conf"
ln -s "$dir/ok.conf" "$dir/link.conf"
out=$(timeout 20 "$gpumem" broker --config "$dir/link.conf" --check 2>&1) ||
    { echo "FAIL: a symlink to a good config is refused: $out"; fail=1; }
# Good values still pass.
out=$(timeout 20 "$gpumem" broker "${s[@]}" --backend sim --device 0 --capacity 1GiB \
      --default-quota none 2>&1) || { echo "FAIL: good options refused: $out"; fail=1; }
case $out in *"backend sim, device 0, capacity 1.00 GiB, default_quota no limit"*) ;;
    *) echo "FAIL: --check said: $out"; fail=1;; esac

# A running broker whose config path becomes a FIFO, then SIGHUP: the reload
# is refused (logged, the config in force stays) and the broker goes on
# answering (before, its loop blocked in the open until a writer came).
printf 'socket = %s\nbackend = sim\ncapacity = 64MiB\n' "$dir/run.sock" >"$dir/run.conf"
timeout 120 "$gpumem" broker --config "$dir/run.conf" 2>"$dir/broker.log" &
bpid=$!
# Once the socket file is there the broker answers (it listens under another
# name and renames the socket into place: before, a query right after the
# file appeared was sometimes refused, "Connection refused").
for _ in $(seq 600); do [ -S "$dir/run.sock" ] && break; sleep 0.1; done
if ! timeout 20 "$gpumem" metrics --broker "$dir/run.sock" >/dev/null 2>"$dir/q.err"; then
    echo "FAIL: the broker did not answer at start: $(cat "$dir/q.err" "$dir/broker.log")"; fail=1
else
    rm -f "$dir/run.conf" && mkfifo "$dir/run.conf"
    kill -HUP $bpid
    out=$(timeout 20 "$gpumem" metrics --broker "$dir/run.sock" 2>&1) ||
        { echo "FAIL: after SIGHUP with a FIFO config the broker does not answer: ${out:0:300}"; fail=1; }
    grep -q "gpumem_broker_capacity_bytes 67108864" <<<"$out" ||
        { echo "FAIL: metrics after the refused reload: ${out:0:300}"; fail=1; }
    # (The query may be answered before the signal is handled: wait for the line.)
    for _ in $(seq 200); do
        grep -q "SIGHUP: .*run.conf.*FIFO.*the config in force stays" "$dir/broker.log" && break
        sleep 0.1
    done
    grep -q "SIGHUP: .*run.conf.*FIFO.*the config in force stays" "$dir/broker.log" ||
        { echo "FAIL: the log does not say why the reload was refused: $(cat "$dir/broker.log")"; fail=1; }
    out=$(timeout 20 "$gpumem" metrics --broker "$dir/run.sock" 2>&1) ||
        { echo "FAIL: after the refused reload the broker does not answer: ${out:0:300}"; fail=1; }
fi
kill -TERM $bpid 2>/dev/null
# A writer opening the FIFO lets an old broker stuck in its open go on and stop.
(exec 3>"$dir/run.conf") 2>/dev/null & wpid=$!
wait $bpid 2>/dev/null
kill $wpid 2>/dev/null; wait $wpid 2>/dev/null

[ $fail = 0 ] && echo "broker_options: ok"
exit $fail

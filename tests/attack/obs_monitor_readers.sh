#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# obs_monitor_readers.sh GPUMEM HOLDER — attacks `gpumem top` and `gpumem
# metrics` as readers of a directory anyone can write (/dev/shm): the files
# there are hostile input.  With a HOLDER alive (its file is the template):
#   - a FIFO, and a symlink to a FIFO, at a live pid's name must not hang them;
#   - garbage headers (huge n_fields, wrong size field, bad field names) and
#     huge sparse files are skipped, never read out of bounds;
#   - a command name with escape sequences and newlines,, printed as harmless text: top's table has no control
#     characters, top --json parses, metrics lines stay well-formed;
#   - (root) a file owned by another user is not read and not removed;
#   - a file truncated and refilled while they read never kills them (SIGBUS).
set -u
gpumem=$1 holder=$2
dir=$(mktemp -d "${TMPDIR:-/tmp}/gm_obs_read.XXXXXX")
export GPUMEM_MONITOR_DIR=$dir
fail=0
mkfifo "$dir/in"
"$holder" hold <"$dir/in" >"$dir/out" &
hpid=$!
exec 3>"$dir/in"
cleanup() { exec 3>&-; wait "$hpid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
for _ in $(seq 100); do grep -q ready "$dir/out" 2>/dev/null && break; sleep 0.1; done
grep -q ready "$dir/out" || { echo "holder did not start"; exit 1; }
seg=$dir/gpumem.$hpid
cp "$seg" "$dir/template"
size=$(stat -c %s "$seg")

run() { # run NAME ARGS...: must finish in 10 s and not die by a signal
  local name=$1; shift
  timeout 10 "$gpumem" "$@" >"$dir/last" 2>"$dir/last.err"
  local rc=$?
  if [[ $rc != 0 ]]; then echo "FAIL: $name: gpumem $* status $rc"; cat "$dir/last.err"; fail=1; fi
  return 0
}

# FIFOs at the names of live processes (this shell, the holder's parent).
mkfifo "$dir/gpumem.$$"
mkfifo "$dir/fifo2"
ln -s "$dir/fifo2" "$dir/gpumem.$PPID"
run "fifo top" top --once --json
grep -q "\"pid\":$hpid" "$dir/last" || { echo "FAIL: fifo: the holder is missing"; fail=1; }
run "fifo metrics" metrics
rm -f "$dir/gpumem.$$" "$dir/gpumem.$PPID" "$dir/fifo2"

# Garbage headers (under live pids' names) and a huge sparse file.
python3 - "$dir/template" "$dir" "$$" "$PPID" <<'PY'
import struct, sys
t = bytearray(open(sys.argv[1], "rb").read())
d, p1, p2 = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
a = bytearray(t); a[16:20] = struct.pack("<i", p1); a[20:24] = struct.pack("<I", 0xffffffff)
open("%s/gpumem.%d" % (d, p1), "wb").write(a)
b = bytearray(t); b[16:20] = struct.pack("<i", p2); b[12:16] = struct.pack("<I", 1 << 30)
open("%s/gpumem.%d" % (d, p2), "wb").write(b)
PY
truncate -s 1T "$dir/gpumem.1"
run "garbage top" top --once --json
python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); sys.exit(0 if len(v) == 1 else 1)' "$dir/last" ||
  { echo "FAIL: garbage: want only the holder:"; cat "$dir/last"; fail=1; }
run "garbage metrics" metrics
rm -f "$dir/gpumem.$$" "$dir/gpumem.$PPID" "$dir/gpumem.1"

# Hostile strings in the holder's own file (the command at offset 32).
python3 - "$seg" <<'PY'
import sys
f = open(sys.argv[1], "r+b")
f.seek(32); f.write(b'\x1b[2J\x1b]0;pwned\x07x\nFAKE 1 2 3\r"\\\xff\x00')
PY
run "escape top" top --once
if LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$dir/last"; then
  echo "FAIL: top table has control characters:"; cat -v "$dir/last"; fail=1
fi
[[ $(wc -l <"$dir/last") == 2 ]] || { echo "FAIL: top table: a command broke the line:"; cat -v "$dir/last"; fail=1; }
run "escape json" top --once --json
python3 - "$dir/last" <<'PY' || fail=1
import json, sys
raw = open(sys.argv[1], "rb").read()
v = json.loads(raw)
c = v[0]["command"]
bad = [ch for ch in c if ord(ch) < 0x20 or ord(ch) == 0x7f]
if bad or len(v) != 1: print("FAIL: json command %r" % c); sys.exit(1)
PY
run "escape metrics" metrics
if LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$dir/last"; then echo "FAIL: metrics has control characters"; fail=1; fi
grep -v '^#' "$dir/last" | grep -vq '^gpumem_[a-z_]*\({.*}\)\? [0-9.e+-]*$' &&
  { echo "FAIL: metrics: a malformed line:"; grep -v '^#' "$dir/last" | grep -v '^gpumem_[a-z_]*\({.*}\)\? [0-9.e+-]*$' | cat -v | head -3; fail=1; }
# A field name with JSON in it: the file is refused.
python3 - "$seg" "$size" <<'PY'
import sys
f = open(sys.argv[1], "r+b")
f.seek(96); f.write(b'a":1,"b\x00')
PY
run "bad name json" top --once --json
python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); sys.exit(0 if v == [] else 1)' "$dir/last" ||
  { echo "FAIL: a file with a bad field name was read:"; cat "$dir/last"; fail=1; }
cp "$dir/template" "$seg"

# Another user's file (root can make one): neither read nor removed.
if [[ $(id -u) == 0 ]]; then
  chown 65534 "$seg"
  run "other user" top --once --json
  grep -q "\"pid\":$hpid" "$dir/last" && { echo "FAIL: another user's file was read"; fail=1; }
  [[ -e $seg ]] || { echo "FAIL: another user's file was removed"; fail=1; }
  chown 0 "$seg"
else
  echo "SKIP: another user's file needs root"
fi

# Truncated while read: a writer empties and refills the file in a loop.
n=40; [[ ${GM_UNDER_VALGRIND:-0} == 1 ]] && n=10
python3 - "$seg" "$dir/template" "$dir/stop" <<'PY' &
import os, sys
seg, tpl, stop = sys.argv[1:4]
data = open(tpl, "rb").read()
fd = os.open(seg, os.O_RDWR)
while not os.path.exists(stop):
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
PY
tpid=$!
died=0
for _ in $(seq $n); do
  timeout 10 "$gpumem" top --once --json >/dev/null 2>&1
  rc=$?; [[ $rc -ge 124 ]] && died=$rc
  timeout 10 "$gpumem" metrics >/dev/null 2>&1
  rc=$?; [[ $rc -ge 124 ]] && died=$rc
done
touch "$dir/stop"; wait "$tpid"
[[ $died == 0 ]] || { echo "FAIL: a reader died (status $died) on a file truncated while read"; fail=1; }
cp "$dir/template" "$seg"

[[ $fail == 0 ]] && echo "obs_monitor_readers: ok"
exit $fail

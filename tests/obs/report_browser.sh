#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# report_browser.sh GPUMEM — `gpumem report` of the sample trace and of a
# small synthetic one, opened in a real headless browser (chromium): the
# page's own consistency checks must say "ok" in the DOM and the title, and
# the screenshot must not be blank.  Without chromium: skipped (exit 77, a
# clear message; ctest reports it as skipped), unless GM_REQUIRE_BROWSER=1,
# then a failure.
set -u
gpumem=$1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gm_report.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
browser=""
for b in chromium chromium-browser google-chrome; do
  command -v "$b" >/dev/null 2>&1 && { browser=$b; break; }
done

# A small trace by hand: three allocations, one failure, two frees.
cat >"$tmp/small.csv" <<'CSV'
Thread,Time,Action,Pointer,Size,Stream
1,0.1,allocate,0x1000,1048576,0
1,0.2,allocate,0x200000,3000,0
1,0.3,allocate failure,0x0,99999999999999,0
1,0.4,allocate,0x400000,8388608,0x7
1,0.5,free,0x1000,1048576,0
1,0.6,free,0x400000,8388608,0x7
CSV
cat >"$tmp/small.csv.sites" <<'SITES'
Row,Bytes,Site
1,1048576,load_weights at model.c:12 < main at model.c:40
2,3000,make_scratch at model.c:20 < main at model.c:41
4,8388608,load_weights at model.c:12 < main at model.c:40
SITES
"$gpumem" report data/sample.csv.gz -o "$tmp/sample.html" || { echo "FAIL: report of the sample"; exit 1; }
"$gpumem" report "$tmp/small.csv" -o "$tmp/small.html" || { echo "FAIL: report of the small trace"; exit 1; }
for f in sample small; do
  grep -qE '(src|href)="(https?:)?//' "$tmp/$f.html" && { echo "FAIL: $f.html refers to the network"; fail=1; }
done
"$gpumem" report "$tmp/nonexistent.csv" -o "$tmp/x.html" 2>/dev/null; [[ $? == 2 ]] || { echo "FAIL: missing trace status"; fail=1; }

if [[ -z $browser ]]; then
  if [[ ${GM_REQUIRE_BROWSER:-0} == 1 ]]; then
    echo "FAIL: no chromium installed and GM_REQUIRE_BROWSER=1"; exit 1
  fi
  [[ $fail == 0 ]] || exit 1
  echo "SKIP: no chromium installed; the reports were written but not opened in a browser"
  exit 77
fi
flags=(--headless --no-sandbox --disable-gpu --disable-background-networking
       --disable-component-update --disable-sync --no-first-run --disable-extensions
       --user-data-dir="$tmp/profile")
for f in sample small; do
  dom=$(timeout 120 "$browser" "${flags[@]}" --dump-dom "file://$tmp/$f.html" 2>/dev/null)
  if ! grep -q '<span id="checks" class="good">ok</span>' <<<"$dom"; then
    echo "FAIL: $f: the page's checks did not pass:"; grep -o '<span id="checks"[^<]*' <<<"$dom"; fail=1
  fi
  grep -q '<title>gpumem report: checks ok</title>' <<<"$dom" || { echo "FAIL: $f: title"; fail=1; }
  if [[ $f == small ]]; then
    grep -q 'load_weights at model.c:12 &lt; main at model.c:40</td><td class="num">9.00 MiB</td><td class="num">2</td>' <<<"$dom" ||
      { echo "FAIL: small: the top call site is not in the page"; grep -o '<div id="sites">.*</div>' <<<"$dom"; fail=1; }
  fi
  timeout 120 "$browser" "${flags[@]}" --screenshot="$tmp/$f.png" --window-size=1000,1400 \
    "file://$tmp/$f.html" >/dev/null 2>&1
  if [[ ! -s $tmp/$f.png ]]; then echo "FAIL: $f: no screenshot"; fail=1; continue; fi
  colours=$(python3 - "$tmp/$f.png" <<'PY'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n"
pos, idat, w, h, ctype = 8, b"", 0, 0, 0
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
raw = zlib.decompress(idat)
bpp = {2: 3, 6: 4}[ctype]
stride = w * bpp
seen, prev, i = set(), bytearray(stride), 0
for y in range(h):
    f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride]); i += 1 + stride
    for x in range(stride):
        a = line[x - bpp] if x >= bpp else 0
        b = prev[x]; c = prev[x - bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    if y % 4 == 0:
        for x in range(0, stride, bpp * 2): seen.add(bytes(line[x:x + 3]))
    prev = line
print(len(seen))
PY
)
  if [[ -z $colours || $colours -lt 8 ]]; then echo "FAIL: $f: screenshot looks blank ($colours colours)"; fail=1
  else echo "$f: checks ok, screenshot has $colours distinct colours"; fi
done
[[ $fail == 0 ]] && echo "report in a browser: ok"
exit $fail

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# obs_report_script.sh GPUMEM HOLDER — attacks the promise that `gpumem report`
# writes a self-contained page that only draws the trace: call-site names
# from TRACE.sites and the trace's file name are data, never markup.  A site
# named `</script><script>...` (or with `<!--`, U+2028, control characters)
# must not end the page's <script> or run anything: every such string is
# escaped for a JSON string inside <script> (<, >, &, U+2028/2029 and control
# characters as \u escapes).  Checked by reading the HTML: one </script> (the
# page's own), no <!-- in the script, and the data object parses as JSON
# giving back the exact names.
set -u
gpumem=$1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gm_obs_report.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail=0
name=$'x</script><script>document.title="pwned"</script><!--&\xe2\x80\xa8y\x01'
trace="$tmp/t<script>.csv"
cat >"$trace" <<'CSV'
Thread,Time,Action,Pointer,Size,Stream
1,0.1,allocate,0x1000,1048576,0
1,0.2,allocate,0x200000,3000,0
1,0.5,free,0x1000,1048576,0
CSV
{
  printf 'Row,Bytes,Site\n'
  printf '1,1048576,%s\n' "$name"
  printf '2,3000,plain < site & more\n'
} >"$trace.sites"
"$gpumem" report --no-replay "$trace" -o "$tmp/r.html" >/dev/null || { echo "FAIL: report"; exit 1; }
python3 - "$tmp/r.html" "$name" <<'PY' || fail=1
import json, sys
html = open(sys.argv[1], "rb").read().decode("utf-8")
want = sys.argv[2].encode("utf-8", "surrogateescape").decode("utf-8")
bad = []
start = html.index("<script>") + len("<script>")
end = html.index("</script>", start)
script = html[start:end]
if html.count("</script") != 1: bad.append("%d </script in the page" % html.count("</script"))
if html.lower().count("<script") != 1: bad.append("more than one <script")
if "<!--" in script: bad.append("<!-- in the script")
if "\u2028" in script or "\u2029" in script: bad.append("raw U+2028/2029 in the script")
if any(ord(c) < 0x20 and c not in "\n\t" for c in script): bad.append("control characters in the script")
i = script.index("const D = ") + len("const D = ")
obj, _ = json.JSONDecoder().raw_decode(script[i:])
names = [s[0] for s in obj["sites"]]
if want not in names: bad.append("the hostile site name did not survive: %r" % names)
if "plain < site & more" not in names: bad.append("plain name lost: %r" % names)
if obj["name"] != "t<script>.csv": bad.append("trace name: %r" % obj["name"])
for b in bad: print("FAIL:", b)
sys.exit(1 if bad else 0)
PY
[[ $fail == 0 ]] && echo "obs_report_script: ok"
exit $fail

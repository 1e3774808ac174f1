# SPDX-License-Identifier: Apache-2.0
# Attacks the promise that the readers are tools, not part of the library
# (src/observe/trace.h: the library writes traces and never reads them; the
# reader is tools/lib/trace_read.c, in libgpumem_tools.a; likewise the
# monitor segment's reader, tools/lib/monitor_read.c): libgpumem.so, beside
# the CLI in the build directory, must define none of the readers' symbols,
# in its full symbol table (`nm`, not `nm -D`: hidden symbols would still be
# code the library carries).  The recorder's gm__trace_* symbols and the
# monitor writer's gm__monitor_* symbols are fine.
# usage: bash trace_not_in_library.sh GPUMEM HOLDER [LIBRARY]
# Skipped (77) without nm, or when the library has no symbol table (stripped).
set -u
GPUMEM=$1
lib=${3:-$(dirname "$GPUMEM")/libgpumem.so}
command -v nm >/dev/null 2>&1 || { echo "SKIP: nm is not installed"; exit 77; }
[ -f "$lib" ] || { echo "FAIL: no library at $lib"; exit 1; }
syms=$(nm --defined-only "$lib" 2>/dev/null | awk '{ print $NF }')
# The recorder's entry point is always there: if not, the table is stripped.
echo "$syms" | grep -qx 'gm__trace_record_slow_locked' ||
    { echo "SKIP: $lib has no symbol table"; exit 77; }
# The readers' interfaces, and file-local functions only they have.
reader='^(gm__trace_(open|next|header|close|load|parse|free|check)|parse_row|parse_header|stream_dense_id|source_refill|pump_gzip|gm__monitor_(scan|value)|read_seg)$'
found=$(echo "$syms" | grep -E "$reader" || true)
if [ -n "$found" ]; then
    echo "FAIL: a reader (trace or monitor) is linked into $lib:"
    echo "$found"
    exit 1
fi
echo "ok: no trace or monitor reader symbol in $lib"

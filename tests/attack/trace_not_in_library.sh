# SPDX-License-Identifier: Apache-2.0
# Attacks the promise that the trace reader is a tool, not part of the library
# (src/observe/trace.h: the library writes traces and never reads them; the
# reader is tools/lib/trace_read.c, in libgpumem_tools.a): libgpumem.so, beside
# the CLI in the build directory, must define none of the reader's symbols,
# in its full symbol table (`nm`, not `nm -D`: hidden symbols would still be
# code the library carries).  The recorder's gm__trace_* symbols are fine.
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
# The reader's interface, and file-local functions only it has.
reader='^(gm__trace_(open|next|header|close|load|parse|free|check)|parse_row|parse_header|stream_dense_id|source_refill|pump_gzip)$'
found=$(echo "$syms" | grep -E "$reader" || true)
if [ -n "$found" ]; then
    echo "FAIL: the trace reader is linked into $lib:"
    echo "$found"
    exit 1
fi
echo "ok: no trace reader symbol in $lib"

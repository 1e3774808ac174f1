# SPDX-License-Identifier: Apache-2.0
"""What a trace would reserve if memory never moved between streams.

    python3 bench/stream_pools.py TRACE.csv[.gz]

Reads an RMM logging CSV trace (Thread,Time,Action,Pointer,Size,Stream) and
models an allocator that reuses a freed block's bytes only on the stream it
was freed on, perfectly packed (no fragmentation): each stream's pool grows
when its own free bytes cannot serve a request.  Prints one JSON object: the
live peak, each stream's pool, their sum over the live peak, and, per stream,
the bytes it allocated that other streams freed (hand-offs) and the bytes
freed on it minus those allocated on it: a stream that allocates more than
is freed on it must be fed memory other streams freed, whatever the
allocator ("must_receive", summed over those streams: at least that much
moves between streams per pass).

A sum near 1 means per-stream reuse alone keeps memory tight; well above 1,
a tight pool must move memory between streams, and each move needs the
freeing stream to be known past its free (an event or a wait)."""
import collections
import gzip
import json
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    f = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
    next(f)
    live = {}
    cur = peak = 0
    pool = collections.Counter()
    free = collections.Counter()
    crossing = collections.Counter()
    net = collections.Counter()
    for line in f:
        fields = line.rstrip("\n").split(",")
        if len(fields) < 6:
            continue
        action, ptr, size, stream = fields[2], fields[3], int(fields[4]), fields[5]
        if action == "allocate":
            live[ptr] = (size, stream)
            net[stream] -= size
            cur += size
            peak = max(peak, cur)
            if free[stream] >= size:
                free[stream] -= size
            else:
                pool[stream] += size - free[stream]
                free[stream] = 0
        elif action == "free" and ptr in live:
            size0, astream = live.pop(ptr)
            cur -= size0
            free[stream] += size0
            net[stream] += size0
            if stream != astream:
                crossing[astream] += size0
    total = sum(pool.values())
    print(json.dumps({
        "trace": path,
        "live_peak": peak,
        "stream_pools": dict(sorted(pool.items())),
        "stream_pools_over_live_peak": round(total / peak, 3) if peak else None,
        "allocated_here_freed_elsewhere": dict(sorted(crossing.items())),
        "freed_minus_allocated": dict(sorted(net.items())),
        "must_receive": sum(-v for v in net.values() if v < 0),
    }))


if __name__ == "__main__":
    main()

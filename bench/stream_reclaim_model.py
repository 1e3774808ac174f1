# SPDX-License-Identifier: Apache-2.0
"""How few event calls a trace's cross-stream reuse could need, at most
reserved memory = RATIO x the live peak.

    python3 bench/stream_reclaim_model.py TRACE.csv[.gz] [RATIO ...]

Reads an RMM logging CSV trace (Thread,Time,Action,Pointer,Size,Stream) and
replays it three times through a model allocator that counts bytes only (no
fragmentation, no pages, so no remapping): a block's bytes freed on a stream
are reusable at once by that stream; a request that the stream's own free
bytes and the global free bytes cannot serve grows the pool while reserved
stays within the ratio; past that, it reclaims: every other stream holding
free bytes hands them to the global pool, at one event record and one query
each (the calls a real allocator needs to know that stream has passed its
frees).  What a pass leaves live is freed into the global pool.  Prints, per
ratio, the event calls per 1000 operations in passes 2-3: a floor for
gpumem's steady_backend_calls on traces whose calls are those asks
(docs/pages.md, "Streams that hand memory to each other")."""
import collections
import csv
import gzip
import sys


def load(path):
    f = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
    rows = []
    for row in csv.reader(f):
        if not row or row[0] == "Thread":
            continue
        rows.append((row[2].startswith("alloc"), row[3], int(row[4]), row[5]))
    return rows


def live_peak(rows):
    live, peak, sizes = 0, 0, {}
    for is_alloc, ptr, size, _ in rows:
        if is_alloc:
            sizes[ptr] = size
            live += size
            peak = max(peak, live)
        else:
            live -= sizes.pop(ptr, 0)
    return peak


def event_calls(rows, cap):
    """Event calls in passes 2-3 with reserved memory at most cap bytes."""
    own = collections.Counter()  # stream -> free bytes only it may reuse
    glob = reserved = steady = 0
    for rep in range(3):
        live = {}
        for is_alloc, ptr, size, s in rows:
            if not is_alloc:
                if ptr in live:
                    own[s] += live.pop(ptr)
                continue
            live[ptr] = size
            if own[s] >= size:
                own[s] -= size
            elif own[s] + glob >= size:
                glob -= size - own[s]
                own[s] = 0
            elif reserved + size - own[s] - glob <= cap:
                reserved += size - own[s] - glob
                own[s] = glob = 0
            else:
                holders = [t for t in own if t != s and own[t] > 0]
                if rep:
                    steady += 2 * len(holders)
                for t in holders:
                    glob += own[t]
                    own[t] = 0
                need = size - own[s]
                own[s] = 0
                if glob >= need:
                    glob -= need
                else:
                    reserved += need - glob
                    glob = 0
        glob += sum(live.values())
    return steady


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    rows = load(sys.argv[1])
    ratios = [float(r) for r in sys.argv[2:]] or [1.02, 1.05, 1.1, 1.2, 1.4, 2.0]
    peak = live_peak(rows)
    for r in ratios:
        calls = event_calls(rows, r * peak)
        print(f"ratio {r:.2f}: {calls / (2 * len(rows)) * 1000:.2f} event calls per 1000 operations (passes 2-3)")


if __name__ == "__main__":
    main()

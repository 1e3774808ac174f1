// SPDX-License-Identifier: Apache-2.0
//
// torch_allocator.cpp — gpumem as a full PyTorch CUDA allocator: a class
// implementing c10::cuda::CUDACachingAllocator::CUDAAllocator that forwards
// memory to gpumem's device pools, so that everything PyTorch asks of its
// own allocator has an answer (device stats, cudnn's cacheInfo, CUDA graph
// pools, torch.compile's live-allocation checks and pool checkpoints,
// torch.cuda.MemPool, OOM observers and a genuine torch.cuda.OutOfMemoryError).
//
// gpumem.torch compiles this file on first use against the PyTorch that is
// imported (its headers and libraries, the flags its extensions use), caches
// the library, and installs the allocator with one C call,
// gm_torch_native_install(), before CUDA is initialized.  Without a C++
// compiler, gpumem.torch falls back to PyTorch's CUDAPluggableAllocator.
//
// The one idea: gpumem is already a caching allocator with a stream rule, so
// this layer keeps only what PyTorch needs and gpumem does not know: which
// stream and pool each pointer belongs to, and the private pools.
//
// Private pools (CUDA graph capture, torch.cuda.MemPool, torch.compile's
// cudagraph trees).  A graph replays the addresses it captured, including
// those of blocks freed during capture, for as long as its pool lives.  So a
// block of a private pool stays live in gpumem (gpumem never moves the pages
// of a live block: not on trim, not on page stealing, not on offload) and a
// free inside the pool only puts it on the pool's own free list, where later
// allocations of the same pool and stream take it again.  When the pool's
// use count falls to zero its cached blocks go back to gpumem; blocks still
// live then go back when freed.
//
// While a capture (or a MemPool context) is under way, a free that could make
// gpumem record an event on a capturing stream (an event recorded there
// belongs to the graph and cannot be queried) is deferred until it ends:
// blocks other streams used (record_stream) and blocks of a capturing stream
// (must_defer).  Driver calls made during a capture run with the thread's
// capture mode relaxed.
//
// Locking: one mutex (mu_) guards the block table, the private pools, the
// capture list and the deferred frees.  gpumem calls that may block on the
// driver (gm_alloc, gm_free) run outside it where the block's state allows;
// gm_* functions are thread-safe.  Stats counters are atomics per device.
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <unistd.h>

extern "C" {
#include "gpumem.h"
}

namespace {

namespace CA = c10::cuda::CUDACachingAllocator;
using c10::DeviceIndex;
using c10::MempoolId_t;

constexpr int kMaxDevices = 64;

struct MempoolHash {
    size_t operator()(const MempoolId_t &id) const noexcept
    {
        return std::hash<unsigned long long>()(id.first) * 31u ^ std::hash<unsigned long long>()(id.second);
    }
};

struct PrivatePool;

// One allocation PyTorch holds (or a private pool caches).
// size: what PyTorch asks for now; held: what the block was made for (a
// cached block of a private pool is taken again for any size up to held).
struct Block {
    void *ptr = nullptr;
    size_t size = 0;
    size_t held = 0;
    DeviceIndex device = 0;
    cudaStream_t stream = nullptr;
    PrivatePool *pool = nullptr; // null: an ordinary gpumem block
    bool recorded = false;       // record_stream named other streams (gm_record_stream)
    bool shareable = false;      // gm_alloc_shareable: whole pages, publishable
};

// A private pool: live + cached blocks.  Invariants: a pool whose use count
// is 0 caches nothing (releasePool gives its cache back, free_ptr gives its
// blocks back), and it is dropped once nothing of it is live and no capture
// routes to it (drop_pool_locked).
struct PrivatePool {
    MempoolId_t id{0, 0};
    DeviceIndex device = 0;
    int use_count = 0;
    std::shared_ptr<CA::CUDAAllocator> custom; // torch.cuda.MemPool(allocator=...)
    std::unordered_map<void *, Block> live;
    std::multimap<size_t, Block> cached; // held bytes -> free block
};

// One counter of PyTorch's Stat: current, peak, allocated (total), freed.
struct AtomicStat {
    std::atomic<int64_t> current{0}, peak{0}, allocated{0}, freed{0};
    void add(int64_t n)
    {
        int64_t now = current.fetch_add(n, std::memory_order_relaxed) + n;
        int64_t p = peak.load(std::memory_order_relaxed);
        while (now > p && !peak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
        }
        allocated.fetch_add(n, std::memory_order_relaxed);
    }
    void sub(int64_t n)
    {
        current.fetch_sub(n, std::memory_order_relaxed);
        freed.fetch_add(n, std::memory_order_relaxed);
    }
    c10::CachingAllocator::Stat get() const
    {
        c10::CachingAllocator::Stat s;
        s.current = current.load(std::memory_order_relaxed);
        s.peak = std::max(peak.load(std::memory_order_relaxed), s.current);
        s.allocated = allocated.load(std::memory_order_relaxed);
        s.freed = freed.load(std::memory_order_relaxed);
        return s;
    }
    void reset_peak() { peak.store(current.load(std::memory_order_relaxed), std::memory_order_relaxed); }
    void reset_totals()
    {
        allocated.store(0, std::memory_order_relaxed);
        freed.store(0, std::memory_order_relaxed);
    }
};

struct DeviceCounters {
    AtomicStat count;  // allocations PyTorch holds
    AtomicStat bytes;  // their requested bytes
    std::atomic<int64_t> ooms{0};
    std::atomic<double> fraction{1.0};
};

// Checkpoint of a private pool (torch.compile's cudagraph trees): the blocks
// live in it at the time.
struct PoolState : CA::AllocatorState {
    MempoolId_t id{0, 0};
    std::vector<Block> live;
};

void delete_block(void *ptr);

class GpumemAllocator final : public CA::CUDAAllocator {
  public:
    // ---- memory ------------------------------------------------------------

    c10::DataPtr allocate(size_t n) override
    {
        DeviceIndex device = c10::cuda::current_device();
        cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
        void *p = malloc_on(n, device, stream);
        return {p, p, &delete_block, c10::Device(c10::DeviceType::CUDA, device)};
    }

    c10::DeleterFnPtr raw_deleter() const override { return &delete_block; }

    void copy_data(void *dest, const void *src, std::size_t count) const override
    {
        C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
    }

    void *raw_alloc(size_t n) override
    {
        DeviceIndex device = c10::cuda::current_device();
        return malloc_on(n, device, c10::cuda::getCurrentCUDAStream(device).stream());
    }

    void *raw_alloc_with_stream(size_t n, cudaStream_t stream) override
    {
        return malloc_on(n, c10::cuda::current_device(), stream);
    }

    void raw_delete(void *ptr) override { free_ptr(ptr); }

    void init(int device_count) override
    {
        device_count_ = device_count;
        initialized_.store(true);
    }

    bool initialized() override { return initialized_.load(); }

    double getMemoryFraction(DeviceIndex device) override
    {
        check_device(device);
        return counters_[device].fraction.load();
    }

    void setMemoryFraction(double fraction, DeviceIndex device) override
    {
        check_device(device);
        TORCH_CHECK(fraction >= 0 && fraction <= 1, "gpumem: memory fraction ", fraction,
                    " must lie in [0, 1]");
        gm_torch_set_memory_fraction(fraction, device);
        counters_[device].fraction.store(fraction);
    }

    std::vector<CA::StreamSegmentSize> getExpandableSegmentSizes(DeviceIndex) override { return {}; }

    void enable(bool value) override { enabled_.store(value); }
    bool isEnabled() const override { return enabled_.load(); }

    // cudnn's benchmark mode sizes its workspace trials by the largest block
    // the allocator could hand out at once; the caller starts from the
    // device's free memory and we raise it to what gpumem holds cached.
    void cacheInfo(DeviceIndex device, size_t *largestBlock) override
    {
        gm_stats_t s = pool_stats(device);
        if (largestBlock && s.cached > *largestBlock) *largestBlock = s.cached;
    }

    void *getBaseAllocation(void *ptr, size_t *size) override
    {
        std::lock_guard<std::mutex> g(mu_);
        auto it = blocks_.find(ptr);
        TORCH_CHECK(it != blocks_.end(), "gpumem: getBaseAllocation(", ptr,
                    "): not the start of a live gpumem block");
        if (size) *size = it->second.held;
        return ptr;
    }

    void recordStream(const c10::DataPtr &dp, c10::cuda::CUDAStream stream) override
    {
        void *ptr = dp.get();
        if (!ptr) return;
        Block b;
        {
            std::lock_guard<std::mutex> g(mu_);
            auto it = blocks_.find(ptr);
            if (it == blocks_.end()) return; // not ours (e.g. a view's foreign storage)
            b = it->second;
        }
        if (b.pool) return; // private pools keep their blocks; streams are the graph's
        if (b.stream == stream.stream()) return;
        gm_pool_t *gp = pool_of(b.device);
        if (gm_record_stream(gp, ptr, stream.stream()) != GM_OK) {
            TORCH_WARN("gpumem: record_stream(", ptr, "): ", gm_last_error());
            return;
        }
        std::lock_guard<std::mutex> g(mu_);
        auto it = blocks_.find(ptr);
        if (it != blocks_.end()) it->second.recorded = true;
    }

    // ---- stats ---------------------------------------------------------------

    CA::DeviceStats getDeviceStats(DeviceIndex device) override
    {
        check_device(device);
        gm_stats_t s = pool_stats(device);
        DeviceCounters &c = counters_[device];
        CA::DeviceStats d;
        auto fill = [](c10::CachingAllocator::StatArray &a, c10::CachingAllocator::Stat v) {
            a[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)] = v;
            a[static_cast<size_t>(c10::CachingAllocator::StatType::LARGE_POOL)] = v;
        };
        c10::CachingAllocator::Stat count = c.count.get(), bytes = c.bytes.get();
        fill(d.allocation, count);
        fill(d.active, count);
        fill(d.allocated_bytes, bytes);
        fill(d.active_bytes, bytes);
        fill(d.requested_bytes, bytes);
        c10::CachingAllocator::Stat reserved;
        reserved.current = static_cast<int64_t>(s.reserved);
        reserved.peak = static_cast<int64_t>(std::max(s.reserved_peak, s.reserved));
        fill(d.reserved_bytes, reserved);
        c10::CachingAllocator::Stat split;
        split.current = static_cast<int64_t>(s.inactive_split);
        split.peak = split.current;
        fill(d.inactive_split_bytes, split);
        // gpumem has no cudaMalloc segments: its reserved memory is 2 MiB
        // pages mapped into one address space; report the page count.
        c10::CachingAllocator::Stat seg;
        seg.current = s.reserved ? 1 : 0;
        seg.peak = seg.current;
        fill(d.segment, seg);
        d.num_alloc_retries = static_cast<int64_t>(s.retries);
        d.num_ooms = c.ooms.load();
        // PyTorch counts "device memory allocation calls, mapped and
        // malloced": gpumem's page creations, maps and plain allocations.
        const uint64_t *calls = s.backend_calls;
        d.num_device_alloc = static_cast<int64_t>(calls[GM_CALL_phys_create] + calls[GM_CALL_map] + calls[GM_CALL_mem_alloc]);
        d.num_device_free = static_cast<int64_t>(calls[GM_CALL_phys_release] + calls[GM_CALL_unmap] + calls[GM_CALL_mem_free]);
        d.max_split_size = -1;
        return d;
    }

    void resetAccumulatedStats(DeviceIndex device) override
    {
        check_device(device);
        counters_[device].count.reset_totals();
        counters_[device].bytes.reset_totals();
        counters_[device].ooms.store(0);
    }

    void resetPeakStats(DeviceIndex device) override
    {
        check_device(device);
        counters_[device].count.reset_peak();
        counters_[device].bytes.reset_peak();
        (void)gm_pool_reset_peaks(pool_of(device));
    }

    // One segment per live allocation (gpumem blocks are not carved out of
    // segments), with one block each.  No traces: gpumem's own trace
    // (GPUMEM_TRACE, `gpumem trace`) records them.
    CA::SnapshotInfo snapshot(MempoolId_t mempool_id, bool /*include_traces*/) override
    {
        CA::SnapshotInfo info;
        bool all = mempool_id.first == 0 && mempool_id.second == 0;
        {
            std::lock_guard<std::mutex> g(mu_);
            for (auto &kv : blocks_) {
                const Block &b = kv.second;
                if (!all && (!b.pool || b.pool->id != mempool_id)) continue;
                info.segments.push_back(segment_of(b, true));
            }
            for (auto &kv : pools_)
                for (auto &cb : kv.second->cached)
                    if (all || kv.first == mempool_id) info.segments.push_back(segment_of(cb.second, false));
        }
        info.device_traces.resize(static_cast<size_t>(std::max(device_count_, 1)));
        info.config_metadata.garbage_collection_threshold = 0;
        info.config_metadata.max_split_size = SIZE_MAX;
        info.config_metadata.pinned_num_register_threads = 0;
        info.config_metadata.expandable_segments = false;
        info.config_metadata.release_lock_on_malloc = false;
        info.config_metadata.pinned_use_host_register = false;
        info.config_metadata.graph_capture_record_stream_reuse = false;
        info.config_metadata.last_allocator_settings = "gpumem";
        return info;
    }

    // A pool still in use keeps its cache (a graph replays it); one no
    // longer in use has none (PrivatePool's invariants).  So what is left to
    // empty is gpumem's own cache, for the whole device.
    void emptyCache(MempoolId_t mempool_id) override
    {
        if (mempool_id.first == 0 && mempool_id.second == 0) gm_torch_empty_cache();
    }

    // ---- private pools -------------------------------------------------------

    void beginAllocateToPool(DeviceIndex device, MempoolId_t mempool_id,
                             std::function<bool(cudaStream_t)> filter) override
    {
        check_device(device);
        std::lock_guard<std::mutex> g(mu_);
        for (auto &c : captures_)
            TORCH_CHECK(!(c.device == device && c.id == mempool_id),
                        "gpumem: beginAllocateToPool: already allocating to pool (", mempool_id.first, ", ",
                        mempool_id.second, ")");
        PrivatePool *pp = incref_locked(device, mempool_id, nullptr);
        captures_.push_back(Capture{device, mempool_id, std::move(filter), pp});
        capturing_.store(static_cast<int>(captures_.size()));
    }

    void endAllocateToPool(DeviceIndex device, MempoolId_t mempool_id) override
    {
        std::vector<Block> release;
        {
            std::lock_guard<std::mutex> g(mu_);
            for (auto it = captures_.begin(); it != captures_.end(); ++it)
                if (it->device == device && it->id == mempool_id) {
                    captures_.erase(it);
                    break;
                }
            capturing_.store(static_cast<int>(captures_.size()));
            take_deferred_locked(release);
            auto it = pools_.find(mempool_id);
            if (it != pools_.end() && it->second->use_count == 0 && it->second->live.empty())
                drop_pool_locked(it->second.get());
        }
        give_back(release);
    }

    void releasePool(DeviceIndex device, MempoolId_t mempool_id) override
    {
        (void)device;
        std::vector<Block> release;
        {
            std::lock_guard<std::mutex> g(mu_);
            auto it = pools_.find(mempool_id);
            if (it == pools_.end()) return;
            PrivatePool *pp = it->second.get();
            if (pp->use_count > 0) pp->use_count--;
            if (pp->use_count == 0) {
                for (auto &cb : pp->cached) release.push_back(cb.second);
                pp->cached.clear();
                if (pp->live.empty()) drop_pool_locked(pp);
            }
        }
        give_back(release);
    }

    int getPoolUseCount(DeviceIndex, MempoolId_t mempool_id) override
    {
        std::lock_guard<std::mutex> g(mu_);
        auto it = pools_.find(mempool_id);
        return it == pools_.end() ? 0 : it->second->use_count;
    }

    void createOrIncrefPool(DeviceIndex device, MempoolId_t mempool_id,
                            std::shared_ptr<CA::CUDAAllocator> allocator) override
    {
        check_device(device);
        std::lock_guard<std::mutex> g(mu_);
        incref_locked(device, mempool_id, std::move(allocator));
    }

    // A pool as the last resort of a failed allocation: gpumem serves every
    // allocation from its one device pool, so there is nothing to fall back
    // into; accepted and ignored.
    void setUseOnOOM(DeviceIndex, MempoolId_t, bool) override {}

    // gpumem never splits a private pool's blocks: every request is a block
    // of its own, so "no split" is what it does anyway.
    void setNoSplit(DeviceIndex, MempoolId_t) override {}

    bool checkPoolLiveAllocations(DeviceIndex, MempoolId_t mempool_id,
                                  const std::unordered_set<void *> &expected) override
    {
        std::lock_guard<std::mutex> g(mu_);
        auto it = pools_.find(mempool_id);
        if (it == pools_.end()) return expected.empty();
        const auto &live = it->second->live;
        if (live.size() != expected.size()) return false;
        for (void *p : expected)
            if (!live.count(p)) return false;
        return true;
    }

    std::shared_ptr<CA::AllocatorState> getCheckpointState(DeviceIndex, MempoolId_t id) override
    {
        auto st = std::make_shared<PoolState>();
        st->id = id;
        std::lock_guard<std::mutex> g(mu_);
        auto it = pools_.find(id);
        if (it != pools_.end())
            for (auto &kv : it->second->live) st->live.push_back(kv.second);
        return st;
    }

    // Back to a checkpoint: every block of the pool that is live now is
    // freed (into the pool), then every block live at the checkpoint is
    // allocated again at its address; PyTorch gets the new DataPtrs.
    CA::CheckpointDelta setCheckpointPoolState(DeviceIndex device,
                                               std::shared_ptr<CA::AllocatorState> pps) override
    {
        auto st = std::dynamic_pointer_cast<PoolState>(pps);
        TORCH_CHECK(st, "gpumem: setCheckpointPoolState: not a gpumem checkpoint");
        CA::CheckpointDelta delta;
        std::lock_guard<std::mutex> g(mu_);
        auto it = pools_.find(st->id);
        TORCH_CHECK(it != pools_.end(), "gpumem: setCheckpointPoolState: pool (", st->id.first, ", ",
                    st->id.second, ") no longer exists");
        PrivatePool *pp = it->second.get();
        for (auto &kv : pp->live) {
            delta.ptrs_freed.push_back(kv.first);
            blocks_.erase(kv.first);
            count_free(kv.second);
            pp->cached.emplace(kv.second.held, kv.second);
        }
        pp->live.clear();
        for (const Block &want : st->live) {
            auto cit = pp->cached.end();
            for (auto c = pp->cached.lower_bound(want.held); c != pp->cached.end() && c->first == want.held; ++c)
                if (c->second.ptr == want.ptr) {
                    cit = c;
                    break;
                }
            TORCH_CHECK(cit != pp->cached.end(), "gpumem: setCheckpointPoolState: block ", want.ptr,
                        " of the checkpoint is no longer in its pool");
            Block b = cit->second;
            pp->cached.erase(cit);
            b.size = want.size;
            b.stream = want.stream;
            pp->live.emplace(b.ptr, b);
            blocks_.emplace(b.ptr, b);
            count_alloc(b);
            delta.dataptrs_allocd.emplace_back(b.ptr, b.ptr, &delete_block,
                                               c10::Device(c10::DeviceType::CUDA, device));
        }
        return delta;
    }

    // ---- sharing between processes ---------------------------------------------

    // torch.multiprocessing: the producer publishes the block on a gpumem
    // share server of its own (one per device, started on first use, its
    // socket private to the user) under a fresh name and a random token; the
    // handle PyTorch carries to the consumer names the socket, the name and
    // the token, in CUDA IPC's 64 bytes.  The consumer imports it: its own
    // mapping of the same pages, which outlives the producer.  Only blocks
    // made whole-page (gm_alloc_shareable) can be published: the producer
    // asks for them with GPUMEM_TORCH_SHAREABLE (the smallest size).
    static constexpr size_t kHandleSize = 64;

    CA::ShareableHandle shareIpcHandle(void *ptr) override
    {
        Block b;
        {
            std::lock_guard<std::mutex> g(mu_);
            auto it = blocks_.find(ptr);
            TORCH_CHECK(it != blocks_.end(), "gpumem: shareIpcHandle(", ptr, "): not a live gpumem block");
            b = it->second;
        }
        TORCH_CHECK(b.shareable, "gpumem: a CUDA tensor is shared with another process only when its memory "
                    "was made shareable (whole pages): set GPUMEM_TORCH_SHAREABLE to the smallest tensor size "
                    "to make so (e.g. 1MiB, or 1 for every tensor) in the producer before "
                    "gpumem.torch.enable(); this block of ", b.size, " bytes is not (docs/python.md)");
        std::lock_guard<std::mutex> g(share_mu_);
        gm_share_server_t *server = share_server_locked(b.device);
        std::string name;
        auto pub = published_.find(ptr);
        if (pub != published_.end()) {
            name = pub->second.first;
        } else {
            name = "t" + std::to_string(++share_seq_);
            std::string token = random_token();
            int rc = gm_share_publish(server, name.c_str(), ptr, b.size, GM_SHARE_READ_WRITE, token.c_str(),
                                      b.stream);
            TORCH_CHECK(rc == GM_OK, "gpumem: publishing ", ptr, " for another process: ", gm_last_error());
            published_.emplace(ptr, std::make_pair(name, token));
            pub = published_.find(ptr);
        }
        std::string h = "GMT1\n" + share_path_[b.device] + "\n" + name + "\n" + pub->second.second;
        TORCH_CHECK(h.size() <= kHandleSize, "gpumem: share handle too long (socket path ",
                    share_path_[b.device], ")");
        h.resize(kHandleSize, '\0');
        return {0, h};
    }

    std::shared_ptr<void> getIpcDevPtr(std::string handle) override
    {
        std::string h(handle.c_str()); // the NUL padding off
        std::vector<std::string> part;
        for (size_t at = 0;;) {
            size_t nl = h.find('\n', at);
            part.push_back(h.substr(at, nl == std::string::npos ? std::string::npos : nl - at));
            if (nl == std::string::npos) break;
            at = nl + 1;
        }
        TORCH_CHECK(part.size() == 4 && part[0] == "GMT1",
                    "gpumem: the CUDA IPC handle did not come from gpumem (a producer needs gpumem.torch.enable() "
                    "too, with GPUMEM_TORCH_SHAREABLE)");
        DeviceIndex device = c10::cuda::current_device();
        gm_share_client_t *client = nullptr;
        {
            std::lock_guard<std::mutex> g(share_mu_);
            auto it = clients_.find(part[1]);
            if (it == clients_.end()) {
                int rc = gm_share_connect(pool_of(device), part[1].c_str(), &client);
                TORCH_CHECK(rc == GM_OK, "gpumem: connecting to the producer's share server ", part[1], ": ",
                            gm_last_error());
                clients_.emplace(part[1], client);
            } else {
                client = it->second;
            }
        }
        void *p = nullptr;
        size_t size = 0;
        int rc = gm_share_import(client, part[2].c_str(), part[3].c_str(), &p, &size, nullptr);
        TORCH_CHECK(rc == GM_OK, "gpumem: importing ", part[2], " from ", part[1], ": ", gm_last_error());
        // Unmapped after the work queued on the device's current stream at
        // release time (gm_share_release waits for it).
        return std::shared_ptr<void>(p, [client, device](void *q) {
            cudaStream_t s = c10::cuda::getCurrentCUDAStream(device).stream();
            if (gm_share_release(client, q, s) != GM_OK)
                TORCH_WARN("gpumem: releasing the imported ", q, ": ", gm_last_error());
        });
    }

    // ---- history, observers --------------------------------------------------

    bool isHistoryEnabled() override { return false; }

    void recordHistory(bool enabled, CA::CreateContextFn, size_t, CA::RecordContext, bool,
                       const std::vector<std::string> &) override
    {
        TORCH_CHECK(!enabled, "gpumem: torch.cuda.memory._record_memory_history is not offered under "
                    "gpumem.torch.enable(); record a trace with GPUMEM_TRACE=FILE and read it with "
                    "`gpumem report` / `gpumem trace` (docs/observe.md)");
    }

    void attachOutOfMemoryObserver(CA::OutOfMemoryObserver observer) override
    {
        std::lock_guard<std::mutex> g(mu_);
        oom_observers_.push_back(std::move(observer));
    }

    // Called by PyTorch's NCCL process group and memory history to follow
    // segment events; gpumem has no such events to give: accepted, ignored.
    void attachAllocatorTraceTracker(CA::AllocatorTraceTracker) override {}

    void enablePeerAccess(DeviceIndex dev, DeviceIndex dev_to_access) override
    {
        c10::cuda::CUDAGuard guard(dev);
        cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
        if (err == cudaErrorPeerAccessAlreadyEnabled)
            (void)cudaGetLastError();
        else
            C10_CUDA_CHECK(err);
    }

    // gpumem's pages are virtual-memory mappings: without peer access a
    // plain cudaMemcpyAsync between devices fails, the Peer copy works.
    cudaError_t memcpyAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count,
                            cudaStream_t stream, bool p2p_enabled) override
    {
        if (p2p_enabled || dstDevice == srcDevice)
            return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
        return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
    }

    std::string name() override { return "gpumem"; }

    // ---- the two paths every tensor takes --------------------------------------

    void *malloc_on(size_t n, DeviceIndex device, cudaStream_t stream)
    {
        check_device(device);
        if (n == 0) return nullptr;
        if (C10_UNLIKELY(capturing_.load(std::memory_order_relaxed) > 0)) {
            PrivatePool *pp = nullptr;
            std::shared_ptr<CA::CUDAAllocator> custom;
            {
                std::lock_guard<std::mutex> g(mu_);
                pp = route_locked(device, stream);
                if (pp) {
                    void *hit = take_cached_locked(pp, n, stream);
                    if (hit) return hit;
                    custom = pp->custom;
                }
            }
            if (pp) return malloc_in_pool(pp, custom, n, device, stream);
            c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
            return malloc_plain(n, device, stream);
        }
        return malloc_plain(n, device, stream);
    }

    void free_ptr(void *ptr)
    {
        if (!ptr) return;
        Block b;
        std::shared_ptr<CA::CUDAAllocator> custom;
        {
            std::lock_guard<std::mutex> g(mu_);
            auto it = blocks_.find(ptr);
            if (C10_UNLIKELY(it == blocks_.end())) {
                // Reached from destructors (noexcept): say so, never throw.
                TORCH_WARN("gpumem: free of ", ptr, ", which is not a live gpumem block; ignored");
                return;
            }
            b = it->second;
            blocks_.erase(it);
            count_free(b);
            if (b.pool) {
                PrivatePool *pp = b.pool;
                pp->live.erase(ptr);
                if (pp->custom) {
                    custom = pp->custom;
                    if (pp->use_count == 0 && pp->live.empty()) drop_pool_locked(pp);
                } else if (pp->use_count > 0) {
                    pp->cached.emplace(b.held, b);
                    return;
                } else if (pp->live.empty()) {
                    drop_pool_locked(pp);
                }
            } else if (capturing_.load(std::memory_order_relaxed) > 0 && must_defer(b)) {
                deferred_.push_back(b);
                return;
            }
        }
        if (custom) {
            custom->raw_delete(ptr);
            return;
        }
        if (b.shareable) unpublish(ptr);
        give_back_one(b);
    }

  private:
    struct Capture {
        DeviceIndex device;
        MempoolId_t id;
        std::function<bool(cudaStream_t)> filter;
        PrivatePool *pool;
    };

    // While a capture or a MemPool context is under way: a free that could
    // make gpumem record an event on a capturing stream waits for its end.
    // That is a free of a block other streams used (record_stream: gm_free
    // records events on them), or one freed on a stream that is capturing
    // (gpumem records its fence there when another stream wants the block).
    // Every other free goes to gpumem at once, so a long use_mem_pool context
    // does not hold back the frees of the rest of the program.
    static bool must_defer(const Block &b)
    {
        if (b.recorded) return true;
        cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(b.stream, &st) != cudaSuccess) {
            (void)cudaGetLastError(); // e.g. the legacy stream during a global capture
            return true;
        }
        return st != cudaStreamCaptureStatusNone;
    }

    static void check_device(DeviceIndex device)
    {
        TORCH_CHECK(device >= 0 && device < kMaxDevices, "gpumem: device ", static_cast<int>(device),
                    " is out of range");
    }

    gm_pool_t *pool_of(DeviceIndex device)
    {
        gm_pool_t *p = pools_by_device_[device].load(std::memory_order_acquire);
        if (C10_LIKELY(p)) return p;
        int rc = gm_device_pool(device, &p);
        TORCH_CHECK(rc == GM_OK, "gpumem: the pool of device ", static_cast<int>(device), ": ",
                    gm_last_error());
        pools_by_device_[device].store(p, std::memory_order_release);
        return p;
    }

    gm_stats_t pool_stats(DeviceIndex device)
    {
        check_device(device);
        gm_stats_t s;
        std::memset(&s, 0, sizeof s);
        s.size = sizeof s;
        s.version = GM_STATS_VERSION;
        int rc = gm_pool_stats(pool_of(device), &s);
        TORCH_CHECK(rc == GM_OK, "gpumem: stats of device ", static_cast<int>(device), ": ", gm_last_error());
        return s;
    }

    void count_alloc(const Block &b)
    {
        counters_[b.device].count.add(1);
        counters_[b.device].bytes.add(static_cast<int64_t>(b.size));
    }

    void count_free(const Block &b)
    {
        counters_[b.device].count.sub(1);
        counters_[b.device].bytes.sub(static_cast<int64_t>(b.size));
    }

    static CA::SegmentInfo segment_of(const Block &b, bool live)
    {
        CA::SegmentInfo s;
        s.device = b.device;
        s.address = reinterpret_cast<size_t>(b.ptr);
        s.total_size = b.held;
        s.requested_size = live ? b.size : 0;
        s.allocated_size = live ? b.held : 0;
        s.active_size = s.allocated_size;
        s.stream = b.stream;
        s.is_large = b.held > (1u << 20);
        s.is_expandable = false;
        // PyTorch's NCCL process group (register_mem_pool) asserts the
        // counter was set; gpumem keeps no registration history: 0.
        s.registration_counter = 0;
        if (b.pool) s.owner_private_pool_id = b.pool->id;
        c10::CachingDeviceAllocator::BlockInfo bi;
        bi.size = b.held;
        bi.requested_size = live ? b.size : 0;
        bi.allocated = live;
        bi.active = live;
        s.blocks.push_back(bi);
        return s;
    }

    PrivatePool *incref_locked(DeviceIndex device, MempoolId_t id, std::shared_ptr<CA::CUDAAllocator> custom)
    {
        auto &slot = pools_[id];
        if (!slot) {
            slot = std::make_unique<PrivatePool>();
            slot->id = id;
            slot->device = device;
        }
        if (custom) {
            TORCH_CHECK(!slot->custom || slot->custom == custom,
                        "gpumem: pool (", id.first, ", ", id.second, ") already has another allocator");
            slot->custom = std::move(custom);
        }
        slot->use_count++;
        return slot.get();
    }

    void drop_pool_locked(PrivatePool *pp)
    {
        for (auto &c : captures_)
            if (c.pool == pp) return; // still routed to: kept until the capture ends
        pools_.erase(pp->id);
    }

    PrivatePool *route_locked(DeviceIndex device, cudaStream_t stream)
    {
        for (auto &c : captures_)
            if (c.device == device && c.filter(stream)) return c.pool;
        return nullptr;
    }

    // A cached block of the pool for n bytes on this stream: the smallest
    // that fits and wastes at most half of itself.
    void *take_cached_locked(PrivatePool *pp, size_t n, cudaStream_t stream)
    {
        for (auto it = pp->cached.lower_bound(n); it != pp->cached.end() && it->first / 2 <= n; ++it) {
            if (it->second.stream != stream) continue;
            Block b = it->second;
            pp->cached.erase(it);
            b.size = n;
            pp->live.emplace(b.ptr, b);
            blocks_.emplace(b.ptr, b);
            count_alloc(b);
            return b.ptr;
        }
        return nullptr;
    }

    void *malloc_in_pool(PrivatePool *pp, const std::shared_ptr<CA::CUDAAllocator> &custom, size_t n,
                         DeviceIndex device, cudaStream_t stream)
    {
        void *p = nullptr;
        if (custom) {
            p = custom->raw_alloc_with_stream(n, stream);
            TORCH_CHECK(p, "gpumem: the allocator of pool (", pp->id.first, ", ", pp->id.second,
                        ") returned NULL for ", n, " bytes");
        } else {
            c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
            p = gm_malloc_or_throw(n, device, stream);
        }
        Block b = new_block(p, n, device, stream, pp);
        std::lock_guard<std::mutex> g(mu_);
        pp->live.emplace(p, b);
        blocks_.emplace(p, b);
        count_alloc(b);
        return p;
    }

    // A block of n bytes; a private pool's cached block is later taken for
    // any request up to n (held).
    static Block new_block(void *p, size_t n, DeviceIndex device, cudaStream_t stream, PrivatePool *pool)
    {
        Block b;
        b.ptr = p;
        b.size = n;
        b.held = n;
        b.device = device;
        b.stream = stream;
        b.pool = pool;
        return b;
    }

    // GPUMEM_TORCH_SHAREABLE: tensors of at least this size get whole pages
    // (gm_alloc_shareable), so torch.multiprocessing can share them; unset
    // or 0: none.  Read as the library reads every size setting.
    static size_t shareable_min_from_env()
    {
        size_t n = 0;
        TORCH_CHECK(gm_torch_shareable_min(&n) == GM_OK, "gpumem: ", gm_last_error(),
                    " (e.g. 1MiB, or 1 for every tensor)");
        return n;
    }

    void *malloc_plain(size_t n, DeviceIndex device, cudaStream_t stream)
    {
        bool shareable = shareable_min_ && n >= shareable_min_;
        void *p = shareable ? shareable_or_throw(n, device, stream) : gm_malloc_or_throw(n, device, stream);
        Block b = new_block(p, n, device, stream, nullptr);
        b.shareable = shareable;
        std::lock_guard<std::mutex> g(mu_);
        blocks_.emplace(p, b);
        count_alloc(b);
        return p;
    }

    // gm_alloc (which trims and retries itself); on a shortage the OOM
    // observers are told and torch.cuda.OutOfMemoryError raised.  Nothing of
    // this layer could be given back first: unused private pools cache
    // nothing, and deferred frees exist only while a capture runs.
    void *gm_malloc_or_throw(size_t n, DeviceIndex device, cudaStream_t stream)
    {
        gm_pool_t *gp = pool_of(device);
        void *p = nullptr;
        int rc = gm_alloc(gp, n, stream, &p);
        if (C10_LIKELY(rc == GM_OK)) return p;
        std::string why = gm_last_error();
        if (rc != GM_OUT_OF_MEMORY && rc != GM_LIMIT)
            TORCH_CHECK(false, "gpumem: allocating ", n, " bytes on device ", static_cast<int>(device), " failed: ",
                        gm_errname(rc), ": ", why);
        counters_[device].ooms.fetch_add(1);
        size_t free_b = 0, total_b = 0;
        {
            c10::cuda::CUDAGuard guard(device);
            if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
        }
        std::vector<CA::OutOfMemoryObserver> observers;
        {
            std::lock_guard<std::mutex> g(mu_);
            observers = oom_observers_;
        }
        size_t allocated = static_cast<size_t>(counters_[device].bytes.current.load());
        for (auto &o : observers) o(device, allocated, total_b, free_b);
        TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory (gpumem). Tried to allocate ",
                         c10::CachingAllocator::format_size(n), ". GPU ", static_cast<int>(device), " has a total capacity of ",
                         c10::CachingAllocator::format_size(total_b), " of which ", c10::CachingAllocator::format_size(free_b),
                         " is free. PyTorch holds ", c10::CachingAllocator::format_size(allocated), " in tensors. ",
                         gm_errname(rc), ": ", why);
        return nullptr;
    }

    // The share server of a device, started on first use; share_mu_ held.
    gm_share_server_t *share_server_locked(DeviceIndex device)
    {
        if (share_server_[device]) return share_server_[device];
        const char *dir = std::getenv("XDG_RUNTIME_DIR");
        std::string path = std::string(dir && std::strlen(dir) < 24 ? dir : "/tmp") + "/gmt-" +
                           std::to_string(getpid()) + "-" + std::to_string(static_cast<int>(device)) + ".sock";
        gm_share_server_t *srv = nullptr;
        int rc = gm_share_listen(pool_of(device), path.c_str(), nullptr, &srv);
        TORCH_CHECK(rc == GM_OK, "gpumem: starting the share server at ", path, ": ", gm_last_error());
        share_server_[device] = srv;
        share_path_[device] = path;
        if (!share_owner_pid_) {
            // The object lives to the end, its servers too; only the socket
            // files would stay behind, so they go at exit (in this process
            // only, not in a forked child).
            share_owner_pid_ = getpid();
            std::atexit(unlink_share_sockets);
        }
        return srv;
    }

    static void unlink_share_sockets();

    static std::string random_token()
    {
        unsigned char r[8] = {0};
        FILE *f = std::fopen("/dev/urandom", "rb");
        size_t got = f ? std::fread(r, 1, sizeof r, f) : 0;
        if (f) std::fclose(f);
        TORCH_CHECK(got == sizeof r, "gpumem: no random bytes for a share token");
        char hex[17];
        for (int i = 0; i < 8; i++) std::snprintf(hex + 2 * i, 3, "%02x", r[i]);
        return std::string(hex, 16);
    }

    // A freed block is no longer importable; importers keep their mappings
    // (gpumem frees the memory when the last one lets go).
    void unpublish(void *ptr)
    {
        std::lock_guard<std::mutex> g(share_mu_);
        auto it = published_.find(ptr);
        if (it == published_.end()) return;
        for (auto &srv : share_server_)
            if (srv && gm_share_unpublish(srv, it->second.first.c_str()) == GM_OK) break;
        published_.erase(it);
    }

    void *shareable_or_throw(size_t n, DeviceIndex device, cudaStream_t stream)
    {
        void *p = nullptr;
        int rc = gm_alloc_shareable(pool_of(device), n, stream, &p);
        if (rc == GM_OK) return p;
        TORCH_CHECK_WITH(OutOfMemoryError, rc != GM_OUT_OF_MEMORY && rc != GM_LIMIT,
                         "CUDA out of memory (gpumem). Tried to allocate ", c10::CachingAllocator::format_size(n),
                         " of shareable memory on GPU ", static_cast<int>(device), ": ", gm_last_error());
        TORCH_CHECK(false, "gpumem: allocating ", n, " shareable bytes on device ", static_cast<int>(device),
                    ": ", gm_errname(rc), ": ", gm_last_error());
        return nullptr;
    }

    void take_deferred_locked(std::vector<Block> &out)
    {
        if (capturing_.load() > 0 || deferred_.empty()) return;
        out.insert(out.end(), deferred_.begin(), deferred_.end());
        deferred_.clear();
    }

    void give_back_one(const Block &b)
    {
        int rc = gm_free(pool_of(b.device), b.ptr, b.stream);
        if (C10_UNLIKELY(rc != GM_OK)) {
            // Called from destructors: warn, never throw.
            TORCH_WARN("gpumem: freeing ", b.ptr, " on device ", static_cast<int>(b.device), ": ",
                       gm_last_error());
        }
    }

    void give_back(const std::vector<Block> &blocks)
    {
        for (const Block &b : blocks) give_back_one(b);
    }

    std::mutex mu_;
    std::unordered_map<void *, Block> blocks_;
    // Sharing between processes (share_mu_; taken after mu_, never before).
    std::mutex share_mu_;
    gm_share_server_t *share_server_[kMaxDevices] = {};
    std::string share_path_[kMaxDevices];
    uint64_t share_seq_ = 0;
    std::unordered_map<void *, std::pair<std::string, std::string>> published_; // ptr -> name, token
    std::unordered_map<std::string, gm_share_client_t *> clients_;               // by socket path
    size_t shareable_min_ = shareable_min_from_env();
    pid_t share_owner_pid_ = 0;
    std::unordered_map<MempoolId_t, std::unique_ptr<PrivatePool>, MempoolHash> pools_;
    std::vector<Capture> captures_;
    std::vector<Block> deferred_;
    std::vector<CA::OutOfMemoryObserver> oom_observers_;
    std::atomic<int> capturing_{0};
    std::atomic<bool> initialized_{false};
    std::atomic<bool> enabled_{true};
    int device_count_ = 0;
    std::atomic<gm_pool_t *> pools_by_device_[kMaxDevices] = {};
    DeviceCounters counters_[kMaxDevices];
};

// Never destroyed: tensors held by C++ statics are freed during the
// process's exit, after this library's static destructors would have run.
GpumemAllocator *g_allocator;

void GpumemAllocator::unlink_share_sockets()
{
    GpumemAllocator *a = g_allocator;
    if (!a || a->share_owner_pid_ != getpid()) return;
    for (const std::string &path : a->share_path_)
        if (!path.empty()) (void)unlink(path.c_str());
}

void delete_block(void *ptr)
{
    g_allocator->free_ptr(ptr);
}

} // namespace

extern "C" {

// Makes gpumem PyTorch's CUDA allocator.  0 on success; otherwise the reason
// is written into err (NUL-terminated) and nonzero returned: 1 PyTorch
// refused (CUDA already initialized), 2 anything else.
__attribute__((visibility("default"))) int gm_torch_native_install(char *err, size_t cap)
{
    try {
        if (!g_allocator) g_allocator = new GpumemAllocator();
        // PyTorch keeps the shared_ptr; its no-op deleter keeps the object.
        std::shared_ptr<CA::CUDAAllocator> handle(g_allocator, [](CA::CUDAAllocator *) {});
        torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(handle);
        return 0;
    } catch (const c10::Error &e) { // its message without PyTorch's C++ backtrace
        if (err && cap) std::snprintf(err, cap, "%s", e.what_without_backtrace());
        return std::strstr(e.what_without_backtrace(), "initialized") ? 1 : 2;
    } catch (const std::exception &e) {
        if (err && cap) std::snprintf(err, cap, "%s", e.what());
        return std::strstr(e.what(), "initialized") ? 1 : 2;
    }
}

} // extern "C"

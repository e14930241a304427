// Asynchronous O_DIRECT I/O engine on a file or block device.
//
// Torch-free and pybind-free on purpose: callers pass raw addresses and byte lengths, so the
// same core can be driven from Python bindings, from C tests, or from a future C ABI.
//
// Backends:
//   * io_uring through raw syscalls (io_uring_setup/io_uring_enter + mmap'd rings), so neither
//     liburing nor libaio is needed at build or run time;
//   * a thread pool doing pread/pwrite, used when io_uring is unavailable (old kernel, seccomp,
//     kernel.io_uring_disabled) or when explicitly requested.
//
// Every request is split into block_size chunks; at most queue_depth chunks are in flight
// (io_uring) or num_workers chunks (threads). Every completion is checked: a failed or short
// transfer fails the request with the path, offset, length and errno; nothing is reported as
// success unless all bytes moved.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace memascend {

// An I/O failure (errno from the kernel, or a short transfer). Maps to an OSError subclass.
class IoError : public std::runtime_error {
public:
    IoError(const std::string& msg, int err, std::string path, uint64_t offset, uint64_t length,
            bool short_transfer = false)
        : std::runtime_error(msg), err_(err), path_(std::move(path)), offset_(offset), length_(length),
          short_(short_transfer) {}
    int err() const { return err_; }
    const std::string& path() const { return path_; }
    uint64_t offset() const { return offset_; }
    uint64_t length() const { return length_; }
    bool is_short() const { return short_; }

private:
    int err_;
    std::string path_;
    uint64_t offset_, length_;
    bool short_;
};

// A request that violates the direct-I/O alignment; raised before anything is submitted.
class AlignmentError : public std::invalid_argument {
public:
    using std::invalid_argument::invalid_argument;
};

struct DioAlignment {
    uint32_t mem_align = 512;     // buffer address alignment
    uint32_t offset_align = 512;  // file offset and length alignment
    std::string source;           // "statx", "BLKSSZGET", "sysfs", "default"
};

// Direct-I/O alignment of a path: statx(STATX_DIOALIGN) where the kernel and filesystem report
// it, else the logical block size of the device (BLKSSZGET, or sysfs for the disk under a
// filesystem), else 512. For a path that does
// not exist yet, its parent directory is queried.
DioAlignment query_dio_alignment(const std::string& path);

enum class Backend { Auto, IoUring, Threads };
enum class OpKind : uint8_t { Read, Write };

struct EngineConfig {
    bool writable = true;
    Backend backend = Backend::Auto;
    unsigned queue_depth = 32;
    unsigned num_workers = 4;
    uint64_t block_size = 1u << 20;
    // io_uring only: largest single SQE. 0 = derive from the device's queue limits (see io_unit()).
    uint64_t max_io_bytes = 0;
};

class IoEngine {
public:
    IoEngine(const std::string& path, const EngineConfig& cfg);
    ~IoEngine();
    IoEngine(const IoEngine&) = delete;
    IoEngine& operator=(const IoEngine&) = delete;

    // Thread-safe. Validates alignment and bounds up front (AlignmentError / std::invalid_argument),
    // queues the request and returns its id without waiting. The memory at address must stay valid
    // until the request is waited for.
    uint64_t submit(OpKind op, uintptr_t address, uint64_t length, uint64_t offset);
    // Blocks until the request finished; throws IoError if any chunk failed or was short.
    void wait(uint64_t request_id);
    // Waits for every outstanding request; throws the first failure (the others are counted in the
    // message). All requests are finished and forgotten either way.
    void wait_all();
    // Synchronous convenience: submit + wait.
    void read(uintptr_t address, uint64_t length, uint64_t offset);
    void write(uintptr_t address, uint64_t length, uint64_t offset);
    // fdatasync: O_DIRECT bypasses the page cache but not the need to persist metadata/device caches.
    void sync();
    // Finishes outstanding I/O (errors are dropped: nobody is left to receive them), stops the
    // workers and closes the file. Idempotent.
    void close();

    const std::string& path() const { return path_; }
    const char* backend_name() const { return backend_ == Backend::IoUring ? "io_uring" : "threads"; }
    const std::string& backend_reason() const { return backend_reason_; }
    uint32_t alignment() const { return std::max(align_.mem_align, align_.offset_align); }
    const DioAlignment& dio_alignment() const { return align_; }
    uint64_t size_bytes() const;  // current file size or device size
    uint64_t block_size() const { return cfg_.block_size; }
    unsigned queue_depth() const { return cfg_.queue_depth; }
    // Bytes per submitted I/O. io_uring: block_size, or less when a block_size I/O would have to be
    // split by the block layer -- a split REQ_NOWAIT bio fails with EAGAIN and io_uring then punts
    // the request to its io-wq threads, which serialise writes to one file. Up to
    // queue_depth * block_size bytes stay in flight either way. Threads backend: block_size.
    uint64_t io_unit() const { return io_unit_; }
    unsigned num_workers() const { return cfg_.num_workers; }
    bool writable() const { return cfg_.writable; }
    bool is_block_device() const { return is_blockdev_; }
    bool closed() const { return closed_.load(); }
    uint64_t bytes_read() const { return bytes_read_.load(std::memory_order_relaxed); }
    uint64_t bytes_written() const { return bytes_written_.load(std::memory_order_relaxed); }
    size_t outstanding() const;

private:
    struct Request {
        uint64_t id;
        OpKind op;
        uintptr_t address;
        uint64_t length;
        uint64_t offset;
        uint64_t next = 0;         // bytes already carved into chunks
        unsigned in_flight = 0;    // chunks submitted and not yet completed
        bool done = false;
        bool failed = false;
        int err = 0;
        bool short_transfer = false;
        uint64_t err_offset = 0, err_length = 0;  // file range of the failed chunk
        std::string error;         // full message of the first failure
    };
    struct Chunk {
        Request* req = nullptr;
        uint64_t pos = 0;   // byte position inside the request
        uint64_t len = 0;   // bytes still to transfer
        uint64_t done = 0;  // bytes transferred so far (short transfers are continued)
        unsigned retries = 0;
        int fault = 0;      // test-only injected fault (FaultKind), 0 = none
    };
    // Test-only fault injection on the completion path (MEMASCEND_IO_FAULTS; see io_engine.cpp).
    enum FaultKind { kFaultNone = 0, kFaultEio, kFaultEnospc, kFaultShort, kFaultDrop, kFaultFlip };
    struct FaultRule {
        int op = -1;  // -1 any, else OpKind
        int kind = kFaultNone;
        uint64_t lo = 0, hi = ~uint64_t(0);  // device/file byte range the chunk must overlap
        uint64_t after = 0, count = 1, matched = 0;
        std::string path;  // substring of the engine's path; empty = any
    };
    void parse_faults(const char* spec);
    int fault_for_locked(const Chunk& c);
    // Applies an injected fault to a chunk whose I/O was skipped (or, for kFaultFlip, done).
    void finish_faulted_locked(Chunk& c);
    std::vector<FaultRule> faults_;

    // --- shared (called with mu_ held) ---
    bool carve_chunk_locked(Chunk& out);
    void finish_chunk_locked(Chunk& c, int err, bool short_transfer, uint64_t got);
    void fail_request_locked(Request& r, const std::string& msg, int err, bool short_transfer);
    std::string describe_chunk(const Chunk& c) const;
    [[noreturn]] void throw_request_error(const Request& r, size_t other_failures) const;
    void check_request(OpKind op, uintptr_t address, uint64_t length, uint64_t offset) const;

    // --- threads backend ---
    void worker_main();
    // --- io_uring backend ---
    bool uring_init(std::string& why);
    void uring_destroy();
    void uring_reaper_main();
    void uring_fill_locked();       // carve pending chunks into free slots and submit them
    void uring_prep_locked(unsigned slot);
    void uring_submit_locked();     // io_uring_enter for every SQE written since the last call
    void uring_wake_locked();       // post a NOP so that the reaper wakes up and issues pending I/O

    std::string path_;
    EngineConfig cfg_;
    DioAlignment align_;
    int fd_ = -1;
    bool is_blockdev_ = false;
    Backend backend_ = Backend::Threads;
    uint64_t io_unit_ = 0;        // bytes per submitted I/O
    unsigned max_in_flight_ = 0;  // io_uring: SQEs in flight = queue_depth * ceil(block_size / io_unit)
    std::string backend_reason_;

    mutable std::mutex mu_;
    std::condition_variable work_cv_;  // threads backend: pending work or stop
    std::condition_variable done_cv_;  // request completed
    std::deque<Request*> pending_;     // requests with bytes not yet carved into chunks
    std::unordered_map<uint64_t, std::shared_ptr<Request>> requests_;
    uint64_t next_id_ = 1;
    size_t active_ = 0;                // submitted requests not yet done (waited for or not)
    bool stopping_ = false;
    std::atomic<bool> closed_{false};
    std::vector<std::thread> threads_;
    std::atomic<uint64_t> bytes_read_{0}, bytes_written_{0};

    // io_uring state (raw rings)
    struct Uring;
    std::unique_ptr<Uring> ring_;
    std::vector<Chunk> slots_;
    std::vector<unsigned> free_slots_;
    unsigned in_flight_ = 0;      // slots in use
    unsigned unsubmitted_ = 0;    // SQEs written since the last io_uring_enter
    bool wake_pending_ = false;   // a wake-up NOP is submitted and its CQE not yet reaped
};

}  // namespace memascend

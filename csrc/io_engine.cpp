#include "io_engine.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <linux/io_uring.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <system_error>

#include "io_internal.h"

namespace memascend {

namespace detail {

std::string errno_text(int err) {
    std::ostringstream os;
    os << "errno " << err << " (" << std::strerror(err) << ")";
    return os.str();
}

const char* op_name(OpKind op) { return op == OpKind::Read ? "read" : "write"; }

}  // namespace detail

using detail::errno_text;
using detail::kWakeToken;
using detail::op_name;
using detail::start_thread_without_signals;

namespace {

bool fill_from_statx(int dirfd, const char* path, int flags, DioAlignment& a) {
#ifdef STATX_DIOALIGN
    struct statx sx;
    std::memset(&sx, 0, sizeof(sx));
    if (statx(dirfd, path, flags, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) &&
        sx.stx_dio_offset_align != 0 && sx.stx_dio_mem_align != 0) {
        a.mem_align = sx.stx_dio_mem_align;
        a.offset_align = sx.stx_dio_offset_align;
        a.source = "statx";
        return true;
    }
#else
    (void)dirfd;
    (void)path;
    (void)flags;
    (void)a;
#endif
    return false;
}

// Logical block size of the device holding a filesystem object, from sysfs (a partition's queue/
// lives in its parent disk's directory). 0 when unknown (e.g. tmpfs, overlayfs).
uint32_t sysfs_logical_block_size(dev_t dev) {
    const std::string base = "/sys/dev/block/" + std::to_string(major(dev)) + ":" + std::to_string(minor(dev));
    for (const char* rel : {"/queue/logical_block_size", "/../queue/logical_block_size"}) {
        FILE* f = std::fopen((base + rel).c_str(), "r");
        if (!f) continue;
        unsigned long v = 0;
        const int ok = std::fscanf(f, "%lu", &v);
        std::fclose(f);
        if (ok == 1 && v >= 512 && (v & (v - 1)) == 0) return static_cast<uint32_t>(v);
    }
    return 0;
}

// Largest I/O the block layer can take as one bio without splitting, from the queue limits of the
// device (worst case: every page its own segment). 0 when unknown.
uint64_t sysfs_max_unsplit_bytes(dev_t dev) {
    const std::string base = "/sys/dev/block/" + std::to_string(major(dev)) + ":" + std::to_string(minor(dev));
    auto read_u64 = [&](const char* name, uint64_t& out) {
        for (const char* rel : {"/queue/", "/../queue/"}) {
            FILE* f = std::fopen((base + rel + name).c_str(), "r");
            if (!f) continue;
            unsigned long long v = 0;
            const int ok = std::fscanf(f, "%llu", &v);
            std::fclose(f);
            if (ok == 1) {
                out = v;
                return true;
            }
        }
        return false;
    };
    uint64_t max_sectors_kb = 0, max_segments = 0, max_segment_size = 0;
    if (!read_u64("max_sectors_kb", max_sectors_kb) || !read_u64("max_segments", max_segments)) return 0;
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    uint64_t per_segment = page;
    if (read_u64("max_segment_size", max_segment_size) && max_segment_size > 0)
        per_segment = std::min(per_segment, max_segment_size);
    // An unaligned-to-page buffer can touch one page more than its length suggests.
    const uint64_t by_segments = max_segments > 1 ? (max_segments - 1) * per_segment : per_segment;
    return std::min(max_sectors_kb * 1024, by_segments);
}

// Alignment of an open descriptor: statx first (the only source that knows filesystem rules,
// e.g. ext4 on a 4Kn disk), then the logical block size of the device (BLKSSZGET for a block
// device, sysfs for the device under a filesystem), then 512.
DioAlignment alignment_of_fd(int fd, bool is_blockdev) {
    DioAlignment a;
    if (fill_from_statx(fd, "", AT_EMPTY_PATH, a)) return a;
    if (is_blockdev) {
        int lbs = 0;
        if (ioctl(fd, BLKSSZGET, &lbs) == 0 && lbs > 0) {
            a.mem_align = a.offset_align = static_cast<uint32_t>(lbs);
            a.source = "BLKSSZGET";
            return a;
        }
    }
    struct stat st;
    if (!is_blockdev && fstat(fd, &st) == 0) {
        if (uint32_t lbs = sysfs_logical_block_size(st.st_dev)) {
            a.mem_align = a.offset_align = lbs;
            a.source = "sysfs";
            return a;
        }
    }
    a.source = "default";
    return a;
}


}  // namespace

DioAlignment query_dio_alignment(const std::string& path) {
    struct stat st;
    std::string target = path;
    if (::stat(path.c_str(), &st) != 0) {
        if (errno != ENOENT) throw std::system_error(errno, std::generic_category(), "stat('" + path + "')");
        // Not created yet: the directory it will live in decides.
        auto slash = path.find_last_of('/');
        target = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
        if (::stat(target.c_str(), &st) != 0)
            throw std::system_error(errno, std::generic_category(), "stat('" + target + "')");
    }
    DioAlignment a;
    if (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode)) {
        int fd = ::open(target.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            a = alignment_of_fd(fd, S_ISBLK(st.st_mode));
            ::close(fd);
            return a;
        }
    }
    if (fill_from_statx(AT_FDCWD, target.c_str(), 0, a)) return a;
    // A directory (file not created yet): the filesystem's device decides.
    if (uint32_t lbs = sysfs_logical_block_size(st.st_dev)) {
        a.mem_align = a.offset_align = lbs;
        a.source = "sysfs";
        return a;
    }
    a.source = "default";
    return a;
}

// ---------------------------------------------------------------------------------------------
// Thread-pool backend.
void IoEngine::worker_main() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
        work_cv_.wait(lk, [&] { return stopping_ || !pending_.empty(); });
        Chunk c;
        if (!carve_chunk_locked(c)) {
            if (stopping_) return;
            continue;
        }
        if (c.fault != kFaultNone && c.fault != kFaultFlip) {
            finish_faulted_locked(c);
            continue;
        }
        lk.unlock();
        int err = 0;
        bool short_transfer = false;
        const Request& r = *c.req;
        while (c.done < c.len) {
            char* addr = reinterpret_cast<char*>(r.address + c.pos + c.done);
            const size_t len = c.len - c.done;
            const off_t off = static_cast<off_t>(r.offset + c.pos + c.done);
            ssize_t n = r.op == OpKind::Read ? ::pread(fd_, addr, len, off) : ::pwrite(fd_, addr, len, off);
            if (n < 0) {
                if (errno == EINTR) continue;
                err = errno;
                break;
            }
            if (n == 0) {
                short_transfer = true;
                break;
            }
            c.done += static_cast<uint64_t>(n);
            // An unaligned remainder cannot be continued with O_DIRECT (it is EOF in practice).
            if (c.done < c.len && c.done % align_.offset_align != 0) {
                short_transfer = true;
                break;
            }
        }
        lk.lock();
        if (c.fault == kFaultFlip && err == 0 && !short_transfer) finish_faulted_locked(c);
        else finish_chunk_locked(c, err, short_transfer, c.done);
    }
}

// ---------------------------------------------------------------------------------------------
// Test-only fault injection: MEMASCEND_IO_FAULTS="op=write,kind=eio,after=3,count=1,offset=LO-HI,path=loop0;..."
// (rules separated by ';'). kinds: eio, enospc (the chunk fails with that errno, no I/O is done),
// short (no I/O, reported as a short transfer), drop (no I/O, reported as complete: a lost write),
// flip (reads only: the read is done, then one bit in the middle of the chunk's buffer is flipped,
// as bit rot between the device and memory would). Each firing is printed to stderr. Off unless
// the variable is set; a rule with path= applies only to engines whose path contains it.
void IoEngine::parse_faults(const char* spec) {
    std::string all(spec);
    size_t start = 0;
    while (start <= all.size()) {
        size_t end = all.find(';', start);
        if (end == std::string::npos) end = all.size();
        std::string rule = all.substr(start, end - start);
        start = end + 1;
        if (rule.empty()) continue;
        FaultRule f;
        size_t p = 0;
        while (p <= rule.size()) {
            size_t q = rule.find(',', p);
            if (q == std::string::npos) q = rule.size();
            std::string kv = rule.substr(p, q - p);
            p = q + 1;
            if (kv.empty()) continue;
            const size_t eq = kv.find('=');
            if (eq == std::string::npos) throw std::invalid_argument("MEMASCEND_IO_FAULTS: '" + kv + "' is not key=value");
            const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
            if (k == "op") f.op = v == "read" ? int(OpKind::Read) : v == "write" ? int(OpKind::Write) : -1;
            else if (k == "kind") {
                f.kind = v == "eio" ? kFaultEio : v == "enospc" ? kFaultEnospc : v == "short" ? kFaultShort
                       : v == "drop" ? kFaultDrop : v == "flip" ? kFaultFlip : kFaultNone;
                if (f.kind == kFaultNone) throw std::invalid_argument("MEMASCEND_IO_FAULTS: unknown kind '" + v + "'");
            } else if (k == "after") f.after = std::stoull(v);
            else if (k == "count") f.count = v == "-1" ? ~uint64_t(0) : std::stoull(v);
            else if (k == "offset") {
                const size_t dash = v.find('-');
                f.lo = std::stoull(v.substr(0, dash));
                if (dash != std::string::npos) f.hi = std::stoull(v.substr(dash + 1));
            } else if (k == "path") f.path = v;
            else throw std::invalid_argument("MEMASCEND_IO_FAULTS: unknown key '" + k + "'");
        }
        if (f.kind == kFaultNone) throw std::invalid_argument("MEMASCEND_IO_FAULTS: rule '" + rule + "' has no kind");
        if (f.path.empty() || path_.find(f.path) != std::string::npos) faults_.push_back(f);
    }
}

int IoEngine::fault_for_locked(const Chunk& c) {
    const uint64_t lo = c.req->offset + c.pos, hi = lo + c.len;
    for (FaultRule& f : faults_) {
        if ((f.op != -1 && f.op != int(c.req->op)) || hi <= f.lo || lo >= f.hi) continue;
        ++f.matched;
        if (f.matched <= f.after || f.matched - f.after > f.count) continue;
        std::fprintf(stderr, "memascend: MEMASCEND_IO_FAULTS injects %s into the %s of '%s' offset=%llu length=%llu\n",
                     f.kind == kFaultEio ? "EIO" : f.kind == kFaultEnospc ? "ENOSPC" : f.kind == kFaultShort ? "a short transfer"
                     : f.kind == kFaultDrop ? "a dropped write" : "a bit flip", op_name(c.req->op), path_.c_str(),
                     static_cast<unsigned long long>(lo), static_cast<unsigned long long>(c.len));
        return f.kind;
    }
    return kFaultNone;
}

void IoEngine::finish_faulted_locked(Chunk& c) {
    switch (c.fault) {
        case kFaultEio: finish_chunk_locked(c, EIO, false, c.done); break;
        case kFaultEnospc: finish_chunk_locked(c, ENOSPC, false, c.done); break;
        case kFaultShort: finish_chunk_locked(c, 0, true, c.len / 2); break;
        case kFaultDrop: finish_chunk_locked(c, 0, false, c.len); break;
        case kFaultFlip: {
            if (c.req->op == OpKind::Read && c.len) {
                auto* p = reinterpret_cast<unsigned char*>(c.req->address + c.pos + c.len / 2);
                *p ^= 0x01;
            }
            finish_chunk_locked(c, 0, false, c.len);
            break;
        }
        default: finish_chunk_locked(c, 0, false, c.done); break;
    }
}

// ---------------------------------------------------------------------------------------------
IoEngine::IoEngine(const std::string& path, const EngineConfig& cfg) : path_(path), cfg_(cfg) {
    if (cfg_.queue_depth < 1 || cfg_.queue_depth > 4096)
        throw std::invalid_argument("queue_depth must be in [1, 4096], got " + std::to_string(cfg_.queue_depth));
    if (cfg_.num_workers < 1 || cfg_.num_workers > 256)
        throw std::invalid_argument("num_workers must be in [1, 256], got " + std::to_string(cfg_.num_workers));
    // io_uring's sqe->len is 32-bit; 1 GiB keeps a wide margin.
    if (cfg_.block_size == 0 || cfg_.block_size > (uint64_t(1) << 30))
        throw std::invalid_argument("block_size must be in [1, 1 GiB], got " + std::to_string(cfg_.block_size));

    const int flags = O_DIRECT | O_CLOEXEC | (cfg_.writable ? (O_RDWR | O_CREAT) : O_RDONLY);
    fd_ = ::open(path.c_str(), flags, 0600);
    if (fd_ < 0) {
        const int err = errno;
        throw IoError("open('" + path + "', O_DIRECT|" + (cfg_.writable ? "O_RDWR|O_CREAT" : "O_RDONLY") +
                          ") failed: " + errno_text(err) +
                          (err == EINVAL ? " (the filesystem does not support O_DIRECT)" : ""),
                      err, path, 0, 0);
    }
    struct stat st;
    if (fstat(fd_, &st) != 0 || !(S_ISREG(st.st_mode) || S_ISBLK(st.st_mode))) {
        ::close(fd_);
        fd_ = -1;
        throw std::invalid_argument("'" + path + "' is neither a regular file nor a block device");
    }
    is_blockdev_ = S_ISBLK(st.st_mode);
    align_ = alignment_of_fd(fd_, is_blockdev_);
    if (cfg_.block_size % alignment() != 0) {
        ::close(fd_);
        fd_ = -1;
        throw AlignmentError("block_size " + std::to_string(cfg_.block_size) + " is not a multiple of the direct-I/O alignment " +
                             std::to_string(alignment()) + " of '" + path + "'");
    }

    io_unit_ = cfg_.block_size;
    if (cfg_.max_io_bytes != 0) {
        io_unit_ = std::min<uint64_t>(io_unit_, cfg_.max_io_bytes);
    } else {
        uint64_t limit = sysfs_max_unsplit_bytes(is_blockdev_ ? st.st_rdev : st.st_dev);
        if (limit != 0 && limit < io_unit_) {
            uint64_t pow2 = 1;  // a power of two divides block_size evenly in the common case
            while (pow2 * 2 <= limit) pow2 *= 2;
            io_unit_ = pow2;
        }
    }
    io_unit_ = std::max<uint64_t>(io_unit_ / alignment() * alignment(), alignment());
    {
        const uint64_t per_block = (cfg_.block_size + io_unit_ - 1) / io_unit_;
        max_in_flight_ = static_cast<unsigned>(std::min<uint64_t>(uint64_t(cfg_.queue_depth) * per_block, 16384));
    }

    if (const char* spec = std::getenv("MEMASCEND_IO_FAULTS")) {
        try {
            parse_faults(spec);
        } catch (...) {
            ::close(fd_);
            fd_ = -1;
            throw;
        }
    }

    Backend want = cfg_.backend;
    if (want == Backend::Auto) {
        if (const char* env = std::getenv("MEMASCEND_IO_BACKEND")) {
            std::string v(env);
            if (v == "threads") want = Backend::Threads;
            else if (v == "io_uring") want = Backend::IoUring;
        }
    }
    if (want == Backend::Threads) {
        backend_ = Backend::Threads;
        backend_reason_ = "requested";
    } else {
        std::string why;
        if (uring_init(why)) {
            backend_ = Backend::IoUring;
            backend_reason_ = want == Backend::IoUring ? "requested" : "auto: io_uring available";
        } else if (want == Backend::IoUring) {
            ::close(fd_);
            fd_ = -1;
            throw std::runtime_error("io_uring backend requested for '" + path + "' but unavailable: " + why);
        } else {
            backend_ = Backend::Threads;
            backend_reason_ = "auto: " + why;
        }
    }
    if (backend_ == Backend::Threads) {
        io_unit_ = cfg_.block_size;  // blocking pread/pwrite: the kernel splits bios without penalty
        max_in_flight_ = cfg_.num_workers;
    }
    try {
        if (backend_ == Backend::IoUring) {
            threads_.push_back(start_thread_without_signals([this] { uring_reaper_main(); }));
        } else {
            for (unsigned i = 0; i < cfg_.num_workers; ++i)
                threads_.push_back(start_thread_without_signals([this] { worker_main(); }));
        }
    } catch (...) {
        close();  // joins the threads that did start (no destructor runs for a throwing constructor)
        throw;
    }
}

IoEngine::~IoEngine() {
    try {
        close();
    } catch (...) {
    }
}

uint64_t IoEngine::size_bytes() const {
    if (fd_ < 0) throw std::runtime_error("IOEngine for '" + path_ + "' is closed");
    if (is_blockdev_) {
        uint64_t bytes = 0;
        if (ioctl(fd_, BLKGETSIZE64, &bytes) != 0)
            throw IoError("BLKGETSIZE64 on '" + path_ + "' failed: " + errno_text(errno), errno, path_, 0, 0);
        return bytes;
    }
    struct stat st;
    if (fstat(fd_, &st) != 0) throw IoError("fstat('" + path_ + "') failed: " + errno_text(errno), errno, path_, 0, 0);
    return static_cast<uint64_t>(st.st_size);
}

size_t IoEngine::outstanding() const {
    std::lock_guard<std::mutex> lk(mu_);
    return active_;
}

void IoEngine::check_request(OpKind op, uintptr_t address, uint64_t length, uint64_t offset) const {
    if (op == OpKind::Write && !cfg_.writable)
        throw std::invalid_argument("IOEngine for '" + path_ + "' was opened read-only (writable=False)");
    if (length == 0) return;
    if (address == 0) throw std::invalid_argument("null buffer address for a " + std::to_string(length) + "-byte " + op_name(op));
    if (offset + length < offset || address + length < address)
        throw std::invalid_argument("offset/address + length overflows for '" + path_ + "'");
    const bool bad_addr = address % align_.mem_align != 0;
    const bool bad_off = offset % align_.offset_align != 0;
    const bool bad_len = length % align_.offset_align != 0;
    if (bad_addr || bad_off || bad_len) {
        std::ostringstream os;
        os << "misaligned O_DIRECT " << op_name(op) << " of '" << path_ << "': ";
        const char* sep = "";
        if (bad_addr) { os << "address 0x" << std::hex << address << std::dec << " is not a multiple of " << align_.mem_align; sep = "; "; }
        if (bad_off) { os << sep << "offset " << offset << " is not a multiple of " << align_.offset_align; sep = "; "; }
        if (bad_len) { os << sep << "length " << length << " is not a multiple of " << align_.offset_align; }
        os << " (request offset=" << offset << " length=" << length << "; alignment from " << align_.source
           << ": memory " << align_.mem_align << " B, offset/length " << align_.offset_align << " B)";
        throw AlignmentError(os.str());
    }
}

uint64_t IoEngine::submit(OpKind op, uintptr_t address, uint64_t length, uint64_t offset) {
    check_request(op, address, length, offset);
    auto r = std::make_shared<Request>();
    r->op = op;
    r->address = address;
    r->length = length;
    r->offset = offset;
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_ || closed_.load()) throw std::runtime_error("IOEngine for '" + path_ + "' is closed");
    r->id = next_id_++;
    requests_.emplace(r->id, r);
    if (length == 0) {
        r->done = true;
        return r->id;
    }
    ++active_;
    pending_.push_back(r.get());
    // io_uring: only the reaper thread issues I/O. Requests are owned by the task that submitted
    // them (completion task_work runs there; a task's requests are cancelled when it exits), so a
    // short-lived Python thread must not be the issuer. Here we just wake the reaper.
    if (backend_ == Backend::IoUring) uring_wake_locked();
    else work_cv_.notify_all();
    return r->id;
}

bool IoEngine::carve_chunk_locked(Chunk& out) {
    while (!pending_.empty()) {
        Request* r = pending_.front();
        if (r->next >= r->length) {
            pending_.pop_front();
            continue;
        }
        out = Chunk{};
        out.req = r;
        out.pos = r->next;
        const uint64_t unit = backend_ == Backend::IoUring ? io_unit_ : cfg_.block_size;
        out.len = std::min<uint64_t>(unit, r->length - r->next);
        if (!faults_.empty()) out.fault = fault_for_locked(out);
        r->next += out.len;
        ++r->in_flight;
        if (r->next >= r->length) pending_.pop_front();
        return true;
    }
    return false;
}

std::string IoEngine::describe_chunk(const Chunk& c) const {
    const Request& r = *c.req;
    std::ostringstream os;
    os << "'" << path_ << "' offset=" << (r.offset + c.pos) << " length=" << c.len << " (request offset=" << r.offset
       << " length=" << r.length << ", " << backend_name() << ")";
    return os.str();
}

void IoEngine::fail_request_locked(Request& r, const std::string& msg, int err, bool short_transfer) {
    if (r.failed) return;  // keep the first failure; later ones are consequences
    r.failed = true;
    r.err = err;
    r.short_transfer = short_transfer;
    r.error = msg;
    if (r.next < r.length) {
        // Do not issue the rest of a request that has already failed.
        r.next = r.length;
        for (auto it = pending_.begin(); it != pending_.end();) it = (*it == &r) ? pending_.erase(it) : it + 1;
    }
}

void IoEngine::finish_chunk_locked(Chunk& c, int err, bool short_transfer, uint64_t got) {
    Request& r = *c.req;
    (r.op == OpKind::Read ? bytes_read_ : bytes_written_).fetch_add(got, std::memory_order_relaxed);
    if (err != 0) {
        fail_request_locked(r, std::string(op_name(r.op)) + " of " + describe_chunk(c) + " failed after " +
                                   std::to_string(got) + " bytes: " + errno_text(err),
                            err, false);
        if (r.err_length == 0) { r.err_offset = r.offset + c.pos; r.err_length = c.len; }
    } else if (short_transfer) {
        std::ostringstream os;
        os << "short " << op_name(r.op) << " of " << describe_chunk(c) << ": transferred " << got << " of " << c.len
           << " bytes";
        struct stat st;
        if (!is_blockdev_ && fstat(fd_, &st) == 0) os << " (file size " << st.st_size << " bytes)";
        else if (is_blockdev_) {
            uint64_t dev = 0;
            if (ioctl(fd_, BLKGETSIZE64, &dev) == 0) os << " (device size " << dev << " bytes)";
        }
        os << "; the kernel returned no error, reported as " << errno_text(EIO);
        fail_request_locked(r, os.str(), EIO, true);
        if (r.err_length == 0) { r.err_offset = r.offset + c.pos; r.err_length = c.len; }
    }
    --r.in_flight;
    if (r.in_flight == 0 && r.next >= r.length && !r.done) {
        r.done = true;
        --active_;
        done_cv_.notify_all();
    }
}

void IoEngine::throw_request_error(const Request& r, size_t other_failures) const {
    std::string msg = r.error;
    if (other_failures) msg += " (and " + std::to_string(other_failures) + " more failed request(s))";
    throw IoError(msg, r.err, path_, r.err_offset, r.err_length, r.short_transfer);
}

void IoEngine::wait(uint64_t request_id) {
    std::unique_lock<std::mutex> lk(mu_);
    auto it = requests_.find(request_id);
    if (it == requests_.end())
        throw std::invalid_argument("unknown request id " + std::to_string(request_id) + " for '" + path_ +
                                "' (never submitted, or already waited for)");
    std::shared_ptr<Request> r = it->second;
    requests_.erase(it);
    done_cv_.wait(lk, [&] { return r->done; });
    if (r->failed) throw_request_error(*r, 0);
}

void IoEngine::wait_all() {
    std::unique_lock<std::mutex> lk(mu_);
    std::vector<std::shared_ptr<Request>> all;
    all.reserve(requests_.size());
    for (auto& kv : requests_) all.push_back(kv.second);
    requests_.clear();
    const Request* first = nullptr;
    size_t failures = 0;
    for (auto& r : all) {
        done_cv_.wait(lk, [&] { return r->done; });
        if (r->failed) {
            if (!first || r->id < first->id) first = r.get();
            ++failures;
        }
    }
    if (first) throw_request_error(*first, failures - 1);
}

void IoEngine::read(uintptr_t address, uint64_t length, uint64_t offset) { wait(submit(OpKind::Read, address, length, offset)); }
void IoEngine::write(uintptr_t address, uint64_t length, uint64_t offset) { wait(submit(OpKind::Write, address, length, offset)); }

void IoEngine::sync() {
    if (fd_ < 0) throw std::runtime_error("IOEngine for '" + path_ + "' is closed");
    if (::fdatasync(fd_) != 0)
        throw IoError("fdatasync('" + path_ + "') failed: " + errno_text(errno), errno, path_, 0, 0);
}

void IoEngine::close() {
    {
        std::unique_lock<std::mutex> lk(mu_);
        if (closed_.load()) return;
        closed_.store(true);
        // User buffers may still be the target of in-flight DMA: never return before it ends.
        done_cv_.wait(lk, [&] { return active_ == 0; });
        stopping_ = true;
        requests_.clear();
        if (backend_ == Backend::IoUring && ring_) {
            wake_pending_ = false;  // force a fresh wake-up: the reaper must see stopping_
            uring_wake_locked();
        }
        work_cv_.notify_all();
    }
    for (auto& t : threads_) t.join();
    threads_.clear();
    uring_destroy();
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
}

}  // namespace memascend

#include "buffers.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <vector>

namespace memascend {

namespace {

std::string mib_text(double bytes) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.1f MiB", bytes / (1024.0 * 1024.0));
    return buf;
}

std::string vm_lck_text() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmLck:", 0) == 0) {
            auto p = line.find_first_not_of(" \t", 6);
            return p == std::string::npos ? line : line.substr(p);
        }
    return "unknown";
}

// Minimal slice of the CUDA runtime API, resolved with dlsym (signatures from cuda_runtime_api.h).
using cuda_err_t = int;
struct CudaRuntime {
    void* handle = nullptr;
    std::string status;  // path on success, reason on failure
    cuda_err_t (*host_register)(void*, size_t, unsigned) = nullptr;
    cuda_err_t (*host_unregister)(void*) = nullptr;
    cuda_err_t (*get_device_count)(int*) = nullptr;
    cuda_err_t (*get_device)(int*) = nullptr;
    cuda_err_t (*set_device)(int) = nullptr;
    cuda_err_t (*device_synchronize)() = nullptr;
    const char* (*get_error_string)(cuda_err_t) = nullptr;

    std::string error_text(cuda_err_t e) const {
        std::string s = "cudaError " + std::to_string(e);
        if (get_error_string) {
            const char* t = get_error_string(e);
            if (t) s += " (" + std::string(t) + ")";
        }
        return s;
    }
};

CudaRuntime& cuda_runtime() {
    static CudaRuntime rt;
    static std::once_flag once;
    std::call_once(once, [] {
        // Prefer a runtime already loaded (e.g. by torch) so that we share its CUDA context.
        std::vector<std::string> names;
        if (const char* env = std::getenv("MEMASCEND_CUDART")) names.emplace_back(env);
        for (const char* n : {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"}) names.emplace_back(n);
        std::string tried;
        for (int pass = 0; pass < 2 && !rt.handle; ++pass) {
            for (const auto& n : names) {
                rt.handle = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL | (pass == 0 ? RTLD_NOLOAD : 0));
                if (rt.handle) {
                    rt.status = n;
                    break;
                }
                if (pass == 1) {
                    const char* e = dlerror();
                    tried += (tried.empty() ? "" : "; ") + std::string(e ? e : n.c_str());
                }
            }
        }
        if (!rt.handle) {
            rt.status = "CUDA runtime not found (dlopen: " + tried + "); set MEMASCEND_CUDART to its path";
            return;
        }
        rt.host_register = reinterpret_cast<cuda_err_t (*)(void*, size_t, unsigned)>(dlsym(rt.handle, "cudaHostRegister"));
        rt.host_unregister = reinterpret_cast<cuda_err_t (*)(void*)>(dlsym(rt.handle, "cudaHostUnregister"));
        rt.get_device_count = reinterpret_cast<cuda_err_t (*)(int*)>(dlsym(rt.handle, "cudaGetDeviceCount"));
        rt.get_device = reinterpret_cast<cuda_err_t (*)(int*)>(dlsym(rt.handle, "cudaGetDevice"));
        rt.set_device = reinterpret_cast<cuda_err_t (*)(int)>(dlsym(rt.handle, "cudaSetDevice"));
        rt.device_synchronize = reinterpret_cast<cuda_err_t (*)()>(dlsym(rt.handle, "cudaDeviceSynchronize"));
        rt.get_error_string = reinterpret_cast<const char* (*)(cuda_err_t)>(dlsym(rt.handle, "cudaGetErrorString"));
        if (!rt.host_register || !rt.host_unregister || !rt.get_device_count || !rt.get_device || !rt.set_device ||
            !rt.device_synchronize) {
            rt.status = "'" + rt.status + "' lacks one of cudaHostRegister/cudaHostUnregister/cudaGetDeviceCount/"
                        "cudaGetDevice/cudaSetDevice/cudaDeviceSynchronize";
            rt.handle = nullptr;  // keep it loaded; just unusable
            return;
        }
        int count = 0;
        cuda_err_t e = rt.get_device_count(&count);
        if (e != 0 || count == 0) {
            rt.status = "no usable CUDA device (" + (e != 0 ? rt.error_text(e) : std::string("cudaGetDeviceCount = 0")) +
                        ", runtime " + rt.status + ")";
            rt.handle = nullptr;
            return;
        }
        rt.status = "loaded " + rt.status + ", " + std::to_string(count) + " device(s)";
    });
    return rt;
}

constexpr unsigned kCudaHostRegisterPortable = 1;  // visible to every CUDA context
constexpr size_t kHugePageBytes = size_t(2) << 20;    // x86-64/arm64 (4 KiB base page) PMD size
std::atomic<uint64_t> g_close_syncs{0};

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

// Fault every page in for writing: one madvise on 5.14+, else touch each page.
void populate(void* p, size_t bytes) {
    if (madvise(p, bytes, MADV_POPULATE_WRITE) == 0) return;
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    volatile char* c = static_cast<volatile char*>(p);
    for (size_t off = 0; off < bytes; off += page) c[off] = 0;
}

}  // namespace

uint64_t cuda_close_syncs() { return g_close_syncs.load(std::memory_order_relaxed); }

size_t page_size_bytes() {
    static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return p;
}

std::string cuda_runtime_status() {
    CudaRuntime& rt = cuda_runtime();
    return (rt.handle ? "ok: " : "unavailable: ") + rt.status;
}

AlignedBuffer::AlignedBuffer(size_t nbytes, bool lock, bool cuda_register, bool zero, bool huge_pages)
    : nbytes_(nbytes) {
    if (nbytes == 0) throw std::invalid_argument("AlignedBuffer needs nbytes > 0");
    const size_t page = page_size_bytes();
    if (nbytes > SIZE_MAX - 2 * kHugePageBytes) throw std::invalid_argument("AlignedBuffer size overflows");
    mapped_ = (nbytes + page - 1) / page * page;

    // Transparent huge pages make the buffer physically contiguous in 2 MiB runs: an O_DIRECT bio
    // then needs one DMA segment per 2 MiB instead of up to one per 4 KiB page (virtio and NVMe
    // queues cap segments per request), and cudaHostRegister pins far fewer pages. THP only fills
    // 2 MiB-aligned extents inside the mapping, so the mapping is placed on a 2 MiB boundary;
    // its length stays nbytes rounded to the base page (no hidden growth).
    const bool want_huge = huge_pages && mapped_ >= kHugePageBytes;
    const size_t reserve = want_huge ? mapped_ + kHugePageBytes : mapped_;
    void* raw = mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        throw std::system_error(errno, std::generic_category(), "mmap of " + std::to_string(reserve) + " bytes for AlignedBuffer");
    char* base = static_cast<char*>(raw);
    if (want_huge) {
        const uintptr_t a = reinterpret_cast<uintptr_t>(raw);
        char* aligned = reinterpret_cast<char*>((a + kHugePageBytes - 1) & ~(uintptr_t(kHugePageBytes) - 1));
        const size_t head = static_cast<size_t>(aligned - base);
        const size_t tail = reserve - head - mapped_;
        if (head) munmap(base, head);
        if (tail) munmap(aligned + mapped_, tail);
        base = aligned;
        huge_pages_ = madvise(base, mapped_, MADV_HUGEPAGE) == 0;  // EINVAL without THP support: fine
    }
    ptr_ = base;

    // Anonymous memory reads as zero either way; zero=True also faults every page in now, so the
    // first O_DIRECT/DMA does not pay for page faults (mlock below populates too).
    if (zero && !lock) populate(ptr_, mapped_);

    if (lock) {
        if (mlock(ptr_, mapped_) == 0) {
            locked_ = true;
        } else {
            const int err = errno;
            struct rlimit rl{};
            getrlimit(RLIMIT_MEMLOCK, &rl);
            std::ostringstream os;
            os << "mlock(" << mapped_ << " bytes): " << std::strerror(err) << " (RLIMIT_MEMLOCK soft limit "
               << (rl.rlim_cur == RLIM_INFINITY ? std::string("unlimited") : mib_text(double(rl.rlim_cur)))
               << ", already locked by this process: " << vm_lck_text() << "); buffer left unlocked";
            lock_error_ = os.str();
        }
    }

    if (cuda_register) {
        CudaRuntime& rt = cuda_runtime();
        if (!rt.handle) {
            cuda_error_ = rt.status;
        } else {
            cuda_err_t e = rt.host_register(ptr_, mapped_, kCudaHostRegisterPortable);
            if (e == 0) {
                cuda_registered_ = true;
                // The device current on the registering thread is the one whose streams copy from
                // and to this buffer (one GPU per rank); close() synchronises it.
                if (rt.get_device(&cuda_device_) != 0) cuda_device_ = -1;
            } else {
                cuda_error_ = "cudaHostRegister(" + std::to_string(mapped_) + " bytes) failed: " + rt.error_text(e);
            }
        }
    }
}

AlignedBuffer::~AlignedBuffer() { close(); }

void AlignedBuffer::close() {
    if (!ptr_) return;
    if (cuda_registered_) {
        CudaRuntime& rt = cuda_runtime();
        // A non_blocking H2D/D2H copy enqueued on any stream may still be reading or writing these
        // pages: cudaHostUnregister does not wait for it (only cudaFreeHost synchronises
        // implicitly), and munmap below would hand the pages back while the DMA runs. Wait for
        // all work on the buffer's device first. This runs on whatever thread drops the last
        // view (a GC finalizer included), so the device is selected explicitly and restored.
        // Errors are ignored on purpose: at process exit the runtime may already be unloading
        // (no context, so no copy can be in flight) and a sticky error means the context is dead.
        int previous = -1;
        const bool switch_device = cuda_device_ >= 0 && rt.get_device(&previous) == 0 && previous != cuda_device_;
        if (switch_device) rt.set_device(cuda_device_);
        rt.device_synchronize();
        g_close_syncs.fetch_add(1, std::memory_order_relaxed);
        rt.host_unregister(ptr_);
        if (switch_device) rt.set_device(previous);
        cuda_registered_ = false;
    }
    if (locked_) {
        munlock(ptr_, mapped_);
        locked_ = false;
    }
    munmap(ptr_, mapped_);
    ptr_ = nullptr;
}

}  // namespace memascend

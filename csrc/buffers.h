// Exact-size, page-aligned host buffers for O_DIRECT and (optionally) GPU DMA.
//
// Memory comes from an anonymous mmap: page aligned by construction (2 MiB aligned and marked
// MADV_HUGEPAGE from 2 MiB up), rounded only up to the page size (no power-of-two rounding like
// torch's pinned allocator), and returned to the kernel on close. mlock is optional and never fatal: when RLIMIT_MEMLOCK is too small the buffer stays
// unlocked and lock_error() says why. cudaHostRegister is reached through the CUDA runtime loaded
// with dlopen at run time, so nothing CUDA is needed to build, and its absence is a reported
// reason, not an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace memascend {

class AlignedBuffer {
public:
    AlignedBuffer(size_t nbytes, bool lock, bool cuda_register, bool zero, bool huge_pages = true);
    ~AlignedBuffer();
    AlignedBuffer(const AlignedBuffer&) = delete;
    AlignedBuffer& operator=(const AlignedBuffer&) = delete;

    // Unregisters (after synchronising the CUDA device it was registered on, so that no async copy
    // still touches the pages), unlocks and unmaps. Idempotent.
    void close();

    void* data() const { return ptr_; }
    uintptr_t address() const { return reinterpret_cast<uintptr_t>(ptr_); }
    size_t nbytes() const { return nbytes_; }
    size_t mapped_bytes() const { return mapped_; }
    bool closed() const { return ptr_ == nullptr; }
    bool huge_pages() const { return huge_pages_; }  // MADV_HUGEPAGE applied (THP backing is up to the kernel)
    bool locked() const { return locked_; }
    const std::string& lock_error() const { return lock_error_; }
    bool cuda_registered() const { return cuda_registered_; }
    const std::string& cuda_error() const { return cuda_error_; }

private:
    void* ptr_ = nullptr;
    size_t nbytes_ = 0;
    size_t mapped_ = 0;
    bool huge_pages_ = false;
    bool locked_ = false;
    std::string lock_error_;
    bool cuda_registered_ = false;
    int cuda_device_ = -1;  // device current when registered; synchronised before unregistering
    std::string cuda_error_;
};

// Human-readable state of the CUDA runtime as this module sees it (path of the loaded libcudart,
// or why it could not be used). Never throws.
std::string cuda_runtime_status();

size_t page_size_bytes();

// How many closes of CUDA-registered buffers synchronised their device first (for tests and stats).
uint64_t cuda_close_syncs();

}  // namespace memascend

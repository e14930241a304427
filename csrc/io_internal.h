// Helpers shared by the I/O engine's two back ends (io_engine.cpp: thread pool, faults, requests;
// io_uring.cpp: the io_uring rings). Internal: not part of the Python module's interface.
#pragma once

#include <linux/io_uring.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <thread>
#include <utility>

#include "io_engine.h"

namespace memascend::detail {

std::string errno_text(int err);
const char* op_name(OpKind op);

inline constexpr uint64_t kWakeToken = ~uint64_t(0);

// Engine threads block all signals, so SIGINT & co. reach Python's main thread rather than
// interrupting a worker's syscalls.
template <class F>
inline std::thread start_thread_without_signals(F&& fn) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    try {
        std::thread t(std::forward<F>(fn));
        pthread_sigmask(SIG_SETMASK, &old, nullptr);
        return t;
    } catch (...) {
        pthread_sigmask(SIG_SETMASK, &old, nullptr);
        throw;
    }
}

}  // namespace memascend::detail

namespace memascend {

// io_uring rings, mapped by hand (see io_uring_setup(2)).
struct IoEngine::Uring {
    int fd = -1;
    void* sq_ptr = MAP_FAILED;
    size_t sq_bytes = 0;
    void* cq_ptr = MAP_FAILED;
    size_t cq_bytes = 0;
    io_uring_sqe* sqes = static_cast<io_uring_sqe*>(MAP_FAILED);
    size_t sqes_bytes = 0;
    unsigned *sq_head = nullptr, *sq_tail = nullptr, *sq_mask = nullptr, *sq_array = nullptr;
    unsigned *cq_head = nullptr, *cq_tail = nullptr, *cq_mask = nullptr;
    io_uring_cqe* cqes = nullptr;
    unsigned sq_entries = 0;
    unsigned sq_tail_local = 0;  // only ever written under IoEngine::mu_

    ~Uring() {
        if (sqes != MAP_FAILED) munmap(sqes, sqes_bytes);
        if (cq_ptr != MAP_FAILED && cq_ptr != sq_ptr) munmap(cq_ptr, cq_bytes);
        if (sq_ptr != MAP_FAILED) munmap(sq_ptr, sq_bytes);
        if (fd >= 0) ::close(fd);
    }
};

}  // namespace memascend

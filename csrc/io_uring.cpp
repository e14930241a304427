// The io_uring back end of the I/O engine: rings mapped by hand through raw syscalls (no liburing needed).
#include <linux/io_uring.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "io_engine.h"
#include "io_internal.h"

namespace memascend {

using detail::errno_text;
using detail::kWakeToken;
using detail::op_name;
using detail::start_thread_without_signals;

namespace {

int sys_io_uring_setup(unsigned entries, io_uring_params* p) {
    return static_cast<int>(syscall(__NR_io_uring_setup, entries, p));
}
int sys_io_uring_enter(int fd, unsigned to_submit, unsigned min_complete, unsigned flags) {
    return static_cast<int>(syscall(__NR_io_uring_enter, fd, to_submit, min_complete, flags, nullptr, 0));
}
int sys_io_uring_register(int fd, unsigned opcode, void* arg, unsigned nr_args) {
    return static_cast<int>(syscall(__NR_io_uring_register, fd, opcode, arg, nr_args));
}

}  // namespace

bool IoEngine::uring_init(std::string& why) {
    auto r = std::make_unique<Uring>();
    io_uring_params p;
    std::memset(&p, 0, sizeof(p));
    // The CQ must hold every in-flight chunk plus the shutdown NOP; the default (2 x SQ) does.
    r->fd = sys_io_uring_setup(max_in_flight_, &p);
    if (r->fd < 0) {
        why = "io_uring_setup failed: " + errno_text(errno);
        return false;
    }
    r->sq_entries = p.sq_entries;
    r->sq_bytes = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    r->cq_bytes = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
    const bool single_mmap = (p.features & IORING_FEAT_SINGLE_MMAP) != 0;
    if (single_mmap) r->sq_bytes = r->cq_bytes = std::max(r->sq_bytes, r->cq_bytes);
    r->sq_ptr = mmap(nullptr, r->sq_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                     IORING_OFF_SQ_RING);
    if (r->sq_ptr == MAP_FAILED) {
        why = "mmap of the io_uring SQ ring failed: " + errno_text(errno);
        return false;
    }
    r->cq_ptr = single_mmap ? r->sq_ptr
                            : mmap(nullptr, r->cq_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                                   r->fd, IORING_OFF_CQ_RING);
    if (r->cq_ptr == MAP_FAILED) {
        why = "mmap of the io_uring CQ ring failed: " + errno_text(errno);
        return false;
    }
    r->sqes_bytes = p.sq_entries * sizeof(io_uring_sqe);
    r->sqes = static_cast<io_uring_sqe*>(mmap(nullptr, r->sqes_bytes, PROT_READ | PROT_WRITE,
                                              MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQES));
    if (r->sqes == MAP_FAILED) {
        why = "mmap of the io_uring SQE array failed: " + errno_text(errno);
        return false;
    }
    auto* sq = static_cast<char*>(r->sq_ptr);
    auto* cq = static_cast<char*>(r->cq_ptr);
    r->sq_head = reinterpret_cast<unsigned*>(sq + p.sq_off.head);
    r->sq_tail = reinterpret_cast<unsigned*>(sq + p.sq_off.tail);
    r->sq_mask = reinterpret_cast<unsigned*>(sq + p.sq_off.ring_mask);
    r->sq_array = reinterpret_cast<unsigned*>(sq + p.sq_off.array);
    r->cq_head = reinterpret_cast<unsigned*>(cq + p.cq_off.head);
    r->cq_tail = reinterpret_cast<unsigned*>(cq + p.cq_off.tail);
    r->cq_mask = reinterpret_cast<unsigned*>(cq + p.cq_off.ring_mask);
    r->cqes = reinterpret_cast<io_uring_cqe*>(cq + p.cq_off.cqes);
    for (unsigned i = 0; i < p.sq_entries; ++i) r->sq_array[i] = i;  // identity SQ index map
    r->sq_tail_local = *r->sq_tail;

    // IORING_OP_READ/WRITE need 5.6+; probe instead of failing on the first request.
    const unsigned nops = 256;
    std::vector<char> probe_mem(sizeof(io_uring_probe) + nops * sizeof(io_uring_probe_op), 0);
    auto* probe = reinterpret_cast<io_uring_probe*>(probe_mem.data());
    if (sys_io_uring_register(r->fd, IORING_REGISTER_PROBE, probe, nops) < 0) {
        why = "io_uring opcode probe failed (kernel older than 5.6?): " + errno_text(errno);
        return false;
    }
    for (unsigned op : {unsigned(IORING_OP_READ), unsigned(IORING_OP_WRITE), unsigned(IORING_OP_NOP)}) {
        if (op > probe->last_op || !(probe->ops[op].flags & IO_URING_OP_SUPPORTED)) {
            why = "io_uring lacks IORING_OP_READ/WRITE";
            return false;
        }
    }
    ring_ = std::move(r);
    slots_.assign(max_in_flight_, Chunk{});
    free_slots_.clear();
    for (unsigned i = max_in_flight_; i-- > 0;) free_slots_.push_back(i);
    return true;
}

void IoEngine::uring_destroy() { ring_.reset(); }

void IoEngine::uring_prep_locked(unsigned slot) {
    Uring& r = *ring_;
    const Chunk& c = slots_[slot];
    io_uring_sqe* sqe = &r.sqes[r.sq_tail_local & *r.sq_mask];
    std::memset(sqe, 0, sizeof(*sqe));
    sqe->opcode = c.req->op == OpKind::Read ? IORING_OP_READ : IORING_OP_WRITE;
    if (c.fault != kFaultNone && c.fault != kFaultFlip) sqe->opcode = IORING_OP_NOP;  // the fault stands in for the I/O
    sqe->fd = fd_;
    sqe->addr = c.req->address + c.pos + c.done;
    sqe->len = static_cast<uint32_t>(c.len - c.done);
    sqe->off = c.req->offset + c.pos + c.done;
    sqe->user_data = slot;
    ++r.sq_tail_local;
    ++unsubmitted_;
}

void IoEngine::uring_submit_locked() {
    Uring& r = *ring_;
    if (unsubmitted_ == 0) return;
    __atomic_store_n(r.sq_tail, r.sq_tail_local, __ATOMIC_RELEASE);
    while (unsubmitted_ > 0) {
        int ret = sys_io_uring_enter(r.fd, unsubmitted_, 0, 0);
        if (ret >= 0) {
            unsubmitted_ -= std::min<unsigned>(unsubmitted_, static_cast<unsigned>(ret));
            continue;
        }
        const int err = errno;
        // Transient: retry. (EBUSY, a full CQ, cannot happen: in-flight <= SQ size < CQ size.)
        if (err == EINTR || err == EAGAIN || err == EBUSY) {
            std::this_thread::yield();
            continue;
        }
        // Hard failure of the syscall itself: the remaining SQEs were not consumed. Take them back
        // and fail their chunks so that no request can hang or report success.
        const unsigned head = __atomic_load_n(r.sq_head, __ATOMIC_ACQUIRE);
        std::vector<uint64_t> failed;
        for (unsigned t = head; t != r.sq_tail_local; ++t) failed.push_back(r.sqes[t & *r.sq_mask].user_data);
        r.sq_tail_local = head;
        __atomic_store_n(r.sq_tail, head, __ATOMIC_RELEASE);
        unsubmitted_ = 0;
        for (uint64_t slot : failed) {
            if (slot >= slots_.size()) {  // the wake-up NOP
                wake_pending_ = false;
                continue;
            }
            finish_chunk_locked(slots_[slot], err, false, slots_[slot].done);
            free_slots_.push_back(slot);
            --in_flight_;
        }
        return;
    }
}

void IoEngine::uring_wake_locked() {
    if (wake_pending_) return;  // a wake-up CQE is already on its way; at most one, so the CQ cannot overflow
    Uring& r = *ring_;
    io_uring_sqe* sqe = &r.sqes[r.sq_tail_local & *r.sq_mask];
    std::memset(sqe, 0, sizeof(*sqe));
    sqe->opcode = IORING_OP_NOP;  // completes inside io_uring_enter: nothing stays tied to this thread
    sqe->user_data = kWakeToken;
    ++r.sq_tail_local;
    ++unsubmitted_;
    wake_pending_ = true;
    uring_submit_locked();
}

void IoEngine::uring_fill_locked() {
    Chunk c;
    while (in_flight_ < max_in_flight_ && !free_slots_.empty() && carve_chunk_locked(c)) {
        unsigned slot = free_slots_.back();
        free_slots_.pop_back();
        slots_[slot] = c;
        ++in_flight_;
        uring_prep_locked(slot);
    }
    uring_submit_locked();
}

void IoEngine::uring_reaper_main() {
    Uring& r = *ring_;
    for (;;) {
        unsigned head = *r.cq_head;  // only this thread advances the CQ head
        unsigned tail = __atomic_load_n(r.cq_tail, __ATOMIC_ACQUIRE);
        if (head == tail) {
            // Blocks without holding mu_, so submitters keep going while we sleep.
            sys_io_uring_enter(r.fd, 0, 1, IORING_ENTER_GETEVENTS);
            continue;  // any error (EINTR...) just re-checks the ring
        }
        std::lock_guard<std::mutex> lk(mu_);
        for (; head != tail; ++head) {
            const io_uring_cqe& cqe = r.cqes[head & *r.cq_mask];
            const uint64_t ud = cqe.user_data;
            const int res = cqe.res;
            if (ud == kWakeToken) {
                wake_pending_ = false;
                continue;
            }
            const unsigned slot = static_cast<unsigned>(ud);
            Chunk& c = slots_[slot];
            bool release = true;
            if (c.fault != kFaultNone && (c.fault != kFaultFlip || res == static_cast<int>(c.len - c.done))) {
                if (c.fault == kFaultFlip) c.done = c.len;
                finish_faulted_locked(c);
            } else if (res < 0) {
                if ((res == -EAGAIN || res == -EINTR) && c.retries < 16) {
                    ++c.retries;
                    uring_prep_locked(slot);
                    release = false;
                } else {
                    finish_chunk_locked(c, -res, false, c.done);
                }
            } else if (res == 0) {
                finish_chunk_locked(c, 0, true, c.done);
            } else {
                c.done += static_cast<uint64_t>(res);
                if (c.done >= c.len) {
                    finish_chunk_locked(c, 0, false, c.done);
                } else if (c.done % align_.offset_align == 0 && c.retries < 16) {
                    // Partial but aligned: the rest can be issued again with O_DIRECT.
                    ++c.retries;
                    uring_prep_locked(slot);
                    release = false;
                } else {
                    finish_chunk_locked(c, 0, true, c.done);
                }
            }
            if (release) {
                free_slots_.push_back(slot);
                --in_flight_;
            }
        }
        __atomic_store_n(r.cq_head, head, __ATOMIC_RELEASE);
        uring_fill_locked();
        if (stopping_ && in_flight_ == 0) return;
    }
}

}  // namespace memascend

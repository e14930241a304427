// The only pybind11 file: Python names, defaults, docstrings, GIL policy and error mapping for
// the torch-free core in io_engine / buffers / scan.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "buffers.h"
#include "checksum.h"
#include "io_engine.h"
#include "moments.h"
#include "scan.h"

namespace py = pybind11;
using namespace memascend;

namespace {

using release_gil = py::call_guard<py::gil_scoped_release>;

// Python-side state of an AlignedBuffer: the number of live buffer exports (memoryviews, and the
// memoryview that as_tensor() ties to each tensor), so close() cannot unmap memory still in view.
struct PyAlignedBuffer {
    AlignedBuffer buf;
    Py_ssize_t exports = 0;
    PyAlignedBuffer(size_t nbytes, bool lock, bool cuda_register, bool zero, bool huge_pages)
        : buf(nbytes, lock, cuda_register, zero, huge_pages) {}
};

int aligned_buffer_getbuffer(PyObject* obj, Py_buffer* view, int flags) {
    PyAlignedBuffer* self = nullptr;
    try {
        self = py::cast<PyAlignedBuffer*>(py::handle(obj));
    } catch (...) {
        PyErr_SetString(PyExc_BufferError, "not an AlignedBuffer");
        view->obj = nullptr;
        return -1;
    }
    if (self->buf.closed()) {
        PyErr_SetString(PyExc_BufferError, "AlignedBuffer is closed");
        view->obj = nullptr;
        return -1;
    }
    // FillInfo takes a reference to obj, so the buffer object outlives every view of it.
    if (PyBuffer_FillInfo(view, obj, self->buf.data(), static_cast<Py_ssize_t>(self->buf.nbytes()), 0, flags) < 0)
        return -1;
    ++self->exports;
    return 0;
}

void aligned_buffer_releasebuffer(PyObject* obj, Py_buffer*) {
    try {
        --py::cast<PyAlignedBuffer*>(py::handle(obj))->exports;
    } catch (...) {
    }
}

py::object none_if_empty(const std::string& s) { return s.empty() ? py::object(py::none()) : py::object(py::str(s)); }

Backend parse_backend(const std::string& s) {
    if (s == "auto") return Backend::Auto;
    if (s == "io_uring") return Backend::IoUring;
    if (s == "threads") return Backend::Threads;
    throw std::invalid_argument("backend must be 'auto', 'io_uring' or 'threads', got '" + s + "'");
}

}  // namespace

PYBIND11_MODULE(_native, m) {
    m.doc() = "memascend native core: O_DIRECT I/O engine (io_uring / threads), aligned host buffers, fused non-finite scan.";

    // --- errors -------------------------------------------------------------------------------
    static py::exception<IoError> io_error(m, "IOError", PyExc_OSError);
    static py::exception<IoError> short_error(m, "ShortTransferError", io_error.ptr());
    static py::exception<AlignmentError> align_error(m, "AlignmentError", PyExc_ValueError);
    io_error.doc() = "An O_DIRECT transfer failed (OSError subclass: errno, filename, offset, length).";
    short_error.doc() = "Fewer bytes than requested were transferred (e.g. read past the end of the file).";
    align_error.doc() = "Address, offset or length violates the direct-I/O alignment; raised before submission.";
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const IoError& e) {
            // OSError(errno, strerror) sets .errno/.strerror; the rest are extra attributes.
            py::object cls = e.is_short() ? py::object(short_error) : py::object(io_error);
            py::object exc = cls(e.err(), e.what());
            exc.attr("filename") = e.path();
            exc.attr("offset") = e.offset();
            exc.attr("length") = e.length();
            PyErr_SetObject(cls.ptr(), exc.ptr());
        } catch (const AlignmentError& e) {
            PyErr_SetString(align_error.ptr(), e.what());
        }
    });

    // --- I/O engine ---------------------------------------------------------------------------
    py::class_<IoEngine>(m, "IOEngine", R"doc(
Asynchronous O_DIRECT reader/writer of one regular file or block device.

Transfers are split into ``block_size`` chunks, with up to ``queue_depth`` in flight (io_uring)
or ``num_workers`` (thread backend). Addresses, offsets and lengths must be multiples of the
direct-I/O alignment (``mem_alignment`` / ``offset_alignment``; ``alignment`` is the larger);
violations raise AlignmentError before anything is submitted. Every completion is checked:
errors and short transfers raise IOError / ShortTransferError naming path, offset, length and
errno. All blocking calls release the GIL; submission is thread-safe. Buffers must stay alive
until their request is waited for. A writable engine creates a missing file (mode 0600).
)doc")
        .def(py::init([](const std::string& path, bool writable, const std::string& backend, unsigned queue_depth,
                         unsigned num_workers, uint64_t block_size, uint64_t max_io_bytes) {
                 EngineConfig cfg;
                 cfg.writable = writable;
                 cfg.backend = parse_backend(backend);
                 cfg.queue_depth = queue_depth;
                 cfg.num_workers = num_workers;
                 cfg.block_size = block_size;
                 cfg.max_io_bytes = max_io_bytes;
                 return new IoEngine(path, cfg);
             }),
             py::arg("path"), py::kw_only(), py::arg("writable") = true, py::arg("backend") = "auto",
             py::arg("queue_depth") = 32, py::arg("num_workers") = 4, py::arg("block_size") = uint64_t(1) << 20,
             py::arg("max_io_bytes") = 0,
             "Open ``path`` with O_DIRECT. backend: 'auto' (io_uring, else threads; env MEMASCEND_IO_BACKEND "
             "overrides auto), 'io_uring' (error if unavailable) or 'threads'. max_io_bytes (io_uring): cap on "
             "one submitted I/O; 0 = the largest the device takes without a block-layer split (see io_unit).")
        .def("submit_read", [](IoEngine& e, uintptr_t a, uint64_t n, uint64_t off) { return e.submit(OpKind::Read, a, n, off); },
             py::arg("address"), py::arg("length"), py::arg("offset"), release_gil(),
             "Queue a read of ``length`` bytes at file ``offset`` into memory at ``address``; returns a request id.")
        .def("submit_write", [](IoEngine& e, uintptr_t a, uint64_t n, uint64_t off) { return e.submit(OpKind::Write, a, n, off); },
             py::arg("address"), py::arg("length"), py::arg("offset"), release_gil(),
             "Queue a write of ``length`` bytes from ``address`` to file ``offset``; returns a request id.")
        .def("wait", &IoEngine::wait, py::arg("request_id"), release_gil(),
             "Block until the request finished; raise IOError/ShortTransferError if it failed. Each id can be waited once.")
        .def("wait_all", &IoEngine::wait_all, release_gil(),
             "Block until every outstanding request finished; raise the first failure (all are consumed).")
        .def("read", &IoEngine::read, py::arg("address"), py::arg("length"), py::arg("offset"), release_gil(),
             "Synchronous read (submit + wait).")
        .def("write", &IoEngine::write, py::arg("address"), py::arg("length"), py::arg("offset"), release_gil(),
             "Synchronous write (submit + wait).")
        .def("sync", &IoEngine::sync, release_gil(), "fdatasync the file or device.")
        .def("close", &IoEngine::close, release_gil(),
             "Wait for in-flight I/O (errors of unwaited requests are dropped), stop workers, close the file.")
        .def("__enter__", [](IoEngine& e) -> IoEngine& { return e; }, py::return_value_policy::reference)
        .def("__exit__", [](IoEngine& e, py::args) { py::gil_scoped_release nogil; e.close(); })
        .def_property_readonly("path", &IoEngine::path)
        .def_property_readonly("backend", [](const IoEngine& e) { return std::string(e.backend_name()); },
                               "'io_uring' or 'threads'")
        .def_property_readonly("backend_reason", &IoEngine::backend_reason, "why this backend was chosen")
        .def_property_readonly("alignment", &IoEngine::alignment,
                               "bytes; pad addresses, offsets and lengths to this (max of memory and offset alignment)")
        .def_property_readonly("mem_alignment", [](const IoEngine& e) { return e.dio_alignment().mem_align; })
        .def_property_readonly("offset_alignment", [](const IoEngine& e) { return e.dio_alignment().offset_align; })
        .def_property_readonly("alignment_source", [](const IoEngine& e) { return e.dio_alignment().source; },
                               "'statx', 'BLKSSZGET' or 'default' (512)")
        .def_property_readonly("size_bytes", &IoEngine::size_bytes, "current file size or block device size")
        .def_property_readonly("block_size", &IoEngine::block_size)
        .def_property_readonly("queue_depth", &IoEngine::queue_depth)
        .def_property_readonly("io_unit", &IoEngine::io_unit,
                               "bytes per submitted I/O: block_size, or less on io_uring when the device would split a "
                               "block_size bio (a split NOWAIT bio is punted to io_uring's worker threads, which "
                               "serialise writes to one file); queue_depth * block_size bytes stay in flight")
        .def_property_readonly("num_workers", &IoEngine::num_workers)
        .def_property_readonly("writable", &IoEngine::writable)
        .def_property_readonly("is_block_device", &IoEngine::is_block_device)
        .def_property_readonly("closed", &IoEngine::closed)
        .def_property_readonly("bytes_read", &IoEngine::bytes_read)
        .def_property_readonly("bytes_written", &IoEngine::bytes_written)
        .def_property_readonly("outstanding", &IoEngine::outstanding, "requests submitted and not yet finished")
        .def("__repr__", [](const IoEngine& e) {
            return "<IOEngine path='" + e.path() + "' backend=" + e.backend_name() + " alignment=" +
                   std::to_string(e.alignment()) + " block_size=" + std::to_string(e.block_size()) +
                   " queue_depth=" + std::to_string(e.queue_depth()) + " io_unit=" + std::to_string(e.io_unit()) +
                   (e.closed() ? " closed" : "") + ">";
        });

    // --- aligned buffers ----------------------------------------------------------------------
    py::class_<PyAlignedBuffer> buf_cls(m, "AlignedBuffer", py::buffer_protocol(), R"doc(
Exact-size, page-aligned host memory (anonymous mmap) for O_DIRECT and GPU DMA.

lock=True tries mlock; if that fails (RLIMIT_MEMLOCK) the buffer stays usable but unlocked and
``lock_error`` says why. cuda_register=True calls cudaHostRegister through a dlopen'ed CUDA
runtime; without one ``cuda_registered`` is False and ``cuda_error`` says why. zero=True faults all
pages in now (the memory is zero either way). huge_pages=True (buffers >= 2 MiB): 2 MiB-aligned
mapping with MADV_HUGEPAGE, so transparent huge pages make it physically contiguous (fewer DMA
segments per O_DIRECT request; faster pinning). Supports the buffer protocol (memoryview,
torch.frombuffer, numpy); close() refuses while views exist.
)doc");
    buf_cls
        .def(py::init<size_t, bool, bool, bool, bool>(), py::arg("nbytes"), py::kw_only(), py::arg("lock") = true,
             py::arg("cuda_register") = false, py::arg("zero") = true, py::arg("huge_pages") = true)
        .def("close",
             [](PyAlignedBuffer& b) {
                 if (b.exports > 0)
                     throw py::buffer_error("cannot close AlignedBuffer: " + std::to_string(b.exports) +
                                            " exported view(s) (memoryviews or tensors from as_tensor) still alive");
                 py::gil_scoped_release release;  // a CUDA-registered buffer waits for its device first
                 b.buf.close();
             },
             "Synchronise the CUDA device (if registered), unregister, munlock and munmap. Raises BufferError "
             "while views exist.")
        .def("__enter__", [](PyAlignedBuffer& b) -> PyAlignedBuffer& { return b; }, py::return_value_policy::reference)
        .def("__exit__",
             [](PyAlignedBuffer& b, py::args) {
                 if (b.exports == 0) b.buf.close();  // views outliving the block keep the memory
             })
        .def("__len__", [](const PyAlignedBuffer& b) { return b.buf.nbytes(); })
        .def_property_readonly("address",
                               [](const PyAlignedBuffer& b) {
                                   if (b.buf.closed()) throw py::value_error("AlignedBuffer is closed");
                                   return b.buf.address();
                               })
        .def_property_readonly("nbytes", [](const PyAlignedBuffer& b) { return b.buf.nbytes(); })
        .def_property_readonly("mapped_bytes", [](const PyAlignedBuffer& b) { return b.buf.mapped_bytes(); },
                               "nbytes rounded up to the page size")
        .def_property_readonly("locked", [](const PyAlignedBuffer& b) { return b.buf.locked(); })
        .def_property_readonly("huge_pages", [](const PyAlignedBuffer& b) { return b.buf.huge_pages(); },
                               "MADV_HUGEPAGE applied (THP backing itself is up to the kernel)")
        .def_property_readonly("lock_error", [](const PyAlignedBuffer& b) { return none_if_empty(b.buf.lock_error()); },
                               "None, or why mlock was not done")
        .def_property_readonly("cuda_registered", [](const PyAlignedBuffer& b) { return b.buf.cuda_registered(); })
        .def_property_readonly("cuda_error", [](const PyAlignedBuffer& b) { return none_if_empty(b.buf.cuda_error()); },
                               "None, or why cudaHostRegister was not done")
        .def_property_readonly("closed", [](const PyAlignedBuffer& b) { return b.buf.closed(); })
        .def_property_readonly("exports", [](const PyAlignedBuffer& b) { return b.exports; })
        .def("__repr__", [](const PyAlignedBuffer& b) {
            return "<AlignedBuffer nbytes=" + std::to_string(b.buf.nbytes()) + (b.buf.closed() ? " closed" : "") +
                   " locked=" + (b.buf.locked() ? "True" : "False") +
                   " cuda_registered=" + (b.buf.cuda_registered() ? "True" : "False") + ">";
        });
    // Own getbuffer/releasebuffer (pybind11's def_buffer has no release hook) to count exports.
    auto* heap = reinterpret_cast<PyHeapTypeObject*>(buf_cls.ptr());
    heap->as_buffer.bf_getbuffer = aligned_buffer_getbuffer;
    heap->as_buffer.bf_releasebuffer = aligned_buffer_releasebuffer;
    heap->ht_type.tp_as_buffer = &heap->as_buffer;

    // --- scan and helpers ---------------------------------------------------------------------
    m.def("has_nonfinite",
          [](uintptr_t address, size_t numel, const std::string& dtype, unsigned num_threads) {
              return has_nonfinite(reinterpret_cast<const void*>(address), numel, parse_scan_dtype(dtype), num_threads);
          },
          py::arg("address"), py::arg("numel"), py::arg("dtype"), py::arg("num_threads") = 0, release_gil(),
          "True if any of ``numel`` elements at ``address`` is inf or nan. dtype: float16, bfloat16 or float32. "
          "One multi-threaded pass, no allocation proportional to numel. num_threads=0: all cores.");
    m.def("bf16_narrow_sr",
          [](uintptr_t address, size_t numel, uint32_t seed, size_t first) {
              bf16_narrow_sr(reinterpret_cast<void*>(address), numel, seed, first);
          },
          py::arg("address"), py::arg("numel"), py::arg("seed"), py::arg("first") = 0, release_gil(),
          "In place: the numel fp32 values at address become bf16 values in its first 2 x numel bytes, rounded "
          "stochastically with noise hashed from each index and seed (moments.h); first > 0: elements "
          "[first, first + numel) only.");
    m.def("bf16_widen",
          [](uintptr_t address, size_t numel, size_t upper_byte) {
              bf16_widen(reinterpret_cast<void*>(address), numel, upper_byte);
          },
          py::arg("address"), py::arg("numel"), py::arg("upper_byte"), release_gil(),
          "In place: the numel bf16 values at address + upper_byte (>= 2 x numel) become fp32 values at address.");
    m.def("master_split",
          [](uintptr_t master, uintptr_t residual, size_t numel, uintptr_t exceptions, size_t cap) {
              return master_split(reinterpret_cast<const void*>(master), reinterpret_cast<void*>(residual), numel,
                                  reinterpret_cast<int64_t*>(exceptions), cap);
          },
          py::arg("master"), py::arg("residual"), py::arg("numel"), py::arg("exceptions"), py::arg("cap"),
          release_gil(),
          "The int16 residuals of numel fp32 masters beside their bf16 round to nearest even; the indices of those "
          "int16 cannot hold go to exceptions (int64, up to cap); returns their count (moments.h).");
    m.def("master_join",
          [](uintptr_t address, uintptr_t residual, size_t numel, size_t upper_byte) {
              master_join(reinterpret_cast<void*>(address), reinterpret_cast<const void*>(residual), numel, upper_byte);
          },
          py::arg("address"), py::arg("residual"), py::arg("numel"), py::arg("upper_byte"), release_gil(),
          "In place: the numel bf16 values at address + upper_byte (>= 2 x numel) and int16 residuals become fp32 "
          "masters at address (moments.h).");
    m.def("adam_step_fused",
          [](uintptr_t master, uintptr_t residual, uintptr_t exp_avg, uintptr_t exp_avg_sq, uintptr_t grad,
             size_t numel, size_t upper_byte, unsigned flags, uintptr_t fixes, uintptr_t fix_values, size_t fix_count,
             const std::vector<float>& k, bool adamw, uint32_t seed_avg, uint32_t seed_avg_sq, uintptr_t exceptions,
             size_t cap) {
              if (k.size() != 9) throw std::invalid_argument("adam_step_fused: 9 constants");
              const AdamConstants c{k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7], k[8], adamw};
              return adam_step_fused(reinterpret_cast<float*>(master), reinterpret_cast<int16_t*>(residual),
                                     reinterpret_cast<float*>(exp_avg), reinterpret_cast<float*>(exp_avg_sq),
                                     reinterpret_cast<const float*>(grad), numel, upper_byte, flags,
                                     reinterpret_cast<const int64_t*>(fixes),
                                     reinterpret_cast<const float*>(fix_values), fix_count, c, seed_avg,
                                     seed_avg_sq, reinterpret_cast<int64_t*>(exceptions), cap);
          },
          py::arg("master"), py::arg("residual"), py::arg("exp_avg"), py::arg("exp_avg_sq"), py::arg("grad"),
          py::arg("numel"), py::arg("upper_byte"), py::arg("flags"), py::arg("fixes"), py::arg("fix_values"),
          py::arg("fix_count"), py::arg("constants"), py::arg("adamw"), py::arg("seed_avg"), py::arg("seed_avg_sq"),
          py::arg("exceptions"), py::arg("cap"), release_gil(),
          "One optimizer chunk's widen / join, DeepSpeed's CPU Adam, split / narrow in one pass (moments.h); "
          "constants: beta1, beta2, 1 - beta1, 1 - beta2, eps, bias correction 2, step size, weight decay, decoupled "
          "decay. "
          "Returns the count of masters the residual cannot hold (their indices to exceptions, up to cap).");
    m.def("dio_alignment",
          [](const std::string& path) {
              DioAlignment a = query_dio_alignment(path);
              return std::max(a.mem_align, a.offset_align);
          },
          py::arg("path"), "Bytes to pad O_DIRECT addresses, offsets and lengths to for ``path`` (max of memory and offset alignment).");
    m.def("dio_alignment_info",
          [](const std::string& path) {
              DioAlignment a = query_dio_alignment(path);
              py::dict d;
              d["mem_align"] = a.mem_align;
              d["offset_align"] = a.offset_align;
              d["source"] = a.source;
              return d;
          },
          py::arg("path"), "Direct-I/O alignment of a path: {'mem_align', 'offset_align', 'source'}.");
    // --- checksums -----------------------------------------------------------------------------
    m.def("crc32c",
          [](py::buffer data, uint32_t crc) {
              py::buffer_info info = data.request();
              const size_t n = static_cast<size_t>(info.size) * static_cast<size_t>(info.itemsize);
              py::gil_scoped_release nogil;
              return crc32c_update(crc, info.ptr, n);
          },
          py::arg("data"), py::arg("crc") = 0,
          "CRC-32C of a bytes-like object, continuing from ``crc`` (crc32c(b, crc32c(a)) == crc32c(a + b)).");
    m.def("crc32c_at",
          [](uintptr_t address, size_t nbytes, uint32_t crc) {
              if (nbytes && !address) throw std::invalid_argument("crc32c_at: null address");
              return crc32c_update(crc, reinterpret_cast<const void*>(address), nbytes);
          },
          py::arg("address"), py::arg("nbytes"), py::arg("crc") = 0, release_gil(),
          "CRC-32C of ``nbytes`` at a raw address, continuing from ``crc``.");
    m.def("crc32c_chunks",
          [](const std::vector<std::pair<uintptr_t, size_t>>& segments, size_t chunk_bytes) {
              std::vector<uint32_t> crcs;
              {
                  py::gil_scoped_release nogil;
                  for (const auto& s : segments)
                      if (s.second && !s.first) throw std::invalid_argument("crc32c_chunks: null segment address");
                  crcs = crc32c_chunks(segments, chunk_bytes);
              }
              // Packed little-endian uint32 (x86/arm64 are little-endian; the store compares bytes).
              return py::bytes(reinterpret_cast<const char*>(crcs.data()), crcs.size() * sizeof(uint32_t));
          },
          py::arg("segments"), py::arg("chunk_bytes"),
          "CRC-32C of each ``chunk_bytes`` chunk of the concatenated (address, nbytes) segments, as packed "
          "little-endian uint32 (the last chunk may be short).");
    m.def("crc32c_backend", &crc32c_backend, "'sse4.2' (the CPU instruction) or 'portable' (slicing-by-8 tables; "
          "forced by MEMASCEND_CRC32C=portable).");
    m.def("cuda_runtime_status", &cuda_runtime_status, "How the dlopen'ed CUDA runtime looks to this module.");
    m.def("cuda_close_syncs", &cuda_close_syncs,
          "Closes of CUDA-registered buffers that synchronised their device before cudaHostUnregister.");
    m.def("page_size", &page_size_bytes);
}

// memlens compiled recorder: the per-op hot path of `memlens.record()` in C++.
//
// One thread-local at::RecordFunction callback per session (scope FUNCTION, with inputs and outputs)
// logs every ATen op the Python TorchDispatchMode recorder would see: ops below the composite
// decompositions and not nested inside another recorded op's kernel. Per op it appends one fixed-size
// record (times, autograd sequence number, module context, interned signature = op name + argument
// shapes/dtypes/scalars) and one 4-byte record per tensor argument (block id << 1 | is_write).
// Blocks are storages (StorageImpl identity, held by a weak pointer so that the address cannot be
// reused while we know it; the data is never kept alive). Allocations and frees come from a
// c10::MemoryReportingInfoBase pushed into the thread-local debug info (the mechanism of the
// profiler's profile_memory): a fresh output's allocation is folded into its block record, frees of
// known blocks become free records, everything else (temporaries inside ops) is kept raw.
//
// The module context (module index << 2 | phase) copied into op records is kept here too: torch's
// global forward pre/post hooks call Handle::enter_module / exit_module directly, so a module call
// costs one C++ call, not a chain of Python frames. Inside a recorded op's kernel the session's own
// callback is switched off (see g_quiet), so nested ops are not boxed for it.
//
// Time spent inside these callbacks is accumulated per thread and subtracted from every timestamp
// (`now()` = monotonic clock minus the recorder's own time so far in this thread), so a trace's gaps
// are those of the program, not of the recorder.
//
// Buffers are chunked append-only streams; the large ones (ops, accesses, blocks, frees, allocator
// events) hold their records delta-coded as varints (~9 B per op, ~2 B per access), decoded into the
// fixed-size records at drain. Over the byte budget, full chunks are spilled to a file and read back
// at drain time: nothing is dropped.
//
// Threads: every thread that runs the session's callbacks (the recording thread, autograd's device
// threads, any thread that inherited its thread-local state) appends its ops, accesses and escapes to
// its own ThreadBuf with no lock; what threads share (the block maps and streams, signatures, contexts)
// stays under the session's mutex. Op numbers come from one counter, so drain() merges the threads'
// streams by them; stop() waits for threads still inside a callback before anything is read or freed.
//
// The parts, one question each (all included below, in this order, into this one translation unit:
// torch/extension.h, most of the compile time, is then parsed once, not once per file):
//   clock.h            the recorder's clock (monotonic ns minus its own time in this thread)
//   records.h          the fixed-size records drain() hands to Python; the stream of the rare ones
//   varint_streams.h   delta + varint coding of the records; the coded, spillable streams
//   op_stacks.h        stacks=True: the Python stack of each op
//   op_facts.h         what an op's schema says (reads, writes, view, composite), learned once
//   live_blocks.h      the live blocks: storage -> block, data address -> storage
//   signatures.h       op signatures (name + argument shapes/dtypes/scalars): coding and interning
//   session.h          one recording's shared state, each thread's buffer and frames, entering a session
//   memory_hook.h      the allocator's memory-reporting hook (allocations and frees)
//   op_callback.h      the RecordFunction callback: an op's start and end, its record and accesses
//   handle.h           the recording as Python holds it: start, stop, the hooks' calls
//   module_context.h   the forward pre/post hooks: the module stack
//   drain.h            the threads' streams merged and handed to Python (whole, or a window at a time)
//   test_threads.h     tests only: threads that inherit the recording's thread-local state
// and here: the Python module's definition.
#include <torch/extension.h>
#include <ATen/record_function.h>
#include <ATen/SequenceNumber.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/autograd/node.h>
#include <torch/csrc/profiler/orchestration/observer.h>
#include <ATen/ThreadLocalState.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string_view>
#include <ctime>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <thread>
#include <unordered_set>
#include <vector>

namespace memlens {

#include "clock.h"
#include "records.h"
#include "varint_streams.h"
#include "op_stacks.h"
#include "op_facts.h"
#include "live_blocks.h"
#include "signatures.h"
#include "session.h"
#include "memory_hook.h"
#include "op_callback.h"
#include "handle.h"
#include "module_context.h"
#include "drain.h"
#include "test_threads.h"

}  // namespace memlens

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using memlens::Handle;
  py::class_<Handle>(m, "Recording")
      .def(py::init<int64_t, std::string, bool>())
      .def("stop", &Handle::stop)
      .def("block_of", &Handle::block_of_tensor)
      .def("n_ops", &Handle::n_ops)
      .def("mark", &Handle::mark)
      .def("set_ctx", &Handle::set_ctx)
      .def("ctx", &Handle::get_ctx)
      .def("enter_module", &Handle::enter_module)
      .def("exit_module", &Handle::exit_module)
      .def("push_module", &Handle::push_module)
      .def("module_depth", &Handle::module_depth)
      .def("module_top", &Handle::module_top)
      .def("set_enter_slow", &Handle::set_enter_slow)
      .def("active", &Handle::active)
      .def("drain", &Handle::drain)
      .def("drain_windowed", &Handle::drain_windowed)
      .def("next_accesses", &Handle::next_accesses)
      .def("rewind_accesses", &Handle::rewind_accesses)
      .def("close_windows", &Handle::close_windows)
      .def("enable_stacks", &Handle::enable_stacks)
      .def("drain_stacks", &Handle::drain_stacks);
  py::class_<memlens::InheritingThreads>(m, "_InheritingThreads", "tests only")
      .def(py::init<std::vector<py::function>>())
      .def("join", &memlens::InheritingThreads::join);
  m.def("now", []() { return memlens::now(); }, "the recorder's clock: monotonic ns minus its own time in this thread");
  m.def("add_own_ns", [](int64_t ns) { memlens::tl_own_ns += ns; }, "count `ns` of Python hook time as the recorder's own");
  m.def("_set_probe", [](int v) { memlens::g_probe = v; }, "benchmarks only");
  m.def("_set_quiet", [](bool v) { memlens::g_quiet = v; }, "benchmarks only");
  m.def("_set_spin_ns", [](int64_t v) { memlens::g_spin_ns = v; }, "tests only");
  m.def("_set_memory_spin_ns", [](int64_t v) { memlens::g_memory_spin_ns = v; }, "tests only");
  m.def("own_ns", []() { return memlens::tl_own_ns; });
  m.def("own_ns_split", []() {
    return std::vector<int64_t>(memlens::tl_split, memlens::tl_split + 3);
  }, "this thread's recorder time so far (ns) in op-start callbacks, op-end callbacks, the memory hook");
  m.attr("OP_RECORD_BYTES") = int(sizeof(memlens::OpRec));
  m.attr("BLOCK_RECORD_BYTES") = int(sizeof(memlens::BlockRec));
}

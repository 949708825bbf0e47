// The recording as Python holds it (memlens_recorder.Recording): start, stop, hooks' calls, drain.
// Part of the compiled recorder: recorder.cpp includes it inside namespace memlens (one translation
// unit); not a standalone header.

#pragma once

// ---- the Python-facing handle -----------------------------------------------------------------
struct Handle {
  std::unique_ptr<Session> s;
  at::CallbackHandle cb = 0;
  std::shared_ptr<Reporter> reporter;   // the reporter this session receives events from
  std::unique_ptr<StackCapture> stack_capture;   // stacks=True (see op_stacks.h)
  bool pushed_reporter = false;
  std::string memory_note;
  // After drain_windowed(): which thread holds each op's accesses, how many, and a reader per thread.
  struct Windows {
    std::vector<uint32_t> thread, nacc;
    size_t next = 0;                                   // the first op not handed out yet
    std::vector<VarReader<int32_t, AccCodec>> readers;
  };
  std::unique_ptr<Windows> windows;

  Handle(int64_t max_bytes, std::string spill_prefix, bool memory) {
    s.reset(new Session());
    s->max_bytes = max_bytes;
    s->spill_prefix = std::move(spill_prefix);
    std::lock_guard<std::mutex> g(g_slots_mutex);
    for (int k = 0; k < kSlots; ++k) if (!g_slots[k]) { s->slot = k; break; }
    if (s->slot < 0) throw std::runtime_error("memlens: more than 16 compiled recordings at once");
    s->first_start = now();
    s->serial = g_next_serial.fetch_add(1);
    g_slots[s->slot] = s.get();
    s->active = true;
    g_serial[s->slot].store(s->serial);
    tl_state[s->slot] = ThreadState();
    cb = at::addThreadLocalCallback(make_callback(s->slot));
    s->cb = cb;
    if (memory) {
      auto* top = c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE);
      if (top == nullptr) {
        reporter = std::make_shared<Reporter>();
        c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, reporter);
        pushed_reporter = true;
      } else if (auto* ours = dynamic_cast<Reporter*>(top)) {
        reporter = std::static_pointer_cast<Reporter>(
            c10::ThreadLocalDebugInfo::_peek(c10::DebugInfoKind::PROFILER_STATE));
        (void)ours;
      } else {
        memory_note = "allocator-level events unavailable: a profiler is already running in this thread";
      }
      if (reporter) reporter->mask.fetch_or(1u << s->slot);
    }
  }

  // A recording dropped without stop() (an interpreter shutting down...) must not leave a callback
  // that points at freed memory.
  ~Handle() {
    try { stop(); } catch (...) {}
  }

  // Stop recording: remove the callback and the memory hook (safe to call twice).
  void stop() {
    if (s->slot < 0) return;
    // No thread enters the session's callbacks after this; wait for those inside to leave (their
    // callbacks take no lock we hold and call no Python: this is short). This thread's own count is
    // not waited for (it is not inside a callback when Python calls stop).
    std::vector<std::shared_ptr<ThreadBuf>> threads;
    {
      std::lock_guard<std::mutex> g(g_slots_mutex);
      g_serial[s->slot].store(0, std::memory_order_seq_cst);
      s->active = false;
      threads = s->threads;
    }
    ThreadBuf* mine = tl_state[s->slot].buf.get();
    for (auto& t : threads)
      while (t.get() != mine && t->busy.load(std::memory_order_acquire) > 0) std::this_thread::yield();
    {
      std::lock_guard<std::mutex> g(s->mu);
      // storages that died where no memory hook was installed (dropped by another thread): freed by now
      int64_t t = now();
      struct Dead { int32_t block; c10::StorageImpl* impl; int64_t ptr; };
      std::vector<Dead> dead;
      s->live.for_each([&](Live& e) { if (e.weak.expired()) dead.push_back(Dead{e.block, e.impl(), e.ptr}); });
      for (auto& d : dead) { s->late_frees++; s->free_block(d.block, d.impl, d.ptr, t); }
      s->cb = 0;
      for (auto& tb : s->threads) tb->publish();
      s->peak_bytes = std::max(s->peak_bytes, s->mem_bytes());   // the maps are cleared below
    }
    if (cb) { at::removeCallback(cb); cb = 0; }
    if (reporter) {
      reporter->mask.fetch_and(~(1u << s->slot));
      if (pushed_reporter) {
        try {
          auto top = c10::ThreadLocalDebugInfo::_peek(c10::DebugInfoKind::PROFILER_STATE);
          if (top.get() == reporter.get()) c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE);
          else memory_note = "the memory hook was not on top of the debug-info stack at the end; left in place, disabled";
        } catch (const std::exception& e) {
          memory_note = std::string("could not pop the memory hook: ") + e.what();
        }
      }
      reporter.reset();
    }
    {
      std::lock_guard<std::mutex> g(g_slots_mutex);
      g_slots[s->slot] = nullptr;
    }
    tl_state[s->slot] = ThreadState();
    s->live.clear();            // drop the weak pointers
    s->unreported.clear();
    s->slot = -1;
    module_stack.clear();
    module_index.clear();
    enter_slow = py::object();   // the session's bound method: no reference cycle after the end
  }

  // Python asks the block of a tensor (hooks: parameters, gradients, optimizer state, inputs).
  int64_t block_of_tensor(const at::Tensor& t) {
    int64_t t0 = raw_now();
    int64_t r = -1;
    if (t.defined()) {
      auto* impl = t.unsafeGetTensorImpl();
      const c10::Storage& st = impl->unsafe_storage();
      if (st && !impl->key_set().has(c10::DispatchKey::Python)) {
        std::lock_guard<std::mutex> g(s->mu);
        if (s->active) r = s->block_of(st, int32_t(s->n_ops.load()), true, nullptr);
      }
    }
    tl_own_ns += raw_now() - t0;
    return r;
  }
  // Categories (parameter, gradient, optimizer state...) for many tensors in one call: returns a flat
  // [block, category, op, module] list of the (block, category) pairs not marked before (the hooks
  // mark the same parameters and state every step; only the first time is a record).
  std::vector<int64_t> mark(const std::vector<at::Tensor>& tensors, const std::vector<int64_t>& categories,
                            int64_t module) {
    if (categories.size() != tensors.size()) throw std::invalid_argument("mark: one category per tensor");
    int64_t t0 = raw_now();
    std::vector<int64_t> out;
    {
      std::lock_guard<std::mutex> g(s->mu);
      if (s->active) {
        int64_t op = s->n_ops.load();
        for (size_t i = 0; i < tensors.size(); ++i) {
          const at::Tensor& t = tensors[i];
          int64_t category = categories[i];
          if (!t.defined()) continue;
          auto* impl = t.unsafeGetTensorImpl();
          const c10::Storage& st = impl->unsafe_storage();
          if (!st || impl->key_set().has(c10::DispatchKey::Python)) continue;
          int32_t b = s->block_of(st, int32_t(op), true, nullptr);
          if (b < 0 || !s->mark_once(b, category)) continue;
          out.insert(out.end(), {int64_t(b), category, op, module});
        }
      }
    }
    tl_own_ns += raw_now() - t0;
    return out;
  }
  int64_t n_ops() { return s->n_ops.load(); }
  void set_ctx(int64_t c) {
    std::lock_guard<std::mutex> g(s->mu);
    ctx = c;
    int64_t op = s->n_ops.load();
    s->set_ctx_at(op, c);
  }
  int64_t get_ctx() { std::lock_guard<std::mutex> g(s->mu); return ctx; }

  // ---- module context (module_context.h): the module stack kept for torch's forward hooks ---------
  struct ModuleFrame { uintptr_t key; int64_t caller_ctx; PyObject* module; };   // module: borrowed
  std::unordered_map<uintptr_t, int64_t> module_index;   // id(module) -> module index
  std::vector<ModuleFrame> module_stack;
  int64_t ctx = 0;                                       // module index << 2 | phase bits
  std::thread::id owner = std::this_thread::get_id();
  py::object enter_slow;                                 // Python: (module, args) -> None
  void push_module_locked(uintptr_t key, int64_t idx, PyObject* module);
  py::object enter_module(py::handle module, py::handle args);
  void push_module(py::handle module, int64_t idx);
  void exit_module(py::handle module, py::handle, py::handle);
  size_t module_depth();
  py::object module_top();
  void set_enter_slow(py::object f) { enter_slow = std::move(f); }
  bool active() { std::lock_guard<std::mutex> g(s->mu); return s->active; }

  // stacks=True: capture the Python stack of every op recorded from now on (frames whose filename
  // starts with one of `skip_prefixes` are not kept; at most `max_depth` kept frames per stack).
  void enable_stacks(std::vector<std::string> skip_prefixes, int64_t max_depth) {
    std::lock_guard<std::mutex> g(s->mu);
    if (stack_capture) throw std::runtime_error("memlens: stacks are already on for this recording");
    stack_capture.reset(new StackCapture());
    stack_capture->skip_prefixes = std::move(skip_prefixes);
    stack_capture->max_depth = size_t(std::max<int64_t>(max_depth, 0));
    stack_capture->first_op = s->n_ops.load();
    s->stacks.store(stack_capture.get());
  }
  // After stop(): {"first_op", "ids" (int32 stack id per op from first_op on), "stacks" (frames of
  // each stack), "bytes"}; None without stacks. No lock: no op is recorded after stop(), and Python
  // objects made here may run a GC that frees tensors (the memory hook would take the session mutex).
  py::object drain_stacks() {
    if (!stack_capture) return py::none();
    if (s->slot >= 0) throw std::runtime_error("memlens: drain_stacks() before stop()");
    return stack_capture->drain();
  }

  // ---- drain (drain.h): the records handed to Python after stop() --------------------------------
  void renumber_stacks(const std::vector<int64_t>& ids);
  // The threads' op, access and escape streams merged into the one sequence drain() hands to Python:
  // ops by op number, each op's accesses after the previous op's, each start a delta from the
  // previous op's (escaped when it does not fit, as record_end does). `ids`: the op numbers in order
  // (0..n-1 unless an internal error left a number unused).
  // Without accesses (`with_acc` false, the streaming save), `thread` and `nacc` say for each merged op
  // which thread's access stream holds its accesses and how many (8 bytes per op), for next_accesses().
  struct Merged {
    std::vector<OpRec> ops; std::vector<int32_t> acc; std::vector<WideRec> wide; std::vector<int64_t> ids;
    std::vector<uint32_t> thread, nacc;
  };
  Merged merge_threads(bool with_acc = true);
  // Op number -> place among the recorded ops (the number of ops numbered below it).
  static int64_t renumber(const std::vector<int64_t>& ids, int64_t op) {
    return int64_t(std::lower_bound(ids.begin(), ids.end(), op) - ids.begin());
  }
  template <typename T> static py::bytes as_bytes(const std::vector<T>& v) {
    return py::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }

  py::dict drain() { return drain_impl(false); }

  // As drain(), but the accesses stay in the threads' coded streams (in memory and spill files): "accesses"
  // is empty and next_accesses() hands them out a window of ops at a time, so a long recording is saved
  // without ever holding all its accesses (memlens.record(save_to=...)).
  py::dict drain_windowed() { return drain_impl(true); }

  py::tuple next_accesses(int64_t max_ops, int64_t max_records);
  void rewind_accesses();
  void close_windows();
  py::dict drain_impl(bool windowed);
};

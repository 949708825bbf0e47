// Module context: the forward pre/post hooks (Handle methods), so a module call costs one C++ call.
// Part of the compiled recorder: recorder.cpp includes it inside namespace memlens (one translation
// unit); not a standalone header.

#pragma once

// ---- module context: the forward pre/post hooks, registered with torch as these methods ----------
// The module stack lives here, so that entering and leaving a known module is one call from torch's
// hook loop into C++ (no Python frames). A module not seen yet, and a root module (its tensor
// arguments are the inputs), take the Python path (`enter_slow`, CompiledSession._enter_module_slow),
// which names it and pushes it with push_module(). Hooks run in every thread: only the thread that
// started the recording has its modules recorded (as the Python recorder's thread-local sessions).
inline void Handle::push_module_locked(uintptr_t key, int64_t idx, PyObject* module) {
  module_stack.push_back(ModuleFrame{key, ctx, module});
  int64_t c = (idx << 2) | (ctx & 3);
  ctx = c;
  int64_t op = s->n_ops.load();
  s->set_ctx_at(op, c);
}
inline py::object Handle::enter_module(py::handle module, py::handle args) {
  if (std::this_thread::get_id() != owner) return py::none();
  int64_t t0 = raw_now();
  uintptr_t key = uintptr_t(module.ptr());
  bool done = false;
  {
    std::lock_guard<std::mutex> g(s->mu);
    if (!s->active) done = true;
    else if (!module_stack.empty()) {
      auto it = module_index.find(key);
      if (it != module_index.end()) { push_module_locked(key, it->second, module.ptr()); done = true; }
    }
  }
  tl_own_ns += raw_now() - t0;
  if (done || !enter_slow) return py::none();
  return enter_slow(module, args);
}
// Python's slow path pushes a module it has named (and remembers its index for the fast path).
inline void Handle::push_module(py::handle module, int64_t idx) {
  std::lock_guard<std::mutex> g(s->mu);
  uintptr_t key = uintptr_t(module.ptr());
  module_index[key] = idx;
  push_module_locked(key, idx, module.ptr());
}
// Forward post-hook (also after an exception): pop back to the caller's module.
inline void Handle::exit_module(py::handle module, py::handle, py::handle) {
  if (std::this_thread::get_id() != owner) return;
  int64_t t0 = raw_now();
  uintptr_t key = uintptr_t(module.ptr());
  {
    std::lock_guard<std::mutex> g(s->mu);
    for (size_t i = module_stack.size(); i-- > 0;) {
      if (module_stack[i].key != key) continue;
      int64_t c = module_stack[i].caller_ctx;
      module_stack.resize(i);
      ctx = c;
      int64_t op = s->n_ops.load();
      s->set_ctx_at(op, c);
      break;
    }
  }
  tl_own_ns += raw_now() - t0;
}
inline size_t Handle::module_depth() { std::lock_guard<std::mutex> g(s->mu); return module_stack.size(); }
// The innermost module in forward (None when none): the parent of a module met for the first time.
inline py::object Handle::module_top() {
  std::lock_guard<std::mutex> g(s->mu);
  if (module_stack.empty()) return py::none();
  return py::reinterpret_borrow<py::object>(module_stack.back().module);
}

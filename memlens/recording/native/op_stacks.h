// memlens compiled recorder: the Python call stack of every recorded op (`memlens.record(stacks=True)`).
//
// Included by recorder.cpp (after VarStream); off unless Handle::enable_stacks was called. The same
// stacks as the Python recorder's StackTable (memlens/recording/stacks.py): at each recorded op's end the
// calling thread's Python frames are walked innermost first, frames whose file is inside torch or
// memlens (or frozen) are skipped, at most `max_depth` kept frames, each as (code object, f_lineno);
// identical stacks share one id, numbered in order of first capture. The op records hold the id
// (varint coded, ~1 B per op: consecutive ops mostly share a stack); names and files are read from the
// code objects once per distinct stack, at drain.
//
// Why not torch::CapturedTraceback::gather (what torch.cuda.memory._record_memory_history uses): it
// keeps every frame of every capture (torch's own included) as a separate heap object, deduplicated
// only when symbolized; the walk below costs the same GIL acquisition and frame walk, keeps only the
// user frames, and interns while capturing, so a million ops hold a few hundred stacks, not a million.
//
// Locking: the capture runs outside the session mutex (acquiring the GIL while holding it could
// deadlock against a Python thread that frees a tensor -- the memory hook takes that mutex with the
// GIL held). The table is touched only with the GIL held, which serializes it; the per-op id stream
// is pushed in record_end, under the session mutex, like the op record it belongs to.
//
// Not a standalone header: recorder.cpp includes it inside namespace memlens, after VarStream and the
// varint helpers it uses (Python's API comes with torch/extension.h).
#pragma once

struct StackIdCodec {             // stack id against the previous op's (mostly 0: the same stack)
  int64_t prev = 0;
  uint8_t* enc(uint8_t* p, const int32_t& r) {
    p = put_var(p, zz(dif(r, prev)));
    prev = r;
    return p;
  }
  const uint8_t* dec(const uint8_t* p, int32_t& r) {
    uint64_t v;
    p = get_var(p, v);
    prev = add(unzz(v), prev);
    r = int32_t(prev);
    return p;
  }
};

static inline bool python_usable() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

struct StackCapture {
  // code: a strong reference, released by release(); 16 bytes, no padding (stacks are keyed by raw bytes)
  struct CodeLine { PyObject* code; int64_t line; };
  std::vector<std::string> skip_prefixes;       // filename prefixes of frames not kept (torch, memlens)
  size_t max_depth = 32;                        // kept frames per stack (innermost first)
  int64_t first_op = 0;                         // ops recorded before stacks were on have no stack

  // GIL-protected (see the header comment)
  std::unordered_map<PyObject*, bool> hidden;   // code object (strong ref) -> its frames are skipped
  std::unordered_map<std::string, int32_t> ids; // raw bytes of a stack's frames -> stack id
  std::vector<CodeLine> frames;                 // all stacks' frames back to back
  std::vector<uint32_t> offsets{0};             // stack i = frames[offsets[i], offsets[i + 1])

  // Session::mu-protected: one stack id per op recorded since first_op (-1: none captured)
  VarStream<int32_t, StackIdCodec> op_ids;

  bool is_hidden(PyCodeObject* code) {
    auto it = hidden.find(reinterpret_cast<PyObject*>(code));
    if (it != hidden.end()) return it->second;
    Py_ssize_t n = 0;
    const char* file = PyUnicode_AsUTF8AndSize(code->co_filename, &n);
    bool hide = false;
    if (file == nullptr) { PyErr_Clear(); }
    else {
      std::string_view name(file, size_t(n));
      for (auto& p : skip_prefixes) if (name.substr(0, p.size()) == p) { hide = true; break; }
    }
    // keyed by address: the cache keeps the object, so that the address is not reused
    if (hidden.emplace(reinterpret_cast<PyObject*>(code), hide).second) Py_INCREF(code);
    return hide;
  }

  // The id of the calling thread's Python stack (user frames only); -1 when Python is unusable here.
  // Reentrant (a local `key`), should a finalizer run during the walk and record an op (see on_end).
  int32_t capture() {
    if (!python_usable()) return -1;
    PyGILState_STATE gil = PyGILState_Ensure();
    std::vector<CodeLine> key;
    key.reserve(16);
    PyFrameObject* f = PyEval_GetFrame();   // borrowed; null in a thread that runs no Python
    Py_XINCREF(f);
    while (f != nullptr && key.size() < max_depth) {
      PyCodeObject* code = PyFrame_GetCode(f);
      if (!is_hidden(code)) key.push_back(CodeLine{reinterpret_cast<PyObject*>(code), PyFrame_GetLineNumber(f)});
      Py_DECREF(code);   // a kept frame's code is held by `hidden` already
      PyFrameObject* back = PyFrame_GetBack(f);
      Py_DECREF(f);
      f = back;
    }
    Py_XDECREF(f);
    std::string raw(reinterpret_cast<const char*>(key.data()), key.size() * sizeof(CodeLine));
    auto it = ids.find(raw);
    int32_t id;
    if (it != ids.end()) id = it->second;
    else {
      id = int32_t(offsets.size() - 1);
      for (auto& fr : key) { Py_INCREF(fr.code); frames.push_back(fr); }
      offsets.push_back(uint32_t(frames.size()));
      ids.emplace(std::move(raw), id);
    }
    PyGILState_Release(gil);
    return id;
  }

  size_t mem_bytes() const {
    return op_ids.mem_bytes() + frames.capacity() * sizeof(CodeLine) + offsets.capacity() * 4 +
           ids.size() * 64 + hidden.size() * 32;
  }

  // {"first_op", "ids": int32 id per op as bytes, "stacks": [[(name, filename, line), ...] per stack],
  // "bytes": this table's peak memory}. Needs the GIL.
  py::dict drain() {
    py::dict d;
    d["bytes"] = mem_bytes();
    py::list stacks;
    for (size_t i = 0; i + 1 < offsets.size(); ++i) {
      py::list one;
      for (uint32_t j = offsets[i]; j < offsets[i + 1]; ++j) {
        auto* code = reinterpret_cast<PyCodeObject*>(frames[j].code);
        one.append(py::make_tuple(py::reinterpret_borrow<py::object>(code->co_name),
                                  py::reinterpret_borrow<py::object>(code->co_filename), py::int_(frames[j].line)));
      }
      stacks.append(one);
    }
    d["first_op"] = first_op;
    d["ids"] = op_ids.to_bytes();
    d["stacks"] = stacks;
    op_ids.clear();
    return d;
  }

  // Drop the references to code objects (with the GIL; skipped when the interpreter is gone).
  void release() {
    if (python_usable()) {
      PyGILState_STATE gil = PyGILState_Ensure();
      for (auto& fr : frames) Py_DECREF(fr.code);
      for (auto& kv : hidden) Py_DECREF(kv.first);
      PyGILState_Release(gil);
    }
    frames.clear(); offsets.assign(1, 0); ids.clear(); hidden.clear();
  }
  ~StackCapture() { release(); }
};

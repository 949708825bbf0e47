// Tests only: threads that inherit the recording thread's thread-local state.
// Part of the compiled recorder: recorder.cpp includes it inside namespace memlens (one translation
// unit); not a standalone header.

#pragma once

// Tests only: threads that inherit the calling thread's thread-local state (its recordings' callbacks,
// memory hook and dispatch modes), as autograd's device threads and at::launch tasks do, each running
// one Python callable. join() waits for them and raises the first error one of them raised.
struct InheritingThreads {
  std::vector<std::thread> threads;
  std::mutex mu;
  std::string error;
  explicit InheritingThreads(std::vector<py::function> fns) {
    at::ThreadLocalState state;
    for (auto& fn : fns) {
      threads.emplace_back([this, state, fn]() mutable {
        at::ThreadLocalStateGuard guard(state);
        py::gil_scoped_acquire gil;
        try { fn(); } catch (const std::exception& e) {
          std::lock_guard<std::mutex> g(mu);
          if (error.empty()) error = e.what();
        }
        fn = py::function();   // released here, under the GIL
      });
    }
  }
  void join() {
    {
      py::gil_scoped_release nogil;
      for (auto& t : threads) if (t.joinable()) t.join();
    }
    if (!error.empty()) throw std::runtime_error(error);
  }
  ~InheritingThreads() {
    if (PyGILState_Check()) { py::gil_scoped_release nogil; for (auto& t : threads) if (t.joinable()) t.join(); }
    else for (auto& t : threads) if (t.joinable()) t.join();
  }
};

// The allocator's memory-reporting hook: allocations and frees, as profile_memory sees them.
// Part of the compiled recorder: recorder.cpp includes it inside namespace memlens (one translation
// unit); not a standalone header.

#pragma once

// ---- memory reporting hook ------------------------------------------------------------------
int64_t g_memory_spin_ns = 0;   // tests only: make each memory hook call this much slower (the clock must not show it)
// A ProfilerStateBase, not a bare MemoryReportingInfoBase: torch reads whatever sits in the
// PROFILER_STATE slot as a ProfilerStateBase (profilerEnabled(), getProfilerConfig(): a custom
// autograd Function's apply asks both), so a bare one was read as garbage there (bad_alloc raised
// into the user's code). With a disabled config it says "no profiler is running".
struct Reporter : public torch::profiler::impl::ProfilerStateBase {
  Reporter() : ProfilerStateBase(torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::Disabled)) {}
  torch::profiler::impl::ActiveProfilerType profilerType() override {
    return torch::profiler::impl::ActiveProfilerType::NONE;
  }
  std::atomic<uint32_t> mask{0};
  void reportMemoryUsage(void* ptr, int64_t alloc_size, size_t, size_t, c10::Device device) override {
    int64_t t0 = raw_now();
    int64_t t = t0 - tl_own_ns;
    if (g_memory_spin_ns) while (raw_now() - t0 < g_memory_spin_ns) {}
    uint32_t m = mask.load(std::memory_order_acquire);
    for (int k = 0; k < kSlots && m; ++k, m >>= 1) {
      if (!(m & 1)) continue;
      ThreadState& ts = tl_state[k];
      ThreadBuf* b = enter(k, ts);
      if (!b) continue;
      Frame* frame = nullptr;
      for (size_t i = ts.depth; i-- > 0;) if (ts.frames[i].recorded) { frame = &ts.frames[i]; break; }
      try { b->session->on_memory(ptr, alloc_size, device, t, frame); } catch (...) {}
      leave(b);
    }
    { int64_t d = raw_now() - t0; tl_own_ns += d; tl_split[2] += d; }
  }
  bool memoryProfilingEnabled() const override { return true; }
};

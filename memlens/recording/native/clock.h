// The recorder's clock: monotonic ns minus the recorder's own time in this thread.
// Part of the compiled recorder: recorder.cpp includes it inside namespace memlens (one translation
// unit); not a standalone header.

#pragma once

static inline int64_t raw_now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// The recorder's own time in this thread (ns), subtracted from every timestamp.
thread_local int64_t tl_own_ns = 0;
static inline int64_t now() { return raw_now() - tl_own_ns; }
// The recorder's own time in this thread split by where it was spent: op start, op end, memory hook
// (benchmarks/recorder_overhead.py prints it).
thread_local int64_t tl_split[3] = {0, 0, 0};

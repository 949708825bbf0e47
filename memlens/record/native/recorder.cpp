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

constexpr int kSlots = 16;
constexpr int kNormal = 0, kView = 1, kMetadata = 2;

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

// ---- records --------------------------------------------------------------------------------
struct OpRec {             // 16 bytes (an escape record in `wide` holds what does not fit)
  int32_t dstart;          // start - previous op record's start (ns, corrected clock); INT32_MIN: see wide
  uint32_t dur;            // end - start (ns); UINT32_MAX: see wide
  int32_t aseq;            // autograd sequence counter after the op, or -2 - backward node's number
  uint32_t sig_nacc;       // interned signature << 8 | accesses appended by this op (255: see wide)
};
struct WideRec { int64_t op, kind, value; };   // escapes: kind 0 start, 1 duration, 2 accesses, 3 signature
struct CtxRec { int64_t op, ctx; };            // module context (module index << 2 | phase) from op `op` on
struct BlockRec {          // 24 bytes; block id = index
  int64_t ptr;
  int64_t size_dev;        // size | device index << 48
  uint32_t op_before;      // op index that made it (or the op count when first seen) | before << 31
  uint32_t alloc_dt;       // claimed: its allocation's time - the op's start (ns); UINT32_MAX: not claimed
};
#pragma pack(push, 4)
struct FreeRec { int64_t t; int32_t block; };      // 12 bytes
#pragma pack(pop)
struct MemRec { int64_t t, ptr, delta_dev; };      // 24 bytes: delta << 8 | device index

// A chunked append-only stream of fixed-size records (the rare ones: escapes, module contexts),
// spillable to a file. Chunks grow from 1 KiB to 8 KiB, so little memory is allocated and not yet used.
template <typename T>
struct Stream {
  struct Chunk { std::unique_ptr<T[]> data; size_t cap, used; };
  std::vector<Chunk> chunks;
  size_t n = 0;              // records in memory (over all chunks)
  size_t cap_total = 0;      // records allocated in memory
  size_t spilled = 0;        // records already written to `file`
  std::FILE* file = nullptr;

  T& push() {
    if (chunks.empty() || chunks.back().used == chunks.back().cap) {
      size_t cap = chunks.empty() ? std::max<size_t>(1, 1024 / sizeof(T))
                                  : std::min<size_t>(chunks.back().cap * 2, std::max<size_t>(1, 8192 / sizeof(T)));
      chunks.push_back(Chunk{std::unique_ptr<T[]>(new T[cap]), cap, 0});
      cap_total += cap;
    }
    Chunk& c = chunks.back();
    ++n;
    return c.data[c.used++];
  }
  size_t size() const { return spilled + n; }
  T& back() { return chunks.back().data[chunks.back().used - 1]; }
  size_t mem_bytes() const { return cap_total * sizeof(T); }
  // Write all chunks but the last to the spill file. Returns the bytes freed.
  size_t spill(const std::string& path) {
    if (chunks.size() < 2) return 0;
    if (!file) {
      file = std::fopen(path.c_str(), "w+b");
      if (!file) throw std::runtime_error("memlens: cannot open spill file " + path);
    }
    size_t freed = 0;
    for (size_t c = 0; c + 1 < chunks.size(); ++c) {
      if (std::fwrite(chunks[c].data.get(), sizeof(T), chunks[c].used, file) != chunks[c].used)
        throw std::runtime_error("memlens: spill write failed for " + path);
      spilled += chunks[c].used;
      n -= chunks[c].used;
      cap_total -= chunks[c].cap;
      freed += chunks[c].cap * sizeof(T);
    }
    chunks.erase(chunks.begin(), chunks.end() - 1);
    return freed;
  }
  // Everything (spilled then in memory), in order.
  std::vector<T> all() {
    std::vector<T> out(size());
    if (spilled) {
      std::fflush(file);
      std::rewind(file);
      if (std::fread(out.data(), sizeof(T), spilled, file) != spilled)
        throw std::runtime_error("memlens: could not read back spilled records");
    }
    T* dst = out.data() + spilled;
    for (auto& c : chunks) { std::copy(c.data.get(), c.data.get() + c.used, dst); dst += c.used; }
    return out;
  }
  // Everything (spilled then in memory) as one contiguous byte string (not a tensor: the drain
  // must not allocate through PyTorch, where an outer recorder or a user's profiler would see it).
  py::bytes to_bytes() {
    size_t total = size();
    std::string out(total * sizeof(T), '\0');
    char* dst = out.data();
    if (spilled) {
      std::fflush(file);
      std::rewind(file);
      if (std::fread(dst, sizeof(T), spilled, file) != spilled)
        throw std::runtime_error("memlens: could not read back spilled records");
      dst += spilled * sizeof(T);
    }
    for (auto& c : chunks) {
      std::memcpy(dst, c.data.get(), c.used * sizeof(T));
      dst += c.used * sizeof(T);
    }
    return py::bytes(out);
  }
  void clear() {
    chunks.clear();
    n = spilled = cap_total = 0;
    if (file) { std::fclose(file); file = nullptr; }
  }
};

// ---- compact streams: delta + varint coded records ----------------------------------------------
// The fixed-size records above are what drain() hands to Python; in memory, the large streams keep
// them delta-coded (each field against the previous record's) as LEB128 varints: an op takes ~8 bytes
// instead of 16, an access ~2 instead of 4, a block ~10 instead of 24, a free ~5 instead of 12.
static inline uint64_t zz(int64_t v) { return (uint64_t(v) << 1) ^ uint64_t(v >> 63); }
static inline int64_t unzz(uint64_t u) { return int64_t(u >> 1) ^ -int64_t(u & 1); }
static inline uint8_t* put_var(uint8_t* p, uint64_t v) {
  while (v >= 0x80) { *p++ = uint8_t(v) | 0x80; v >>= 7; }
  *p++ = uint8_t(v);
  return p;
}
static inline const uint8_t* get_var(const uint8_t* p, uint64_t& v) {
  uint64_t r = 0;
  int shift = 0;
  while (*p & 0x80) { r |= uint64_t(*p++ & 0x7F) << shift; shift += 7; }
  v = r | (uint64_t(*p++) << shift);
  return p;
}
static inline int64_t dif(int64_t a, int64_t b) { return int64_t(uint64_t(a) - uint64_t(b)); }
static inline int64_t add(int64_t a, int64_t b) { return int64_t(uint64_t(a) + uint64_t(b)); }

// Each codec holds the previous record's fields (one instance encodes, a fresh one decodes).
// An op as one thread's stream holds it: the record, and the op's number in the whole recording
// (numbers are handed out across threads; drain() merges the threads' streams by it).
struct ThreadOp { OpRec r; int64_t id; };
struct OpCodec {                  // start gap = dstart - previous duration (the idle time between ops)
  int64_t dur = 0, aseq = 0, id = -1;
  // the access count carries one more bit: set when the op number is not the previous one + 1 (another
  // thread recorded ops in between), then the gap follows; one thread alone pays nothing for it
  uint8_t* enc(uint8_t* p, const ThreadOp& o) {
    const OpRec& r = o.r;
    bool jump = o.id != id + 1;
    p = put_var(p, zz(dif(r.dstart, dur)));
    p = put_var(p, r.dur);
    p = put_var(p, zz(dif(r.aseq, aseq)));
    p = put_var(p, r.sig_nacc >> 8);
    p = put_var(p, uint64_t(r.sig_nacc & 0xFF) << 1 | (jump ? 1 : 0));
    if (jump) p = put_var(p, uint64_t(dif(o.id, id)));
    dur = r.dur; aseq = r.aseq; id = o.id;
    return p;
  }
  const uint8_t* dec(const uint8_t* p, ThreadOp& o) {
    OpRec& r = o.r;
    uint64_t v, sig;
    p = get_var(p, v); r.dstart = int32_t(add(unzz(v), dur));
    p = get_var(p, v); r.dur = uint32_t(v);
    p = get_var(p, v); r.aseq = int32_t(add(unzz(v), aseq));
    p = get_var(p, sig); p = get_var(p, v); r.sig_nacc = uint32_t(sig << 8 | (v >> 1));
    o.id = id + 1;
    if (v & 1) { p = get_var(p, v); o.id = add(id, int64_t(v)); }
    dur = r.dur; aseq = r.aseq; id = o.id;
    return p;
  }
};
struct AccCodec {                 // block id against the previous access's, read/write bit kept
  int64_t block = 0;
  uint8_t* enc(uint8_t* p, const int32_t& r) {
    p = put_var(p, zz(dif(r >> 1, block)) << 1 | uint64_t(r & 1));
    block = r >> 1;
    return p;
  }
  const uint8_t* dec(const uint8_t* p, int32_t& r) {
    uint64_t v;
    p = get_var(p, v);
    block = add(unzz(v >> 1), block);
    r = int32_t(block << 1 | int64_t(v & 1));
    return p;
  }
};
struct BlockCodec {
  int64_t ptr = 0, op = 0;
  uint8_t* enc(uint8_t* p, const BlockRec& r) {
    int64_t op_ = r.op_before & 0x7FFFFFFF;
    p = put_var(p, zz(dif(r.ptr, ptr)));
    p = put_var(p, uint64_t(r.size_dev));
    p = put_var(p, zz(dif(op_, op)) << 1 | (r.op_before >> 31));
    p = put_var(p, uint32_t(r.alloc_dt + 1u));        // UINT32_MAX (not claimed) -> 0
    ptr = r.ptr; op = op_;
    return p;
  }
  const uint8_t* dec(const uint8_t* p, BlockRec& r) {
    uint64_t v;
    p = get_var(p, v); r.ptr = ptr = add(unzz(v), ptr);
    p = get_var(p, v); r.size_dev = int64_t(v);
    p = get_var(p, v); op = add(unzz(v >> 1), op); r.op_before = uint32_t(op) | uint32_t(v & 1) << 31;
    p = get_var(p, v); r.alloc_dt = uint32_t(v) - 1u;
    return p;
  }
};
struct FreeCodec {
  int64_t t = 0, block = 0;
  uint8_t* enc(uint8_t* p, const FreeRec& r) {
    p = put_var(p, zz(dif(r.t, t)));
    p = put_var(p, zz(dif(r.block, block)));
    t = r.t; block = r.block;
    return p;
  }
  const uint8_t* dec(const uint8_t* p, FreeRec& r) {
    uint64_t v;
    p = get_var(p, v); r.t = t = add(unzz(v), t);
    p = get_var(p, v); block = add(unzz(v), block); r.block = int32_t(block);
    return p;
  }
};
struct CtxCodec {                 // op index only grows; the context word against the previous one
  int64_t op = 0, ctx = 0;
  uint8_t* enc(uint8_t* p, const CtxRec& r) {
    p = put_var(p, uint64_t(dif(r.op, op)));
    p = put_var(p, zz(dif(r.ctx, ctx)));
    op = r.op; ctx = r.ctx;
    return p;
  }
  const uint8_t* dec(const uint8_t* p, CtxRec& r) {
    uint64_t v;
    p = get_var(p, v); r.op = op = add(int64_t(v), op);
    p = get_var(p, v); r.ctx = ctx = add(unzz(v), ctx);
    return p;
  }
};
struct MemCodec {
  int64_t t = 0, ptr = 0;
  uint8_t* enc(uint8_t* p, const MemRec& r) {
    p = put_var(p, zz(dif(r.t, t)));
    p = put_var(p, zz(dif(r.ptr, ptr)));
    p = put_var(p, zz(r.delta_dev));
    t = r.t; ptr = r.ptr;
    return p;
  }
  const uint8_t* dec(const uint8_t* p, MemRec& r) {
    uint64_t v;
    p = get_var(p, v); r.t = t = add(unzz(v), t);
    p = get_var(p, v); r.ptr = ptr = add(unzz(v), ptr);
    p = get_var(p, v); r.delta_dev = unzz(v);
    return p;
  }
};

// A chunked append-only stream of varint-coded records, spillable to a file; drained back into
// fixed-size records T. A new chunk is a quarter of what the stream holds (128 B to 8 KiB), and records
// run on across chunk ends (the stream is one byte sequence), so the unused tail of the last chunk
// stays within ~25% of the stream and a short stream holds little more than its records (doubling
// chunks left up to 50% unused in short recordings; 512 B first chunks kept small streams at 512 B).
template <typename T, typename Codec>
struct VarStream {
  static constexpr size_t kMaxRecord = 64;   // worst case of one coded record (6 varints, <= 60 B)
  struct Chunk { std::unique_ptr<uint8_t[]> data; uint32_t cap, used; };   // 16 B
  std::vector<Chunk> chunks;
  Codec codec;
  size_t n = 0;               // records (in memory and spilled)
  size_t cap_total = 0;       // bytes allocated in memory
  size_t spilled_bytes = 0;
  std::FILE* file = nullptr;

  void push(const T& r) {
    if (!chunks.empty() && chunks.back().cap - chunks.back().used >= kMaxRecord) {
      Chunk& c = chunks.back();
      c.used = uint32_t(codec.enc(c.data.get() + c.used, r) - c.data.get());
    } else {   // near a chunk's end: coded aside, it fills this chunk to the last byte, the rest goes on
      uint8_t coded[kMaxRecord];
      size_t len = size_t(codec.enc(coded, r) - coded);
      const uint8_t* src = coded;
      while (len) {
        if (chunks.empty() || chunks.back().used == chunks.back().cap) add_chunk();
        Chunk& c = chunks.back();
        size_t k = std::min<size_t>(len, c.cap - c.used);
        std::memcpy(c.data.get() + c.used, src, k);
        c.used += k; src += k; len -= k;
      }
    }
    ++n;
  }
  void add_chunk() {
    if (chunks.size() == chunks.capacity()) chunks.reserve(chunks.size() + 4);   // a short list: not doubled
    size_t cap = std::min<size_t>(std::max<size_t>(128, (cap_total / 4 + 63) & ~size_t(63)), 8192);
    chunks.push_back(Chunk{std::unique_ptr<uint8_t[]>(new uint8_t[cap]), uint32_t(cap), 0});
    cap_total += cap;
  }
  size_t size() const { return n; }
  // the chunks and their list
  size_t mem_bytes() const { return cap_total + chunks.capacity() * sizeof(Chunk); }
  size_t spill(const std::string& path) {
    if (chunks.size() < 2) return 0;
    if (!file) {
      file = std::fopen(path.c_str(), "w+b");
      if (!file) throw std::runtime_error("memlens: cannot open spill file " + path);
    }
    size_t freed = 0;
    for (size_t c = 0; c + 1 < chunks.size(); ++c) {
      if (std::fwrite(chunks[c].data.get(), 1, chunks[c].used, file) != chunks[c].used)
        throw std::runtime_error("memlens: spill write failed for " + path);
      spilled_bytes += chunks[c].used;
      cap_total -= chunks[c].cap;
      freed += chunks[c].cap;
    }
    chunks.erase(chunks.begin(), chunks.end() - 1);
    return freed;
  }
  // All records, decoded, in order.
  std::vector<T> decode_all() {
    std::string coded;
    if (spilled_bytes) {
      coded.resize(spilled_bytes);
      std::fflush(file);
      std::rewind(file);
      if (std::fread(coded.data(), 1, spilled_bytes, file) != spilled_bytes)
        throw std::runtime_error("memlens: could not read back spilled records");
    }
    for (auto& c : chunks) coded.append(reinterpret_cast<const char*>(c.data.get()), c.used);
    std::vector<T> out(n);
    Codec dec;
    const uint8_t* p = reinterpret_cast<const uint8_t*>(coded.data());
    const uint8_t* e = p + coded.size();
    for (size_t i = 0; i < n; ++i) {
      if (p >= e) throw std::runtime_error("memlens: truncated record stream");
      p = dec.dec(p, out[i]);
    }
    return out;
  }
  // All records, decoded into fixed-size records, as one byte string.
  py::bytes to_bytes() {
    std::vector<T> all = decode_all();
    return py::bytes(reinterpret_cast<const char*>(all.data()), all.size() * sizeof(T));
  }
  void clear() {
    chunks.clear();
    n = cap_total = spilled_bytes = 0;
    codec = Codec();
    if (file) { std::fclose(file); file = nullptr; }
  }
};

// Reads a VarStream's records in order a buffer at a time (its spilled bytes from the file, then the
// in-memory chunks), so a stream is decoded without holding all its records: the streaming save reads
// the accesses this way, a window of ops at a time. The stream must not grow while it is read.
template <typename T, typename Codec>
struct VarReader {
  static constexpr size_t kBuffer = 1 << 16;   // bytes read ahead (64 KiB)
  const VarStream<T, Codec>* src = nullptr;
  Codec codec;
  std::vector<uint8_t> buf;   // undecoded bytes are buf[pos, size)
  size_t pos = 0, file_read = 0, chunk = 0, chunk_pos = 0, done = 0;

  void reset(const VarStream<T, Codec>* stream) {
    src = stream; codec = Codec(); buf.clear(); pos = file_read = chunk = chunk_pos = done = 0;
    if (src->file) { std::fflush(src->file); std::rewind(src->file); }
  }
  void refill() {
    buf.erase(buf.begin(), buf.begin() + pos);
    pos = 0;
    while (buf.size() < kBuffer) {
      size_t want = kBuffer - buf.size(), old = buf.size();
      if (file_read < src->spilled_bytes) {
        size_t k = std::min(want, src->spilled_bytes - file_read);
        buf.resize(old + k);
        if (std::fread(buf.data() + old, 1, k, src->file) != k)
          throw std::runtime_error("memlens: could not read back spilled records");
        file_read += k;
      } else if (chunk < src->chunks.size()) {
        const auto& c = src->chunks[chunk];
        size_t k = std::min(want, size_t(c.used) - chunk_pos);
        buf.insert(buf.end(), c.data.get() + chunk_pos, c.data.get() + chunk_pos + k);
        chunk_pos += k;
        if (chunk_pos >= c.used) { ++chunk; chunk_pos = 0; }
      } else {
        break;
      }
    }
  }
  void next(T& out) {
    if (done >= src->n) throw std::runtime_error("memlens: read past the end of a record stream");
    if (buf.size() - pos < VarStream<T, Codec>::kMaxRecord) refill();
    if (pos >= buf.size()) throw std::runtime_error("memlens: truncated record stream");
    pos = size_t(codec.dec(buf.data() + pos, out) - buf.data());
    ++done;
  }
};

#include "op_stacks.h"   // stacks=True: the Python stack of each op (StackCapture)

// ---- per-op facts from the schema, learned once ----------------------------------------------
struct OpInfo {
  int32_t name_id = -1;
  int kind = kNormal;
  bool skip = false;             // not an ATen op (a named scope): ignore entirely
  bool transparent = false;      // a CompositeImplicitAutograd decomposition: its children are the ops
  bool transparent_nested = false;
  bool resizes = false;
  int write_if = -1;             // the writes apply only when this argument is true
  std::vector<uint8_t> writes;   // per schema argument: 1 when written
  bool any_write = false;
  // Set (relaxed atomic store, any thread) once an op of this name ran other ops inside its kernel in
  // this recording: only then is the callback switched off around it (see g_quiet). A leaf op's
  // disable/enable pair rebuilds RecordFunction's callback cache twice for nothing (~1300
  // instructions, more than the rest of its start callback).
  uint8_t nests = 0;
};

struct PendingAlloc { int64_t t, ptr, size; int16_t dev; };

struct Frame {
  bool recorded = false;
  at::CallbackHandle quieted = 0;      // our callback, switched off by this frame for the op's kernel
  int64_t start = 0;
  OpInfo* info = nullptr;
  std::vector<std::pair<c10::StorageImpl*, uint8_t>> inputs;  // storages of the inputs (post-op check)
  std::vector<c10::Storage> pins;      // resizing ops only: keep `self`'s storage for the op
  int32_t self_block = -1;             // resizing ops: self's block before the op
  int64_t self_ptr = 0, self_size = 0;
  std::vector<PendingAlloc> allocs;    // allocations during this op (this thread)
  uint32_t no_storage = 0;
  bool any_nested = false;
  uint64_t nested_before = 0;          // ThreadState::nested_seen at this op's start
  std::string sig;                     // signature bytes of the inputs
  int32_t stack = -1;                  // stacks=True: the op's Python stack id (op_stacks.h)
};

struct Live {                                      // 24 B
  int64_t ptr;
  c10::weak_intrusive_ptr<c10::StorageImpl> weak;  // keeps the address from being reused, not the data
  int32_t block;
  bool claimed;                                    // its allocation is in its block record
  bool owns_ptr;                                   // the address index points here (see LiveMap)
  c10::StorageImpl* impl() const { return weak._unsafe_get_target(); }   // the storage (the map's key)
};

// The live blocks, found by storage (every access) and by data address (the allocator's free
// reports): one dense array of entries and two open-addressing indexes of int32 positions into it
// (linear probing, at most 3/4 full, deletion by backward shift, so no tombstones). 24 B per live
// storage plus 2 x 4 B per index slot, where two node-based std::unordered_maps took ~100 B (and
// c10's ska::flat_hash_map, at its 0.5 load factor with 40 B slots, would take ~150 B).
// Pointers into `entries` are valid until the next insert or erase.
struct LiveMap {
  std::vector<Live> entries;
  std::vector<int32_t> by_impl, by_ptr;   // positions in `entries`; -1: empty slot; power-of-two sizes

  static size_t hash(uint64_t k) { k ^= k >> 33; k *= 0xff51afd7ed558ccdULL; k ^= k >> 33; return size_t(k); }
  static size_t key_impl(const Live& e) { return hash(uint64_t(reinterpret_cast<uintptr_t>(e.impl()))); }
  static size_t key_ptr(const Live& e) { return hash(uint64_t(e.ptr)); }
  size_t size() const { return entries.size(); }
  size_t mem_bytes() const { return entries.capacity() * sizeof(Live) + (by_impl.capacity() + by_ptr.capacity()) * 4; }

  Live* find(c10::StorageImpl* impl) {
    if (by_impl.empty()) return nullptr;
    size_t mask = by_impl.size() - 1;
    for (size_t i = hash(uint64_t(reinterpret_cast<uintptr_t>(impl))) & mask;; i = (i + 1) & mask) {
      int32_t p = by_impl[i];
      if (p < 0) return nullptr;
      if (entries[p].impl() == impl) return &entries[p];
    }
  }
  // The newest live storage at data address `ptr`.
  Live* find_ptr(int64_t ptr) {
    if (by_ptr.empty()) return nullptr;
    size_t mask = by_ptr.size() - 1;
    for (size_t i = hash(uint64_t(ptr)) & mask;; i = (i + 1) & mask) {
      int32_t p = by_ptr[i];
      if (p < 0) return nullptr;
      if (entries[p].ptr == ptr) return &entries[p];
    }
  }
  // Adds `e` (its storage not in the map); at the same address as a live one, it takes over the address.
  void insert(Live&& e) {
    if (4 * (entries.size() + 1) > 3 * by_impl.size()) rehash(std::max<size_t>(16, by_impl.size() * 2));
    int32_t pos = int32_t(entries.size());
    size_t mask = by_impl.size() - 1;
    size_t i = key_impl(e) & mask;
    while (by_impl[i] >= 0) i = (i + 1) & mask;
    by_impl[i] = pos;
    for (i = key_ptr(e) & mask; by_ptr[i] >= 0; i = (i + 1) & mask)
      if (entries[by_ptr[i]].ptr == e.ptr) { entries[by_ptr[i]].owns_ptr = false; break; }
    by_ptr[i] = pos;
    e.owns_ptr = true;
    if (entries.size() == entries.capacity()) entries.reserve(entries.size() + entries.size() / 4 + 4);   // not 2x
    entries.push_back(std::move(e));
  }
  void erase(Live* e) {
    int32_t pos = int32_t(e - entries.data());
    unlink(by_impl, slot_of(by_impl, key_impl(*e), pos), &key_impl);
    if (e->owns_ptr) unlink(by_ptr, slot_of(by_ptr, key_ptr(*e), pos), &key_ptr);
    int32_t last = int32_t(entries.size()) - 1;
    if (pos != last) {   // the last entry moves into the hole: its index slots follow it
      Live& moved = entries[last];
      by_impl[slot_of(by_impl, key_impl(moved), last)] = pos;
      if (moved.owns_ptr) by_ptr[slot_of(by_ptr, key_ptr(moved), last)] = pos;
      entries[pos] = std::move(moved);
    }
    entries.pop_back();
  }
  template <typename F> void for_each(F f) { for (auto& e : entries) f(e); }
  void clear() {
    std::vector<Live>().swap(entries);
    std::vector<int32_t>().swap(by_impl);
    std::vector<int32_t>().swap(by_ptr);
  }

 private:
  static size_t slot_of(const std::vector<int32_t>& index, size_t h, int32_t pos) {
    size_t mask = index.size() - 1;
    size_t i = h & mask;
    while (index[i] != pos) i = (i + 1) & mask;
    return i;
  }
  // Empties slot i, moving later entries of its probe run back so that every run stays unbroken.
  void unlink(std::vector<int32_t>& index, size_t i, size_t (*key)(const Live&)) {
    size_t mask = index.size() - 1;
    index[i] = -1;
    for (size_t j = (i + 1) & mask; index[j] >= 0; j = (j + 1) & mask) {
      size_t home = key(entries[index[j]]) & mask;
      if (((j - home) & mask) >= ((j - i) & mask)) {   // its home is not in (i, j]: it may move to i
        index[i] = index[j];
        index[j] = -1;
        i = j;
      }
    }
  }
  void rehash(size_t n) {
    by_impl.assign(n, -1);
    by_ptr.assign(n, -1);
    size_t mask = n - 1;
    for (size_t p = 0; p < entries.size(); ++p) {
      size_t i = key_impl(entries[p]) & mask;
      while (by_impl[i] >= 0) i = (i + 1) & mask;
      by_impl[i] = int32_t(p);
      if (!entries[p].owns_ptr) continue;
      for (i = key_ptr(entries[p]) & mask; by_ptr[i] >= 0; i = (i + 1) & mask) {}
      by_ptr[i] = int32_t(p);
    }
  }
};

// Interned signatures: their coded bytes back to back in one arena, the offsets, and an open-addressing
// index of (hash, id) slots -- ~12 B of bookkeeping per signature where a string object and a hash-map
// node each cost ~96 B (a 3-step recording of a small model holds 50-200 signatures).
struct SigTable {
  struct Slot { uint32_t hash; int32_t id; };   // id -1: empty
  std::vector<char> arena;                      // (a vector: reserve() is exact, a string's doubles)
  std::vector<uint32_t> offsets{0};             // signature i = arena[offsets[i], offsets[i + 1])
  std::vector<Slot> slots;                      // power-of-two size, at most 7/8 full (hashes compared first)

  size_t size() const { return offsets.size() - 1; }
  std::string_view get(size_t i) const {
    return std::string_view(arena.data() + offsets[i], offsets[i + 1] - offsets[i]);
  }
  int32_t intern(const std::string& s) {
    if (slots.empty()) slots.assign(64, Slot{0, -1});
    uint32_t h = uint32_t(std::hash<std::string_view>{}(s));
    size_t mask = slots.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      Slot& slot = slots[i];
      if (slot.id < 0) {
        int32_t id = int32_t(size());
        // grown by a quarter, not doubled: short recordings hold 50-200 signatures, all kept to the end
        if (arena.size() + s.size() > arena.capacity())
          arena.reserve(std::max(arena.size() + s.size(), arena.capacity() + arena.capacity() / 4 + 64));
        if (offsets.size() == offsets.capacity()) offsets.reserve(offsets.size() + offsets.size() / 4 + 16);
        arena.insert(arena.end(), s.begin(), s.end());
        offsets.push_back(uint32_t(arena.size()));
        slot = Slot{h, id};
        if (8 * size() > 7 * slots.size()) grow();   // at most 7/8 full
        return id;
      }
      if (slot.hash == h && get(size_t(slot.id)) == std::string_view(s)) return slot.id;
    }
  }
  void grow() {
    std::vector<Slot> bigger(slots.size() * 2, Slot{0, -1});
    size_t mask = bigger.size() - 1;
    for (const Slot& slot : slots) {
      if (slot.id < 0) continue;
      size_t i = slot.hash & mask;
      while (bigger[i].id >= 0) i = (i + 1) & mask;
      bigger[i] = slot;
    }
    slots.swap(bigger);
  }
  size_t mem_bytes() const {
    return arena.capacity() + offsets.capacity() * sizeof(uint32_t) + slots.capacity() * sizeof(Slot);
  }
  void clear() { std::vector<char>().swap(arena); offsets.assign(1, 0); slots.clear(); slots.shrink_to_fit(); }
};

// One thread's map from an op name's address to the session's facts for it: an open-addressing array
// (linear probing, at most half full), so a lookup on every op touches one cache line, where a node-based
// std::unordered_map touched a bucket and a node (both cold after a kernel ran).
struct OpFactsCache {
  struct Slot { const char* name; OpInfo* info; };
  std::vector<Slot> slots;   // power-of-two size; name nullptr: empty

  static size_t hash(const char* name) {
    uint64_t k = uint64_t(reinterpret_cast<uintptr_t>(name));
    return size_t((k * 0x9E3779B97F4A7C15ULL) >> 32);
  }
  OpInfo* find(const char* name) const {
    if (slots.empty()) return nullptr;
    size_t mask = slots.size() - 1;
    for (size_t i = hash(name) & mask;; i = (i + 1) & mask) {
      if (slots[i].name == name) return slots[i].info;
      if (!slots[i].name) return nullptr;
    }
  }
  void insert(const char* name, OpInfo* info) {   // `name` not in the cache
    if (2 * (count + 1) > slots.size()) {
      std::vector<Slot> old;
      old.swap(slots);
      slots.assign(std::max<size_t>(64, old.size() * 2), Slot{nullptr, nullptr});
      count = 0;
      for (const Slot& e : old) if (e.name) insert(e.name, e.info);
    }
    size_t mask = slots.size() - 1;
    size_t i = hash(name) & mask;
    while (slots[i].name) i = (i + 1) & mask;
    slots[i] = Slot{name, info};
    ++count;
  }
 private:
  size_t count = 0;
};

struct Session;
Session* g_slots[kSlots] = {nullptr};
std::mutex g_slots_mutex;
// The serial number of the session in each slot (0: none). A thread's buffer belongs to the session
// with its serial; serials are never reused, so a buffer left over from an ended session is never
// taken for the current one (its `session` pointer may be stale: it is only used after a match).
std::atomic<uint64_t> g_serial[kSlots];
std::atomic<uint64_t> g_next_serial{1};

// One recording thread's own records (ops, accesses, escapes): only that thread appends to them, with
// no lock, so threads feeding one session (autograd's device threads, threads that inherited the
// recording's thread-local state) do not wait for each other there. The session holds every thread's
// buffer (a thread that ends keeps its records) and the thread holds its own (so that a thread still
// inside a callback when the session ends never touches freed memory). drain() merges the buffers by
// op number.
struct ThreadBuf {
  // > 0 while this thread is inside the session's callbacks: stop() waits for 0 before the buffers
  // are read (written by this thread only; read by stop())
  std::atomic<int> busy{0};
  uint64_t serial = 0;
  Session* session = nullptr;
  int index = 0;                                // registration order (names its spill files)
  VarStream<ThreadOp, OpCodec> ops;
  VarStream<int32_t, AccCodec> acc;
  Stream<WideRec> wide;
  int64_t last_start = 0;                       // op starts are deltas from this thread's previous op
  size_t n_ops = 0;
  std::atomic<int64_t> published_bytes{0};      // mem_bytes() as of its last budget check (other threads read it)
  OpFactsCache op_cache;                        // the session's op facts, found without its lock
  std::vector<int32_t> pending_acc;             // this op's accesses, collected under the session lock

  size_t mem_bytes() const { return ops.mem_bytes() + acc.mem_bytes() + wide.mem_bytes(); }
  void publish() { published_bytes.store(int64_t(mem_bytes()), std::memory_order_relaxed); }
  void clear() { ops.clear(); acc.clear(); wide.clear(); publish(); }
};

struct ThreadState {
  std::vector<Frame> frames;   // frames[0, depth): one per RecordFunction in flight (reused, not freed)
  size_t depth = 0;
  int suppress = 0;            // recorded ops in flight: nested ops are inside their kernels
  // Ops started inside a recorded op's kernel (not recorded): only counted, so that their end
  // callbacks are matched without a frame or a clock read. Their callbacks' few ns stay in the
  // recorded op's duration (as RecordFunction's own boxing of them does).
  size_t nested = 0;
  uint64_t nested_seen = 0;    // nested ops seen so far (not quieted): tells which ops nest (OpInfo::nests)
  std::shared_ptr<ThreadBuf> buf;   // this thread's buffer in the session of this slot (see ThreadBuf)
  Frame& push() {
    if (depth == frames.size()) frames.emplace_back();
    Frame& f = frames[depth++];
    f.recorded = false;
    f.quieted = 0;
    f.info = nullptr;
    f.inputs.clear(); f.pins.clear(); f.allocs.clear();
    f.self_block = -1; f.no_storage = 0; f.any_nested = false;
    return f;
  }
};
thread_local ThreadState tl_state[kSlots];

struct Session {
  int slot = -1;
  uint64_t serial = 0;
  at::CallbackHandle cb = 0;   // our RecordFunction callback (in the recording thread)
  // Guards what threads share: the block maps and block/free/allocator-event streams, signatures,
  // op facts, module contexts, the list of thread buffers (registration also holds g_slots_mutex).
  std::mutex mu;
  std::atomic<bool> active{false};
  // Ops recorded so far, over all threads: an op's number is taken when its record is written (at its
  // end, under `mu`), so blocks, marks and context changes refer to the same numbering. Within a
  // thread that is start order; across threads it is end order, as the Python recorder's.
  std::atomic<int64_t> n_ops{0};
  std::vector<std::shared_ptr<ThreadBuf>> threads;
  std::string stop_reason;
  int64_t max_bytes;
  std::string spill_prefix;
  int64_t spilled_bytes = 0;
  int64_t peak_bytes = 0;

  VarStream<BlockRec, BlockCodec> blocks;
  VarStream<FreeRec, FreeCodec> frees;
  VarStream<MemRec, MemCodec> mem;
  // Module context changes (one per module enter/exit): varint coded, ~3 B each. The newest one is
  // held back in `ctx_last` so that a change with no op under the previous one replaces it.
  VarStream<CtxRec, CtxCodec> ctxs;
  std::atomic<StackCapture*> stacks{nullptr};   // stacks=True (owned by the Handle)
  CtxRec ctx_last{-1, 0};
  void set_ctx_at(int64_t op, int64_t c) {
    if (ctx_last.op == op) { ctx_last.ctx = c; return; }   // no op ran under the last one
    if (ctx_last.op >= 0) ctxs.push(ctx_last);
    ctx_last = CtxRec{op, c};
  }
  int64_t first_start = 0;   // each thread's first op start is a delta from this
  int64_t tensors_without_storage = 0;
  int64_t late_frees = 0;      // frees found only at the end (the storage died in a thread without the hook)
  int64_t own_ns_total = 0;

  // Categories already marked per block (see Handle::mark): bit `category` of marked_bits[block] for
  // categories 0-7 (all of attribution.py's), the set for any other.
  std::vector<uint8_t> marked_bits;
  std::unordered_set<int64_t> marked_other;   // block << 8 | category
  std::unordered_map<const char*, OpInfo> op_cache;
  std::vector<std::string> op_names;
  SigTable sigs;                      // signatures, stored once
  LiveMap live;                         // storage -> block, data address -> storage (live blocks with bytes)
  // Live blocks whose free the allocator may not report (their storages: a storage freed since, and
  // its address taken by a new one, is told apart by the entry's `claimed`, see sweep)
  std::vector<c10::StorageImpl*> unreported;
  size_t sweep_every = 1, since_sweep = 0;
  std::vector<std::string> devices;
  std::unordered_map<std::string, int16_t> device_idx;
  c10::Device last_device{c10::DeviceType::CPU};
  int16_t last_device_idx = -1;

  // Bytes held: the shared part exactly, each thread's buffer as of its last budget check (exact
  // once the recording is stopped: stop() publishes every buffer). Call with `mu` held.
  int64_t mem_bytes() const {
    int64_t per_thread = 0;
    for (auto& t : threads) per_thread += t->published_bytes.load(std::memory_order_relaxed);
    return per_thread + int64_t(threads.capacity() * sizeof(threads[0]) + threads.size() * sizeof(ThreadBuf)) +
           int64_t(blocks.mem_bytes() + frees.mem_bytes() +
                   mem.mem_bytes() + ctxs.mem_bytes() + sigs.mem_bytes() +
                   // hash-map nodes with their allocation overhead and bucket pointer, side vectors
                   live.mem_bytes() + marked_bits.capacity() + marked_other.size() * 32 +
                   unreported.capacity() * sizeof(unreported[0]));
  }
  // True the first time (block, category) is marked.
  bool mark_once(int32_t block, int64_t category) {
    if (category < 0 || category > 7) return marked_other.insert((int64_t(block) << 8) | (category & 0xFF)).second;
    if (size_t(block) >= marked_bits.size()) marked_bits.resize(std::max<size_t>(size_t(block) + 1, blocks.size()), 0);
    uint8_t bit = uint8_t(1u << category);
    if (marked_bits[block] & bit) return false;
    marked_bits[block] |= bit;
    return true;
  }
  // Called by thread buffer `t`'s own thread with `mu` held: over the budget, that thread spills its
  // own streams and the shared ones (each other thread spills its own at its next check).
  void check_budget(ThreadBuf* t) {
    t->publish();
    int64_t used = mem_bytes();
    if (used > peak_bytes) peak_bytes = used;
    if (used <= max_bytes) return;
    std::string own = spill_prefix + ".t" + std::to_string(t->index);
    spilled_bytes += t->acc.spill(own + ".acc");
    spilled_bytes += t->ops.spill(own + ".ops");
    spilled_bytes += t->wide.spill(own + ".wide");
    t->publish();
    spilled_bytes += mem.spill(spill_prefix + ".mem");
    spilled_bytes += frees.spill(spill_prefix + ".frees");
    spilled_bytes += blocks.spill(spill_prefix + ".blocks");
    spilled_bytes += ctxs.spill(spill_prefix + ".ctx");
    if (StackCapture* sc = stacks.load()) spilled_bytes += sc->op_ids.spill(spill_prefix + ".stacks");
  }

  int16_t device_index(const c10::Device& d) {
    if (d == last_device && last_device_idx >= 0) return last_device_idx;   // nearly always one device
    std::string s = d.str();
    last_device = d;
    last_device_idx = -1;
    auto it = device_idx.find(s);
    if (it != device_idx.end()) return last_device_idx = it->second;
    int16_t i = int16_t(devices.size());
    devices.push_back(s);
    device_idx.emplace(s, i);
    return last_device_idx = i;
  }

  // The block of `st` (discovering it if new). `before`: existed before op `op`. -1: no bytes.
  int32_t block_of(const c10::Storage& st, int32_t op, bool before, Frame* frame) {
    c10::StorageImpl* impl = st.unsafeGetStorageImpl();
    if (Live* known = live.find(impl)) return known->block;
    int64_t size = int64_t(st.nbytes());
    if (size == 0) return -1;
    c10::Device dev = st.device();
    if (dev.type() == c10::DeviceType::Meta) return -1;
    int64_t ptr = int64_t(reinterpret_cast<intptr_t>(st.data()));
    int32_t bid = int32_t(blocks.size());
    BlockRec b;
    b.ptr = ptr;
    b.size_dev = size | (int64_t(device_index(dev)) << 48);
    b.op_before = uint32_t(op) | (before ? (1u << 31) : 0u);
    b.alloc_dt = UINT32_MAX;
    if (!before && frame) {   // a fresh output: its allocation, seen during this op, is folded in
      auto& al = frame->allocs;
      for (size_t i = 0; i < al.size(); ++i) {
        int64_t dt = al[i].t - frame->start;
        if (al[i].ptr == ptr && al[i].size == size && dt >= 0 && dt < int64_t(UINT32_MAX)) {
          b.alloc_dt = uint32_t(dt);
          al.erase(al.begin() + i);
          break;
        }
      }
    }
    blocks.push(b);
    bool claimed = b.alloc_dt != UINT32_MAX;
    live.insert(Live{ptr, st.getWeakStorageImpl(), bid, claimed, false});
    if (!claimed) {         // the allocator may never report its free (allocated before recording)
      unreported.push_back(impl);
      sweep_every = std::max<size_t>(1, unreported.size() / 8);
    }
    return bid;
  }

  void free_block(int32_t bid, c10::StorageImpl* impl, int64_t ptr, int64_t t) {
    FreeRec f;
    f.t = t; f.block = int32_t(bid);
    frees.push(f);
    if (Live* e = live.find(impl)) live.erase(e);
  }

  // Blocks whose storage died without an allocator report (made before recording): freed now.
  void sweep(int64_t t) {
    size_t w = 0;
    for (size_t i = 0; i < unreported.size(); ++i) {
      c10::StorageImpl* impl = unreported[i];
      Live* e = live.find(impl);
      // freed already (or its storage gone and the address taken by a storage whose free is reported)
      if (!e || e->claimed) continue;
      if (e->weak.expired()) { free_block(e->block, impl, e->ptr, t); continue; }
      unreported[w++] = impl;
    }
    unreported.resize(w);
    sweep_every = std::max<size_t>(1, unreported.size() / 8);
  }

  void on_memory(void* p, int64_t delta, const c10::Device& device, int64_t t, Frame* frame) {
    int64_t ptr = int64_t(reinterpret_cast<intptr_t>(p));
    std::lock_guard<std::mutex> g(mu);
    if (!active) return;
    int16_t dev = device_index(device);
    if (delta > 0) {
      if (frame) { frame->allocs.push_back(PendingAlloc{t, ptr, delta, dev}); return; }
      mem.push(MemRec{t, ptr, (delta << 8) | dev});
    } else {
      if (frame) {   // a temporary of this op: its allocation becomes a raw event first
        auto& al = frame->allocs;
        for (size_t i = 0; i < al.size(); ++i) if (al[i].ptr == ptr) {
          mem.push(MemRec{al[i].t, ptr, (al[i].size << 8) | al[i].dev});
          al.erase(al.begin() + i);
          break;
        }
      }
      bool claimed = false;
      if (Live* e = live.find_ptr(ptr)) {
        claimed = e->claimed;
        free_block(e->block, e->impl(), ptr, t);
      }
      if (!claimed) { mem.push(MemRec{t, ptr, (delta << 8) | dev}); }
    }
  }
};

// ---- entering a session's callbacks from a thread ------------------------------------------------
// This thread's buffer in the session of slot k (registered with the session on first use).
static ThreadBuf* register_thread(int k, ThreadState& ts, uint64_t serial) {
  std::lock_guard<std::mutex> g(g_slots_mutex);
  Session* s = g_slots[k];
  if (g_serial[k].load() != serial || !s || !s->active) return nullptr;
  auto b = std::make_shared<ThreadBuf>();
  b->serial = serial;
  b->session = s;
  b->last_start = s->first_start;
  {
    std::lock_guard<std::mutex> g2(s->mu);
    b->index = int(s->threads.size());
    s->threads.push_back(b);
  }
  ts.buf = b;
  return b.get();
}
// Marks this thread as inside the callbacks of slot k's session and returns its buffer (nullptr: no
// active session there). Until leave(), the session's stop() waits for this thread: its busy count is
// raised before the serial is checked again (both sequentially consistent), so either stop() sees the
// count or this thread sees the session gone.
static inline ThreadBuf* enter(int k, ThreadState& ts) {
  uint64_t serial = g_serial[k].load(std::memory_order_acquire);
  if (!serial) return nullptr;
  ThreadBuf* b = ts.buf.get();
  if (!b || b->serial != serial) {
    b = register_thread(k, ts, serial);
    if (!b) return nullptr;
  }
  b->busy.fetch_add(1, std::memory_order_seq_cst);
  if (g_serial[k].load(std::memory_order_seq_cst) != serial || !b->session->active) {
    b->busy.fetch_sub(1, std::memory_order_release);
    return nullptr;
  }
  return b;
}
static inline void leave(ThreadBuf* b) { b->busy.fetch_sub(1, std::memory_order_release); }

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

// ---- signatures -----------------------------------------------------------------------------
// A signature is a sequence of int64 words (see compiled.py decode_signature), kept as zigzag varints
// (a tag, a dtype, a dimension: 1-2 bytes instead of 8) and expanded to 8-byte words at drain.
// The tags ('T', 'L', 'I', 'D', 'B', 'N', 'W', 'O', '|': zigzag 132-248, two bytes each) trade codes
// with 119-127 (zigzag of -60..63: dimensions and ints that rare), so that each tag takes one byte. A
// swap of values, the same both ways, so any word still round-trips.
struct TagSwap {   // the swap for codes below 256, as a table (signatures are built for every op)
  uint8_t code[256];
  TagSwap() {
    static const uint8_t tags[9] = {2 * 'T', 2 * 'L', 2 * 'I', 2 * 'D', 2 * 'B', 2 * 'N', 2 * 'W', 2 * 'O', 2 * '|'};
    for (int u = 0; u < 256; ++u) code[u] = uint8_t(u);
    for (int i = 0; i < 9; ++i) { code[119 + i] = tags[i]; code[tags[i]] = uint8_t(119 + i); }
  }
};
static const TagSwap g_tag_swap;
static inline uint64_t swap_tags(uint64_t u) { return u < 256 ? g_tag_swap.code[u] : u; }
static inline void put(std::string& s, int64_t v) {
  uint64_t u = swap_tags(zz(v));
  if (u < 0x80) { s.push_back(char(u)); return; }   // tags, dtypes, small dimensions: one byte
  uint8_t buf[10];
  uint8_t* e = put_var(buf, u);
  s.append(reinterpret_cast<const char*>(buf), size_t(e - buf));
}
static std::string expand_words(const std::string& coded) {
  std::string out;
  out.reserve(coded.size() * 8);
  const uint8_t* p = reinterpret_cast<const uint8_t*>(coded.data());
  const uint8_t* e = p + coded.size();
  while (p < e) {
    uint64_t v;
    p = get_var(p, v);
    int64_t w = unzz(swap_tags(v));
    out.append(reinterpret_cast<const char*>(&w), 8);
  }
  return out;
}
static inline void put_tensor(std::string& s, const at::Tensor& t) {
  if (!t.defined()) { put(s, 'N'); return; }
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) { put(s, 'W'); put(s, int64_t(t.scalar_type())); return; }
  put(s, 'T');
  put(s, int64_t(t.scalar_type()));
  if (t.is_nested() || t.unsafeGetTensorImpl()->key_set().has(c10::DispatchKey::Python)) {
    put(s, -1);   // sizes of nested/subclass tensors are not plain
    return;
  }
  auto sizes = t.sym_sizes();
  put(s, int64_t(sizes.size()));
  for (auto& d : sizes) put(s, d.is_symbolic() ? -1 : d.as_int_unchecked());
}
static void put_value(std::string& s, const c10::IValue& v) {
  if (v.isTensor()) put_tensor(s, v.toTensor());
  else if (v.isTensorList()) {
    auto l = v.toTensorList();
    put(s, 'L'); put(s, int64_t(l.size()));
    for (size_t i = 0; i < l.size(); ++i) put_tensor(s, l.get(i));
  } else if (v.isList()) {
    auto l = v.toListRef();
    put(s, 'L'); put(s, int64_t(l.size()));
    for (auto& x : l) put_value(s, x);
  } else if (v.isInt()) { put(s, 'I'); put(s, v.toInt()); }
  else if (v.isDouble()) { double d = v.toDouble(); int64_t b; std::memcpy(&b, &d, 8); put(s, 'D'); put(s, b); }
  else if (v.isBool()) { put(s, 'B'); put(s, v.toBool()); }
  else if (v.isNone()) put(s, 'N');
  else put(s, 'O');
}

// ---- the callbacks --------------------------------------------------------------------------
// What the schema and the dispatcher say about an op (read/write arguments, view, composite...): the
// same for every recording, so learned once per process (a recording of a few steps would otherwise
// spend a good part of its time here). Keyed by the op name's address, checked against the name.
struct OpFacts { std::string name, overload; OpInfo info; };
std::mutex g_facts_mu;
std::unordered_map<const char*, std::unique_ptr<OpFacts>> g_facts;

static OpInfo learn_facts(const at::RecordFunction& fn, const c10::OperatorName* opname);

// The facts of fn's op, from this thread's cache (no lock) or else the session's (under its lock).
static OpInfo& learn(Session* s, const at::RecordFunction& fn, bool& cacheable);
static OpInfo& learn_here(ThreadBuf* b, const at::RecordFunction& fn) {
  if (OpInfo* known = b->op_cache.find(fn.name())) return *known;
  bool cacheable;
  OpInfo* info;
  {
    std::lock_guard<std::mutex> g(b->session->mu);
    info = &learn(b->session, fn, cacheable);
  }
  if (cacheable && fn.name()) b->op_cache.insert(fn.name(), info);   // the session's entries never move (node-based map)
  return *info;
}

static OpInfo& learn(Session* s, const at::RecordFunction& fn, bool& cacheable) {
  const char* key = fn.name();
  auto it = s->op_cache.find(key);
  cacheable = true;
  if (it != s->op_cache.end()) return it->second;
  static thread_local OpInfo skip_info;
  auto opname = fn.operator_name();
  if (!opname) { cacheable = false; skip_info.skip = true; return skip_info; }
  OpInfo info;
  {
    std::lock_guard<std::mutex> g(g_facts_mu);
    auto f = g_facts.find(key);
    if (f != g_facts.end() && f->second->name == opname->name && f->second->overload == opname->overload_name) {
      info = f->second->info;
    } else {
      info = learn_facts(fn, &*opname);
      g_facts[key] = std::unique_ptr<OpFacts>(new OpFacts{opname->name, opname->overload_name, info});
    }
  }
  info.name_id = int32_t(s->op_names.size());
  s->op_names.push_back(opname->name);
  return s->op_cache.emplace(key, std::move(info)).first->second;
}

static OpInfo learn_facts(const at::RecordFunction& fn, const c10::OperatorName* opname) {
  OpInfo info;
  auto schema = fn.operator_schema();
  auto handle = c10::Dispatcher::singleton().findOp(*opname);
  const std::string& name = opname->name;
  static const std::unordered_map<std::string, std::pair<std::vector<int>, int>> omitted = {
      {"aten::native_batch_norm", {{3, 4}, 5}}, {"aten::cudnn_batch_norm", {{3, 4}, 5}},
      {"aten::miopen_batch_norm", {{3, 4}, 5}}, {"aten::_batch_norm_with_update", {{3, 4}, -1}}};
  static const std::unordered_map<std::string, int> metadata = {
      {"aten::sym_size", 1}, {"aten::sym_stride", 1}, {"aten::sym_numel", 1}, {"aten::sym_storage_offset", 1},
      {"aten::size", 1}, {"aten::stride", 1}, {"aten::numel", 1}, {"aten::dim", 1}, {"aten::storage_offset", 1},
      {"aten::is_same_size", 1}, {"aten::_has_compatible_shallow_copy_type", 1}, {"aten::is_contiguous", 1},
      {"aten::empty_like", 1}, {"aten::empty_strided", 1}, {"aten::empty", 1}, {"aten::new_empty", 1},
      {"aten::new_empty_strided", 1}, {"aten::new_zeros", 1}, {"aten::new_ones", 1}, {"aten::new_full", 1},
      {"aten::zeros_like", 1}, {"aten::ones_like", 1}, {"aten::full_like", 1}, {"aten::rand_like", 1},
      {"aten::randn_like", 1}, {"aten::randint_like", 1}, {"aten::resize_as_", 1}, {"aten::record_stream", 1}};
  static const std::unordered_map<std::string, int> resizing = {
      {"aten::resize_", 1}, {"aten::resize_as_", 1}, {"aten::set_", 1}, {"aten::_resize_output_", 1}};
  if (schema) {
    for (auto& arg : schema->arguments()) {
      bool w = arg.alias_info() && arg.alias_info()->isWrite();
      info.writes.push_back(w ? 1 : 0);
    }
    auto om = omitted.find(name);
    if (om != omitted.end()) {
      for (int i : om->second.first) if (i < int(info.writes.size())) info.writes[i] = 1;
      info.write_if = om->second.second;
    }
    for (auto w : info.writes) info.any_write |= (w != 0);
    bool aliases = false;
    for (auto& r : schema->returns()) if (r.alias_info() && !r.alias_info()->isWrite()) aliases = true;
    if (aliases && !info.any_write) info.kind = kView;
    else if (metadata.count(name)) info.kind = kMetadata;
  }
  info.resizes = resizing.count(name) > 0;
  if (handle) {
    using DK = c10::DispatchKey;
    bool cia = handle->hasKernelForDispatchKey(DK::CompositeImplicitAutograd);
    bool cia_nested = handle->hasKernelForDispatchKey(DK::CompositeImplicitAutogradNestedTensor);
    info.transparent = cia && !handle->hasKernelForDispatchKey(DK::CPU) && !handle->hasKernelForDispatchKey(DK::CUDA);
    info.transparent_nested = cia_nested || (cia && !handle->hasKernelForDispatchKey(DK::NestedTensorCPU) &&
                                             !handle->hasKernelForDispatchKey(DK::NestedTensorCUDA));
  }
  return info;
}

int g_probe = 0;   // benchmarks only: 1 = callbacks do nothing (the cost of RecordFunction itself)
int64_t g_spin_ns = 0;   // tests only: make each op callback this much slower (the clock must not show it)
// Switch this session's callback off inside a recorded op's kernel (default on). The ops nested
// there are never recorded, and while any callback that wants inputs is active RecordFunction boxes
// every nested op's inputs and outputs (~2.4 nested ops per recorded op on a GPT training step).
// disableCallback touches only our own callback (other observers -- a profiler, an outer recording --
// still see the nested ops) and rebuilds only its scope's cache, far cheaper than the boxing it saves.
// Only ops seen running nested ops in this recording are quieted (OpInfo::nests): for a leaf op the
// pair of rebuilds would cost ~1300 instructions and save nothing. The first call of a nesting op
// boxes its nested ops once; they are still not recorded (ThreadState::suppress).
bool g_quiet = true;

template <int K>
std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (g_probe == 1) return nullptr;
  ThreadState& ts = tl_state[K];
  if (ts.suppress > 0) { ts.nested++; ts.nested_seen++; return nullptr; }
  int64_t t0 = raw_now();
  if (g_spin_ns) while (raw_now() - t0 < g_spin_ns) {}
  Frame& f = ts.push();
  ThreadBuf* b = ts.suppress == 0 ? enter(K, ts) : nullptr;
  if (b) {
    Session* s = b->session;
    try {
      OpInfo* info = &learn_here(b, fn);
      if (!info->skip) {
        auto inputs = fn.inputs();
        bool nested = false, subclass = false;
        for (auto& v : inputs) {
          if (!v.isTensor()) continue;
          const at::Tensor& t = v.toTensor();
          if (t.is_nested()) nested = true;
          if (t.defined() && t.unsafeGetTensorImpl()->key_set().has(c10::DispatchKey::Python)) subclass = true;
        }
        // An op on a Python tensor subclass (a jagged nested tensor...) has no storages of its own: the
        // ops its __torch_dispatch__ runs on the inner tensors are the ones that touch memory.
        bool transparent = subclass || (nested ? info->transparent_nested : info->transparent);
        if (!transparent) {
          f.recorded = true;
          f.info = info;
          f.any_nested = nested;
          ts.suppress++;
          // The ops nested inside this op's kernel are not recorded: switch RecordFunction off for
          // them (no boxing of their arguments) unless someone else observes ops in this thread
          // (a profiler's debug info, or global callbacks).
          f.nested_before = ts.nested_seen;
          if (g_quiet && s->cb && __atomic_load_n(&info->nests, __ATOMIC_RELAXED)) {
            at::disableCallback(s->cb);
            f.quieted = s->cb;
          }
          f.sig.clear();
          put(f.sig, info->name_id);
          bool writes_apply = info->any_write &&
              (info->write_if < 0 || (info->write_if < int(inputs.size()) && inputs[info->write_if].isBool() &&
                                      inputs[info->write_if].toBool()));
          for (size_t i = 0; i < inputs.size(); ++i) {
            const c10::IValue& v = inputs[i];
            put_value(f.sig, v);
            if (info->kind == kView || info->kind == kMetadata) continue;
            uint8_t w = writes_apply && i < info->writes.size() ? info->writes[i] : 0;
            auto take = [&](const at::Tensor& t) {
              if (!t.defined()) return;
              auto* impl = t.unsafeGetTensorImpl();
              if (impl->is_wrapped_number()) return;   // a Python number the binding wrapped: not a tensor
              const c10::Storage& st = impl->unsafe_storage();
              if (!st || impl->key_set().has(c10::DispatchKey::Python)) { f.no_storage++; return; }
              f.inputs.emplace_back(st.unsafeGetStorageImpl(), w);
            };
            if (v.isTensor()) take(v.toTensor());
            else if (v.isTensorList()) { auto l = v.toTensorList(); for (size_t j = 0; j < l.size(); ++j) take(l.get(j)); }
            else if (v.isList()) { for (auto& x : v.toListRef()) if (x.isTensor()) take(x.toTensor()); }
          }
          if (info->resizes && !inputs.empty() && inputs[0].isTensor()) {
            const c10::Storage& st = inputs[0].toTensor().unsafeGetTensorImpl()->unsafe_storage();
            if (st) {
              f.pins.push_back(st);
              std::lock_guard<std::mutex> g(s->mu);
              if (!s->live.find(st.unsafeGetStorageImpl()) && st.nbytes() > 0)
                s->block_of(st, int32_t(s->n_ops.load()), true, nullptr);
              Live* e = s->live.find(st.unsafeGetStorageImpl());
              f.self_block = e ? e->block : -1;
              f.self_ptr = int64_t(reinterpret_cast<intptr_t>(st.data()));
              f.self_size = int64_t(st.nbytes());
            }
          }
        }
      }
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> g(s->mu);
      if (s->active) { s->active = false; s->stop_reason = std::string("internal error: ") + e.what(); }
    }
    leave(b);
  }
  int64_t t1 = raw_now();
  tl_own_ns += t1 - t0; tl_split[0] += t1 - t0;
  f.start = t1 - tl_own_ns;
  return nullptr;
}

// Writes op f's record into thread buffer `tb`: the block lookups, signature and allocator events
// under the session's lock, the op and its accesses into the thread's own streams after it.
static void record_end(ThreadBuf* tb, Frame& f, const at::RecordFunction& fn, int64_t end) {
  Session* s = tb->session;
  OpInfo* info = f.info;
  std::unique_lock<std::mutex> g(s->mu);
  if (!s->active) return;
  int32_t op = int32_t(s->n_ops.fetch_add(1, std::memory_order_relaxed));
  // one stack id per op number from first_op on, pushed under `mu` as the number is taken (in order)
  if (StackCapture* sc = s->stacks.load()) sc->op_ids.push(f.stack);
  if (s->unreported.size() && ++s->since_sweep >= s->sweep_every) { s->since_sweep = 0; s->sweep(f.start); }
  uint32_t nacc = 0;
  auto& accs = tb->pending_acc;
  accs.clear();
  auto push_acc = [&](int32_t b, int w) { if (b >= 0) { accs.push_back((b << 1) | w); ++nacc; } };
  for (auto& in : f.inputs) {
    c10::StorageImpl* impl = in.first;
    int32_t b;
    if (Live* e = s->live.find(impl)) b = e->block;
    else if (info->resizes && !f.pins.empty() && impl == f.pins[0].unsafeGetStorageImpl())
      // resize_/set_ on `self`: its block before the op, or -- when it had no bytes -- a block made here
      b = f.self_block >= 0 ? f.self_block : s->block_of(f.pins[0], op, false, &f);
    else {
      c10::Storage st(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl));
      b = s->block_of(st, op, true, &f);
    }
    push_acc(b, in.second);
  }
  s->tensors_without_storage += f.no_storage;
  int w = info->kind == kView ? 0 : 1;
  bool fresh = info->kind != kView;
  put(f.sig, '|');   // inputs | outputs
  auto out_tensor = [&](const at::Tensor& t) {
    put_tensor(f.sig, t);
    if (!t.defined()) return;
    auto* impl = t.unsafeGetTensorImpl();
    const c10::Storage& st = impl->unsafe_storage();
    if (!st || impl->key_set().has(c10::DispatchKey::Python)) { s->tensors_without_storage++; return; }
    int32_t b = s->block_of(st, op, !fresh, &f);
    if (w) push_acc(b, 1);
  };
  for (auto& v : fn.outputs()) {
    if (v.isTensor()) out_tensor(v.toTensor());
    else if (v.isTensorList()) { auto l = v.toTensorList(); for (size_t j = 0; j < l.size(); ++j) out_tensor(l.get(j)); }
    else if (v.isList()) { for (auto& x : v.toListRef()) if (x.isTensor()) out_tensor(x.toTensor()); }
  }
  if (info->resizes && !f.pins.empty() && f.self_block >= 0) {   // resize_/set_: a new allocation?
    const c10::Storage& st = f.pins[0];
    int64_t ptr = int64_t(reinterpret_cast<intptr_t>(st.data()));
    int64_t size = int64_t(st.nbytes());
    if (!(size == f.self_size && (size == 0 || ptr == f.self_ptr))) {
      Live* e = s->live.find(st.unsafeGetStorageImpl());
      if (e && e->block == f.self_block)
        s->free_block(f.self_block, st.unsafeGetStorageImpl(), f.self_ptr, end);
      if (Live* left = s->live.find(st.unsafeGetStorageImpl())) s->live.erase(left);
      int32_t nb = s->block_of(st, op, false, &f);
      push_acc(nb, 1);
    }
  }
  for (auto& a : f.allocs) {   // allocations no output claimed: temporaries (raw events)
    s->mem.push(MemRec{a.t, a.ptr, (a.size << 8) | a.dev});
  }
  f.allocs.clear();
  int32_t sig = s->sigs.intern(f.sig);
  g.unlock();
  for (int32_t a : accs) tb->acc.push(a);
  int64_t aseq;
  auto node = torch::autograd::get_current_node();
  if (node) {
    uint64_t n = node->sequence_nr();
    aseq = -2 - int64_t(std::min<uint64_t>(n, uint64_t(1) << 30));
  } else {
    aseq = int64_t(at::sequence_number::peek());
  }
  OpRec r;
  int64_t d = f.start - tb->last_start;
  tb->last_start = f.start;
  if (d > INT32_MIN && d <= INT32_MAX) r.dstart = int32_t(d);
  else { r.dstart = INT32_MIN; tb->wide.push() = WideRec{op, 0, f.start}; }
  int64_t dur = end - f.start;
  if (dur >= 0 && dur < int64_t(UINT32_MAX)) r.dur = uint32_t(dur);
  else { r.dur = UINT32_MAX; tb->wide.push() = WideRec{op, 1, dur}; }
  r.aseq = int32_t(std::max<int64_t>(std::min<int64_t>(aseq, INT32_MAX), INT32_MIN));
  uint32_t sig_field = sig < (1 << 24) - 1 ? uint32_t(sig) : (1u << 24) - 1;
  if (sig_field != uint32_t(sig)) tb->wide.push() = WideRec{op, 3, sig};
  uint32_t nacc_field = nacc < 255 ? nacc : 255;
  if (nacc_field == 255) tb->wide.push() = WideRec{op, 2, int64_t(nacc)};
  r.sig_nacc = (sig_field << 8) | nacc_field;
  tb->ops.push(ThreadOp{r, op});
  if ((tb->n_ops++ & 255) == 0) {
    std::lock_guard<std::mutex> g2(s->mu);
    s->check_budget(tb);
  }
}

template <int K>
void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (g_probe == 1) return;
  ThreadState& ts = tl_state[K];
  if (ts.nested > 0) { ts.nested--; return; }
  int64_t t0 = raw_now();
  int64_t own0 = tl_own_ns;   // the memory hook below (pins.clear) counts its own time itself
  int64_t end = t0 - own0;
  if (ts.depth == 0) return;
  Frame& f = ts.frames[ts.depth - 1];
  if (f.quieted) { at::reenableCallback(f.quieted); f.quieted = 0; }
  else if (f.recorded && ts.nested_seen != f.nested_before) __atomic_store_n(&f.info->nests, uint8_t(1), __ATOMIC_RELAXED);
  if (f.recorded) {
    ts.suppress--;
    if (ThreadBuf* b = enter(K, ts)) {
      try {
        f.stack = -1;
        if (StackCapture* sc = b->session->stacks.load()) {   // before record_end: the GIL is never taken under s->mu
          // Should the frame walk ever run an op (a finalizer in a GC: CPython 3.11 makes frame objects
          // untracked, so it does not collect there) it counts as nested: recorded, it would push a
          // frame, and `f` could move.
          ts.suppress++;
          try { f.stack = sc->capture(); } catch (...) { ts.suppress--; throw; }
          ts.suppress--;
        }
        record_end(b, f, fn, end);
      } catch (const std::exception& e) {
        Session* s = b->session;
        std::lock_guard<std::mutex> g(s->mu);
        if (s->active) { s->active = false; s->stop_reason = std::string("internal error: ") + e.what(); }
      }
      leave(b);
    }
  }
  std::vector<c10::Storage> pins;
  pins.swap(f.pins);
  ts.depth--;
  pins.clear();   // may free the old storage of set_ (the memory hook runs): after the frame is gone
  // only the time not already counted (by the memory hook) is added: counted twice, the clock would go back
  { int64_t d = raw_now() - t0 - (tl_own_ns - own0); tl_own_ns += d; tl_split[1] += d; }
}

template <int K> struct Callbacks {
  static at::RecordFunctionCallback make() {
    return at::RecordFunctionCallback(&on_start<K>, &on_end<K>)
        .needsInputs(true).needsOutputs(true).scopes({at::RecordScope::FUNCTION});
  }
};

static at::RecordFunctionCallback make_callback(int k) {
  switch (k) {
#define C(i) case i: return Callbacks<i>::make();
    C(0) C(1) C(2) C(3) C(4) C(5) C(6) C(7) C(8) C(9) C(10) C(11) C(12) C(13) C(14) C(15)
#undef C
  }
  throw std::runtime_error("bad slot");
}

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

  // ---- module context: the forward pre/post hooks, registered with torch as these methods ----------
  // The module stack lives here, so that entering and leaving a known module is one call from torch's
  // hook loop into C++ (no Python frames). A module not seen yet, and a root module (its tensor
  // arguments are the inputs), take the Python path (`enter_slow`, CompiledSession._enter_module_slow),
  // which names it and pushes it with push_module(). Hooks run in every thread: only the thread that
  // started the recording has its modules recorded (as the Python recorder's thread-local sessions).
  struct ModuleFrame { uintptr_t key; int64_t caller_ctx; PyObject* module; };   // module: borrowed
  std::unordered_map<uintptr_t, int64_t> module_index;   // id(module) -> module index
  std::vector<ModuleFrame> module_stack;
  int64_t ctx = 0;                                       // module index << 2 | phase bits
  std::thread::id owner = std::this_thread::get_id();
  py::object enter_slow;                                 // Python: (module, args) -> None

  void push_module_locked(uintptr_t key, int64_t idx, PyObject* module) {
    module_stack.push_back(ModuleFrame{key, ctx, module});
    int64_t c = (idx << 2) | (ctx & 3);
    ctx = c;
    int64_t op = s->n_ops.load();
    s->set_ctx_at(op, c);
  }
  py::object enter_module(py::handle module, py::handle args) {
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
  void push_module(py::handle module, int64_t idx) {
    std::lock_guard<std::mutex> g(s->mu);
    uintptr_t key = uintptr_t(module.ptr());
    module_index[key] = idx;
    push_module_locked(key, idx, module.ptr());
  }
  // Forward post-hook (also after an exception): pop back to the caller's module.
  void exit_module(py::handle module, py::handle, py::handle) {
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
  size_t module_depth() { std::lock_guard<std::mutex> g(s->mu); return module_stack.size(); }
  // The innermost module in forward (None when none): the parent of a module met for the first time.
  py::object module_top() {
    std::lock_guard<std::mutex> g(s->mu);
    if (module_stack.empty()) return py::none();
    return py::reinterpret_borrow<py::object>(module_stack.back().module);
  }
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

  // Stack ids are kept per op number (from first_op on); where an internal error left a number unused,
  // they are moved to the places of the recorded ops, as drain() moves blocks and contexts.
  void renumber_stacks(const std::vector<int64_t>& ids) {
    StackCapture& sc = *stack_capture;
    std::vector<int32_t> by_number = sc.op_ids.decode_all();
    sc.op_ids.clear();
    for (int64_t number : ids) {
      int64_t i = number - sc.first_op;
      if (i >= 0) sc.op_ids.push(i < int64_t(by_number.size()) ? by_number[size_t(i)] : -1);
    }
    sc.first_op = renumber(ids, sc.first_op);
  }

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
  Merged merge_threads(bool with_acc = true) {
    struct Item { int64_t id, start; uint32_t thread, index; size_t acc_at; size_t nacc; };
    size_t nt = s->threads.size();
    std::vector<std::vector<ThreadOp>> ops(nt);
    std::vector<std::vector<int32_t>> accs(nt);
    std::vector<std::vector<WideRec>> wides(nt);
    std::vector<Item> items;
    for (size_t t = 0; t < nt; ++t) {
      ThreadBuf& tb = *s->threads[t];
      ops[t] = tb.ops.decode_all();
      if (with_acc) accs[t] = tb.acc.decode_all();
      wides[t] = tb.wide.all();          // in op order: pushed by one thread as its ops were numbered
      int64_t start = s->first_start;
      size_t at = 0, w = 0;
      const auto& wt = wides[t];
      for (size_t i = 0; i < ops[t].size(); ++i) {
        const ThreadOp& o = ops[t][i];
        size_t nacc = o.r.sig_nacc & 0xFF;
        int64_t absolute = INT64_MIN;
        while (w < wt.size() && wt[w].op < o.id) ++w;
        for (size_t j = w; j < wt.size() && wt[j].op == o.id; ++j) {
          if (wt[j].kind == 0) absolute = wt[j].value;
          if (wt[j].kind == 2) nacc = size_t(wt[j].value);
        }
        start = (o.r.dstart == INT32_MIN && absolute != INT64_MIN) ? absolute : start + o.r.dstart;
        items.push_back(Item{o.id, start, uint32_t(t), uint32_t(i), at, nacc});
        at += nacc;
      }
      if (at != tb.acc.size()) throw std::runtime_error("memlens: a thread's accesses do not match its ops");
    }
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.id < b.id; });
    Merged m;
    m.ops.reserve(items.size());
    m.ids.reserve(items.size());
    int64_t prev = s->first_start;
    for (size_t k = 0; k < items.size(); ++k) {
      const Item& it = items[k];
      const ThreadOp& o = ops[it.thread][it.index];
      OpRec r = o.r;
      int64_t d = it.start - prev;
      prev = it.start;
      if (d > INT32_MIN && d <= INT32_MAX) r.dstart = int32_t(d);
      else { r.dstart = INT32_MIN; m.wide.push_back(WideRec{int64_t(k), 0, it.start}); }
      const auto& wt = wides[it.thread];
      auto w = std::lower_bound(wt.begin(), wt.end(), o.id, [](const WideRec& x, int64_t id) { return x.op < id; });
      for (; w != wt.end() && w->op == o.id; ++w)
        if (w->kind != 0) m.wide.push_back(WideRec{int64_t(k), w->kind, w->value});
      m.ops.push_back(r);
      m.ids.push_back(it.id);
      if (with_acc) {
        const auto& a = accs[it.thread];
        m.acc.insert(m.acc.end(), a.begin() + it.acc_at, a.begin() + it.acc_at + it.nacc);
      } else {
        m.thread.push_back(it.thread);
        m.nacc.push_back(uint32_t(it.nacc));
      }
    }
    return m;
  }
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

  // The accesses (int32 records, block << 1 | write) of the next ops in drain order: at most `max_ops` ops,
  // and no more ops than fit `max_records` records (at least one op); returns (ops taken, records). (0, b"")
  // once every op was handed out. Memory: 8 bytes per op kept by drain_windowed() plus this window's
  // records and a 64 KiB read buffer per thread.
  py::tuple next_accesses(int64_t max_ops, int64_t max_records) {
    if (!windows) throw std::runtime_error("memlens: next_accesses() without drain_windowed()");
    std::lock_guard<std::mutex> g(s->mu);
    Windows& w = *windows;
    size_t limit = std::min(w.thread.size(), w.next + size_t(std::max<int64_t>(max_ops, 1)));
    size_t end = w.next, total = 0;
    while (end < limit && (end == w.next || total + w.nacc[end] <= size_t(std::max<int64_t>(max_records, 0))))
      total += w.nacc[end++];
    std::string out(total * sizeof(int32_t), '\0');
    int32_t* dst = reinterpret_cast<int32_t*>(out.data());
    for (size_t k = w.next; k < end; ++k) {
      auto& reader = w.readers[w.thread[k]];
      for (uint32_t j = 0; j < w.nacc[k]; ++j) reader.next(*dst++);
    }
    int64_t taken = int64_t(end - w.next);
    w.next = end;
    return py::make_tuple(taken, py::bytes(out));
  }
  // Start the windows again from the first op (tests: the same accesses read twice).
  void rewind_accesses() {
    if (!windows) throw std::runtime_error("memlens: rewind_accesses() without drain_windowed()");
    std::lock_guard<std::mutex> g(s->mu);
    windows->next = 0;
    for (size_t t = 0; t < windows->readers.size(); ++t) windows->readers[t].reset(&s->threads[t]->acc);
  }
  // Free the access streams (and close their spill files) after the windowed save.
  void close_windows() {
    std::lock_guard<std::mutex> g(s->mu);
    windows.reset();
    for (auto& t : s->threads) t->clear();
  }

  py::dict drain_impl(bool windowed) {
    at::RecordFunctionGuard no_ops(false);   // our own tensors are not the program's ops (outer recorders)
    stop();                                  // no thread appends from here on (a no-op when stopped)
    std::lock_guard<std::mutex> g(s->mu);
    py::dict d;
    Merged merged = merge_threads(!windowed);
    const std::vector<int64_t>& ids = merged.ids;
    bool dense = ids.empty() || ids.back() == int64_t(ids.size()) - 1;   // op numbers 0..n-1, none unused
    if (!dense && stack_capture) renumber_stacks(ids);
    d["ops"] = as_bytes(merged.ops);
    d["accesses"] = as_bytes(merged.acc);
    std::vector<BlockRec> blocks = s->blocks.decode_all();
    if (!dense)
      for (auto& b : blocks)
        b.op_before = uint32_t(renumber(ids, b.op_before & 0x7FFFFFFF)) | (b.op_before & 0x80000000u);
    d["blocks"] = as_bytes(blocks);
    d["frees"] = s->frees.to_bytes();
    d["memory"] = s->mem.to_bytes();
    d["wide"] = as_bytes(merged.wide);
    if (s->ctx_last.op >= 0) { s->ctxs.push(s->ctx_last); s->ctx_last = CtxRec{-1, 0}; }
    std::vector<CtxRec> ctxs = s->ctxs.decode_all();
    if (!dense) for (auto& c : ctxs) c.op = renumber(ids, c.op);
    d["ctx"] = as_bytes(ctxs);
    d["first_start"] = s->first_start;
    d["op_names"] = s->op_names;
    py::list sigs;
    for (size_t i = 0; i < s->sigs.size(); ++i) sigs.append(py::bytes(expand_words(std::string(s->sigs.get(i)))));
    d["sigs"] = sigs;
    d["devices"] = s->devices;
    d["tensors_without_storage"] = s->tensors_without_storage;
    d["stop_reason"] = s->stop_reason;
    d["peak_bytes"] = std::max(s->peak_bytes, s->mem_bytes());
    d["bytes"] = s->mem_bytes();
    d["spilled_bytes"] = s->spilled_bytes;
    d["memory_note"] = memory_note;
    d["late_frees"] = s->late_frees;
    py::dict parts;
    size_t ops_bytes = 0, acc_bytes = 0;
    for (auto& t : s->threads) { ops_bytes += t->ops.mem_bytes() + t->wide.mem_bytes(); acc_bytes += t->acc.mem_bytes(); }
    parts["ops"] = ops_bytes; parts["accesses"] = acc_bytes;
    parts["blocks"] = s->blocks.mem_bytes(); parts["frees"] = s->frees.mem_bytes();
    parts["memory_events"] = s->mem.mem_bytes(); parts["signatures"] = s->sigs.mem_bytes();
    parts["contexts"] = s->ctxs.mem_bytes();
    parts["block_maps"] = s->live.mem_bytes() + s->marked_bits.capacity() + s->marked_other.size() * 32 +
                          s->unreported.capacity() * sizeof(s->unreported[0]);
    parts["thread_records"] = s->threads.capacity() * sizeof(s->threads[0]) + s->threads.size() * sizeof(ThreadBuf);
    parts["n_live"] = s->live.size();
    size_t n_acc = merged.acc.size();
    if (windowed) { n_acc = 0; for (auto& t : s->threads) n_acc += t->acc.size(); }
    parts["n_ops"] = merged.ops.size(); parts["n_acc"] = n_acc; parts["n_blocks"] = s->blocks.size();
    parts["n_frees"] = s->frees.size(); parts["n_mem"] = s->mem.size(); parts["n_sigs"] = s->sigs.size();
    parts["n_threads"] = s->threads.size();
    d["parts"] = parts;
    if (windowed) {   // the access streams stay, read by next_accesses(); the rest is freed as drain() does
      windows.reset(new Windows());
      windows->thread = std::move(merged.thread);
      windows->nacc = std::move(merged.nacc);
      windows->readers.resize(s->threads.size());
      for (size_t t = 0; t < s->threads.size(); ++t) {
        windows->readers[t].reset(&s->threads[t]->acc);
        s->threads[t]->ops.clear();
        s->threads[t]->wide.clear();
      }
    } else {
      for (auto& t : s->threads) t->clear();
    }
    s->blocks.clear(); s->frees.clear(); s->mem.clear(); s->ctxs.clear();
    return d;
  }
};

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

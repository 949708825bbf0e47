// One recording's shared state (Session), each thread's own buffer (ThreadBuf) and frames (ThreadState),
// the slots sessions live in, and how a thread enters a session's callbacks.
// Part of the compiled recorder: recorder.cpp includes it inside namespace memlens (one translation
// unit); not a standalone header.

#pragma once

constexpr int kSlots = 16;   // recordings at once (one RecordFunction callback template instance each)

// An allocation made while an op ran, kept until its end: a fresh output's (folded into its block) or a
// temporary's (a raw allocator event).
struct PendingAlloc { int64_t t, ptr, size; int16_t dev; };

// One op in flight in a thread (ThreadState keeps a stack of them, reused from op to op).
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

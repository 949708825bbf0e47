// The RecordFunction callback: one op's start (its inputs) and end (its record, outputs, accesses).
// Part of the compiled recorder: recorder.cpp includes it inside namespace memlens (one translation
// unit); not a standalone header.

#pragma once

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

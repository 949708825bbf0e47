// Draining a stopped recording: the threads' streams merged and handed to Python as bytes (numpy
// reads them), or a window of ops at a time for the streaming save.
// Part of the compiled recorder: recorder.cpp includes it inside namespace memlens (one translation
// unit); not a standalone header.

#pragma once

// Stack ids are kept per op number (from first_op on); where an internal error left a number unused,
// they are moved to the places of the recorded ops, as drain() moves blocks and contexts.
inline void Handle::renumber_stacks(const std::vector<int64_t>& ids) {
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
inline Handle::Merged Handle::merge_threads(bool with_acc) {
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

// The accesses (int32 records, block << 1 | write) of the next ops in drain order: at most `max_ops` ops,
// and no more ops than fit `max_records` records (at least one op); returns (ops taken, records). (0, b"")
// once every op was handed out. Memory: 8 bytes per op kept by drain_windowed() plus this window's
// records and a 64 KiB read buffer per thread.
inline py::tuple Handle::next_accesses(int64_t max_ops, int64_t max_records) {
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
inline void Handle::rewind_accesses() {
  if (!windows) throw std::runtime_error("memlens: rewind_accesses() without drain_windowed()");
  std::lock_guard<std::mutex> g(s->mu);
  windows->next = 0;
  for (size_t t = 0; t < windows->readers.size(); ++t) windows->readers[t].reset(&s->threads[t]->acc);
}
// Free the access streams (and close their spill files) after the windowed save.
inline void Handle::close_windows() {
  std::lock_guard<std::mutex> g(s->mu);
  windows.reset();
  for (auto& t : s->threads) t->clear();
}

inline py::dict Handle::drain_impl(bool windowed) {
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

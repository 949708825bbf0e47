// Delta + varint coding of the records, and the coded streams that hold them in memory (and spill
// files) while recording.
// Part of the compiled recorder: recorder.cpp includes it inside namespace memlens (one translation
// unit); not a standalone header.

#pragma once

// ---- compact streams: delta + varint coded records ----------------------------------------------
// The fixed-size records (records.h) are what drain() hands to Python; in memory, the large streams keep
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

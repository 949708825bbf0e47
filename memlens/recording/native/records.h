// The fixed-size records drain() hands to Python, and the chunked stream of the rare ones.
// Part of the compiled recorder: recorder.cpp includes it inside namespace memlens (one translation
// unit); not a standalone header.

#pragma once

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

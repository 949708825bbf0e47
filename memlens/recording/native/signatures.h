// Op signatures (name + argument shapes/dtypes/scalars): their coding and the table interning them.
// Part of the compiled recorder: recorder.cpp includes it inside namespace memlens (one translation
// unit); not a standalone header.

#pragma once

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

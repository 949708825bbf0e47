// The live blocks: storage -> block, data address -> storage.
// Part of the compiled recorder: recorder.cpp includes it inside namespace memlens (one translation
// unit); not a standalone header.

#pragma once

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

// What the recorder knows about an op from its schema and the dispatcher: learned once per process,
// looked up per op through a per-thread cache.
// Part of the compiled recorder: recorder.cpp includes it inside namespace memlens (one translation
// unit); not a standalone header.

#pragma once

constexpr int kNormal = 0, kView = 1, kMetadata = 2;

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

// What the schema and the dispatcher say about an op (read/write arguments, view, composite...): the
// same for every recording, so learned once per process (a recording of a few steps would otherwise
// spend a good part of its time here). Keyed by the op name's address, checked against the name.
struct OpFacts { std::string name, overload; OpInfo info; };
std::mutex g_facts_mu;
std::unordered_map<const char*, std::unique_ptr<OpFacts>> g_facts;

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

// Keyed hashing for the walker's tables: the stack and string tables are open-addressing sets
// whose probe cost a file could otherwise choose. With an unkeyed, invertible mix, a file could pick each
// one-frame stack's line so that all stacks share one 32-bit tag and every insert probes one growing
// cluster (160k crafted stacks: 110 s). The hash here is SipHash-1-3 under a 128-bit key drawn once per
// process from std::random_device, so which values collide is unknown to whoever wrote the file.
#pragma once
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <random>
#include <vector>

namespace {

uint64_t g_key0 = 0x736f6d6570736575ULL, g_key1 = 0x646f72616e646f6dULL;  // replaced by seed_hash_key()

// Draw the per-process key. random_device may throw where no entropy source exists: the key then comes
// from the clock and an address (weaker, but still not known to the file's author in advance).
void seed_hash_key() {
    try {
        std::random_device rd;
        g_key0 = (uint64_t)rd() << 32 | rd();
        g_key1 = (uint64_t)rd() << 32 | rd();
    } catch (...) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        g_key0 ^= ((uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ULL) ^ (uint64_t)(uintptr_t)&ts;
        g_key1 ^= ((uint64_t)ts.tv_sec << 20 ^ (uint64_t)getpid()) * 0xbf58476d1ce4e5b9ULL;
    }
}

inline uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

// SipHash-1-3 over 64-bit words (the rows are fixed-size integers, so no byte tail is needed)
struct SipHash {
    uint64_t v0, v1, v2, v3, count = 0;
    SipHash() : v0(0x736f6d6570736575ULL ^ g_key0), v1(0x646f72616e646f6dULL ^ g_key1),
                v2(0x6c7967656e657261ULL ^ g_key0), v3(0x7465646279746573ULL ^ g_key1) {}
    inline void round() {
        v0 += v1; v1 = rotl(v1, 13); v1 ^= v0; v0 = rotl(v0, 32);
        v2 += v3; v3 = rotl(v3, 16); v3 ^= v2;
        v0 += v3; v3 = rotl(v3, 21); v3 ^= v0;
        v2 += v1; v1 = rotl(v1, 17); v1 ^= v2; v2 = rotl(v2, 32);
    }
    inline void add(uint64_t m) {
        v3 ^= m; round(); v0 ^= m;
        count++;
    }
    inline uint64_t finish() {
        uint64_t b = count << 56;
        v3 ^= b; round(); v0 ^= b;
        v2 ^= 0xff; round(); round(); round();
        return v0 ^ v1 ^ v2 ^ v3;
    }
};

// A keyed hash of one 64-bit value (a str's Python hash: keyed too, unless PYTHONHASHSEED fixes it)
inline uint64_t keyed(uint64_t x) {
    SipHash s;
    s.add(x);
    return s.finish();
}

// An open-addressing set of dense ids (0, 1, ...) whose keys live elsewhere: `find` probes with a hash
// and an equality test on candidate ids; `insert` adds the id of a key known to be absent. Each slot holds
// the low 32 bits of its key's hash beside the id, so that a probe touches the key only when those match
// and growing needs no key at all (a probe costs one cache miss, not three). The hashes must be keyed
// (above): the probe sequence is linear, so chosen collisions would make it quadratic.
struct IdSet {
    std::vector<uint64_t> slots = std::vector<uint64_t>(1024, 0);  // (hash32 << 32) | (id + 1); 0: empty
    size_t count = 0;
    template <class Eq>
    int32_t find(uint64_t h, Eq eq) const {
        uint32_t tag = (uint32_t)h;
        size_t mask = slots.size() - 1;
        for (size_t i = tag & mask;; i = (i + 1) & mask) {
            uint64_t slot = slots[i];
            if (slot == 0) return -1;
            if ((uint32_t)(slot >> 32) == tag) {
                int32_t id = (int32_t)((uint32_t)slot - 1);
                if (eq(id)) return id;
            }
        }
    }
    void insert(uint64_t h, int32_t id) {
        if ((count + 1) * 2 > slots.size()) {  // grow first: a failed allocation leaves the set as it was
            std::vector<uint64_t> old(slots.size() * 2, 0);
            old.swap(slots);
            for (uint64_t slot : old)
                if (slot) place(slot);
        }
        ++count;
        place((uint64_t)(uint32_t)h << 32 | (uint32_t)(id + 1));
    }
    void place(uint64_t slot) {
        size_t mask = slots.size() - 1;
        size_t i = (uint32_t)(slot >> 32) & mask;
        while (slots[i]) i = (i + 1) & mask;
        slots[i] = slot;
    }
};

}  // namespace

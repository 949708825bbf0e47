// Which memo slots of a snapshot pickle some GET reads (a first pass over the opcodes), so that the walk
// keeps only those. Part of stream_walk.cpp's translation unit.
#pragma once
#include <Python.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// The memo slots some GET reads, as a bitmap with the count of set bits before each 64-slot word, so that
// a read slot's place among the kept ones (its rank) costs one popcount: the walk stores only those slots,
// a few bytes per thousand memoized objects for the rest (a flood of MEMOIZE costs no memory).
struct SlotSet {
    std::vector<uint64_t> words;
    std::vector<uint32_t> before;  // set bits in the words before each word
    bool has(size_t slot) const {
        return (slot >> 6) < words.size() && (words[slot >> 6] >> (slot & 63) & 1);
    }
    size_t rank(size_t slot) const {  // set bits before `slot`
        return before[slot >> 6] + (size_t)__builtin_popcountll(words[slot >> 6] & ((1ULL << (slot & 63)) - 1));
    }
};

// Which memo slots some GET reads (a first pass over the opcodes, building nothing). The pass follows the
// walk's own decoding; where the walk would fail (an unknown opcode, a truncated argument, a GET of a slot
// not yet filled) it stops, since nothing after that point is ever read.
// `drop_pages`: `data` is a read-only mmap of a file; the pages read are given back every 16 MiB (as the walk
// does), so that this pass does not make the whole file resident at once.
void mark_read_slots(const unsigned char* data, Py_ssize_t n, std::vector<uint64_t>& words, bool drop_pages) {
    Py_ssize_t puts = 0, pos = 0, dropped = 0, next_drop = 16 << 20;
    static const Py_ssize_t page = sysconf(_SC_PAGESIZE);
    auto put = [&]() {
        if ((puts & 63) == 0) words.push_back(0);
        puts++;
    };
    auto get = [&](Py_ssize_t slot) {
        if (slot >= puts) return false;
        words[(size_t)slot >> 6] |= 1ULL << (slot & 63);
        return true;
    };
    while (pos < n) {
        if (drop_pages && pos >= next_drop) {
            Py_ssize_t upto = (pos / page) * page;
            madvise((void*)(data + dropped), (size_t)(upto - dropped), MADV_DONTNEED);
            dropped = upto;
            next_drop = pos + (16 << 20);
        }
        unsigned char op = data[pos++];
        switch (op) {
        case 0x94: put(); break;  // MEMOIZE
        case 0x71: case 0x72: {                           // BINPUT / LONG_BINPUT
            Py_ssize_t width = op == 0x71 ? 1 : 4;
            if (pos + width > n) return;
            Py_ssize_t slot = data[pos];
            if (width == 4) { uint32_t s; std::memcpy(&s, data + pos, 4); slot = (Py_ssize_t)s; }
            if (slot != puts) return;
            put(); pos += width;
            break;
        }
        case 0x68:  // BINGET
            if (pos >= n || !get(data[pos])) return;
            pos += 1;
            break;
        case 0x6A: {  // LONG_BINGET
            if (pos + 4 > n) return;
            uint32_t s; std::memcpy(&s, data + pos, 4);
            if (!get((Py_ssize_t)s)) return;
            pos += 4;
            break;
        }
        case 0x8A: if (pos >= n) return; pos += 1 + data[pos]; break;                 // LONG1
        case 0x8C: if (pos >= n) return; pos += 1 + data[pos]; break;                 // SHORT_BINUNICODE
        case 0x58: {                                                                       // BINUNICODE
            if (pos + 4 > n) return;
            uint32_t size; std::memcpy(&size, data + pos, 4);
            pos += 4 + (Py_ssize_t)size;
            break;
        }
        case 0x4A: pos += 4; break;  // BININT
        case 0x4B: pos += 1; break;  // BININT1
        case 0x4D: pos += 2; break;  // BININT2
        case 0x47: pos += 8; break;  // BINFLOAT
        case 0x95: pos += 8; break;  // FRAME
        case 0x80: pos += 1; break;  // PROTO
        case 0x2E: return;      // STOP
        case 0x28: case 0x7D: case 0x75: case 0x5D: case 0x65: case 0x61: case 0x73: case 0x4E: case 0x88:
        case 0x89: case 0x29: case 0x85: case 0x86: case 0x87: case 0x74:
            break;  // no argument
        default:
            return;
        }
    }
}

SlotSet referenced_slots(const unsigned char* data, Py_ssize_t n, bool drop_pages) {
    SlotSet set;
    std::vector<uint64_t>& words = set.words;
    mark_read_slots(data, n, words, drop_pages);
    set.before.resize(words.size());
    uint32_t total = 0;
    for (size_t w = 0; w < words.size(); w++) {
        set.before[w] = total;
        total += (uint32_t)__builtin_popcountll(words[w]);
    }
    return set;
}

}  // namespace

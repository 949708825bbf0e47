// memlens compiled snapshot-pickle walker: the opcode loop of memlens/io/snapshot_stream.py `_parse` in C
// (the CPython API only, no torch headers), with the trace-entry conversion and the frame interning done
// here too, so that no per-frame Python object outlives its batch.
//
// It interprets the same opcode subset with the same checks in the same order as the Python loop. Every
// failure the Python loop turns into "use the general unpickler" (IndexError, struct errors, decoding
// errors, unsupported opcodes, an entry field of the wrong type) raises `unsupported` here; the
// loose-object limit raises `too_many_loose`; the frames limit raises the `InputError` that the
// `too_many_frames` callable of the FrameTable builds. So the accept/refuse decisions are those of the
// Python loop.
//
// What differs is what is kept, not what is read:
// - The memo keeps only the slots that some GET reads later (a first pass over the opcodes finds them):
//   the Python loop's memo holds every memoized string and frame dict to the end of the file, which for a
//   snapshot whose stacks are all distinct is most of `pickle.load`'s memory.
// - `FrameTable` interns strings once and each distinct stack as a run of (name id, filename id, line) rows
//   in C++ vectors; the `stacks` table is built from them with numpy (memlens/io/snapshot_frames.py).
// - Consumed pages of a read-only mmap'ed file are dropped from the resident set as the walk passes them.
// - The entry columns are built here (`Walk::take_entries`), not by a Python callback per batch.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <unordered_map>
#include <vector>

namespace {

constexpr int64_t kMissing = INT64_MIN;  // an absent/None integer field (snapshot_stream.MISSING)
constexpr int32_t kNoStack = -1;

inline uint64_t mix(uint64_t h) {  // splitmix64 finaliser
    h ^= h >> 30; h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27; h *= 0x94d049bb133111ebULL;
    return h ^ (h >> 31);
}

// An open-addressing set of dense ids (0, 1, ...) whose keys live elsewhere: `find` probes with a hash
// and an equality test on candidate ids; `insert` adds the id of a key known to be absent. Each slot holds
// the low 32 bits of its key's hash beside the id, so that a probe touches the key only when those match
// and growing needs no key at all (a probe costs one cache miss, not three).
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
        if (++count * 2 > slots.size()) {
            std::vector<uint64_t> old(slots.size() * 2, 0);
            old.swap(slots);
            for (uint64_t slot : old)
                if (slot) place(slot);
        }
        place((uint64_t)(uint32_t)h << 32 | (uint32_t)(id + 1));
    }
    void place(uint64_t slot) {
        size_t mask = slots.size() - 1;
        size_t i = (uint32_t)(slot >> 32) & mask;
        while (slots[i]) i = (i + 1) & mask;
        slots[i] = slot;
    }
};

// ---- FrameTable: the compiled StackInterner ---------------------------------------------------------------
struct Row {  // one frame of a stack: no padding, so that stacks compare with memcmp
    int32_t name;  // string id
    int32_t file;  // string id
    int64_t line;
};
static_assert(sizeof(Row) == 16, "Row must have no padding");

struct FrameTable {
    PyObject_HEAD
    // distinct strings (owned), frame names and file names in one table
    std::vector<PyObject*>* strings;
    IdSet* string_ids;
    // stacks: runs of frame rows, distinct (frames are not deduplicated on their own: a hash probe per
    // frame costs more than the rows it would save)
    std::vector<Row>* stack_rows;
    std::vector<int64_t>* stack_start;  // nstacks + 1 offsets into stack_rows
    IdSet* stack_ids;
    std::vector<Row>* scratch;          // the rows of the list being interned
    std::vector<int32_t>* aten_names;   // ids of the strings that start with "at::_ops::" (hint candidates)
    bool sealed;                        // drop_index() ran: the lookups are gone, the tables stay
    long long unknown_lines;
    long long odd_frames;
    Py_ssize_t max_frames;
    PyObject* read_odd_frame;   // f -> (name, filename, line, unknown_line, odd)
    PyObject* too_many_frames;  // (count, limit) -> InputError
    PyObject* stack_ref_type;   // StackRef
    PyObject* repair_key;       // (stack id, frames) -> what makes a repaired stack the same one
    PyObject* repairs_seen;     // set of repair keys already counted
    PyObject* key_name;
    PyObject* key_filename;
    PyObject* key_line;
    PyObject* empty;
    PyObject* aten_prefix;
};

int32_t string_id(FrameTable* t, PyObject* s) {  // s: an exact str; -2 on error
    Py_hash_t h = PyObject_Hash(s);
    if (h == -1) return -2;
    uint64_t hh = mix((uint64_t)h);
    bool failed = false;
    int32_t id = t->string_ids->find(hh, [&](int32_t k) {
        PyObject* other = (*t->strings)[k];
        if (other == s) return true;
        int eq = PyUnicode_Compare(other, s);
        if (eq == -1 && PyErr_Occurred()) { failed = true; return true; }
        return eq == 0;
    });
    if (failed) return -2;
    if (id >= 0) return id;
    id = (int32_t)t->strings->size();
    Py_ssize_t aten = PyUnicode_Tailmatch(s, t->aten_prefix, 0, PY_SSIZE_T_MAX, -1);
    if (aten < 0) return -2;
    if (aten) t->aten_names->push_back(id);
    Py_INCREF(s);
    t->strings->push_back(s);
    t->string_ids->insert(hh, id);
    return id;
}

// The row of one frame object; adds its repair flags to *unknown / *odd. False on error.
bool read_frame(FrameTable* t, PyObject* f, Row* row, long long* unknown, long long* odd) {
    if (PyDict_CheckExact(f)) {  // the usual frame: str name, str filename, int line in [0, 2**63)
        PyObject* name = PyDict_GetItemWithError(f, t->key_name);
        if (!name && PyErr_Occurred()) return false;
        PyObject* file = PyDict_GetItemWithError(f, t->key_filename);
        if (!file && PyErr_Occurred()) return false;
        PyObject* line = PyDict_GetItemWithError(f, t->key_line);
        if (!line && PyErr_Occurred()) return false;
        if (!name) name = t->empty;
        if (!file) file = t->empty;
        if (line && PyLong_CheckExact(line) && PyUnicode_CheckExact(name) && PyUnicode_CheckExact(file)) {
            int overflow = 0;
            long long v = PyLong_AsLongLongAndOverflow(line, &overflow);
            if (v == -1 && PyErr_Occurred()) return false;
            if (!overflow && v >= 0) {
                row->name = string_id(t, name);
                row->file = row->name < 0 ? -2 : string_id(t, file);
                row->line = v;
                return row->file >= 0;
            }
        }
    }
    // anything else is read by the Python rules (memlens/io/snapshot_frames.py `read_odd_frame`)
    PyObject* r = PyObject_CallOneArg(t->read_odd_frame, f);
    if (!r) return false;
    bool ok = false;
    if (PyTuple_CheckExact(r) && PyTuple_GET_SIZE(r) == 5) {
        PyObject* name = PyTuple_GET_ITEM(r, 0);
        PyObject* file = PyTuple_GET_ITEM(r, 1);
        long long line = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 2));
        if (!(line == -1 && PyErr_Occurred()) && PyUnicode_CheckExact(name) && PyUnicode_CheckExact(file)) {
            row->name = string_id(t, name);
            row->file = row->name < 0 ? -2 : string_id(t, file);
            row->line = line;
            if (row->file >= 0) {
                ok = true;
                *unknown += PyObject_IsTrue(PyTuple_GET_ITEM(r, 3));
                *odd += PyObject_IsTrue(PyTuple_GET_ITEM(r, 4));
            }
        } else if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "read_odd_frame must return (str, str, int, flag, flag)");
        }
    } else {
        PyErr_SetString(PyExc_TypeError, "read_odd_frame must return a 5-tuple");
    }
    Py_DECREF(r);
    return ok;
}

// Start loading the string-table slots of a list's usual frames, so that their cache misses overlap
// (the table of a snapshot with millions of distinct names is far bigger than the cache).
void prefetch_strings(FrameTable* t, PyObject* frames, Py_ssize_t count) {
    const std::vector<uint64_t>& slots = t->string_ids->slots;
    size_t mask = slots.size() - 1;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject* f = PySequence_Fast_GET_ITEM(frames, i);
        if (!PyDict_CheckExact(f)) continue;
        PyObject* name = PyDict_GetItemWithError(f, t->key_name);
        if (!name || !PyUnicode_CheckExact(name)) { PyErr_Clear(); continue; }
        Py_hash_t h = PyObject_Hash(name);  // cached in the str for the lookup that follows
        if (h == -1) { PyErr_Clear(); continue; }
        __builtin_prefetch(&slots[(uint32_t)mix((uint64_t)h) & mask]);
    }
}

bool raise_too_many_frames(FrameTable* t, Py_ssize_t count) {
    PyObject* exc = PyObject_CallFunction(t->too_many_frames, "nn", count, t->max_frames);
    if (!exc) return false;
    PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
    Py_DECREF(exc);
    return false;
}

// Stack id of a frames value (the rules of StackInterner.intern); -2 on error (exception set).
int64_t intern_frames(FrameTable* t, PyObject* frames) {
    if (t->sealed) {
        PyErr_SetString(PyExc_RuntimeError, "FrameTable.drop_index() ran: no more stacks can be interned");
        return -2;
    }
    if (Py_IS_TYPE(frames, (PyTypeObject*)t->stack_ref_type)) {
        PyObject* sid = PyObject_GetAttrString(frames, "sid");
        if (!sid) return -2;
        long long v = PyLong_AsLongLong(sid);
        Py_DECREF(sid);
        return (v == -1 && PyErr_Occurred()) ? -2 : v;
    }
    int truth = PyObject_IsTrue(frames);
    if (truth < 0) return -2;
    if (!truth) return kNoStack;
    if (!PyList_CheckExact(frames) && !PyTuple_CheckExact(frames)) {
        t->odd_frames += 1;
        return kNoStack;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(frames);
    if (count > t->max_frames) return raise_too_many_frames(t, count) ? 0 : -2;
    std::vector<Row>& rows = *t->scratch;
    rows.clear();
    long long unknown = 0, odd = 0;
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)count;
    prefetch_strings(t, frames, count);
    for (Py_ssize_t i = 0; i < count; i++) {
        // a list may shrink under a callback (read_odd_frame calls str()): re-read the size
        if (i >= PySequence_Fast_GET_SIZE(frames)) break;
        PyObject* f = PySequence_Fast_GET_ITEM(frames, i);
        Py_INCREF(f);
        Row row;
        bool ok = read_frame(t, f, &row, &unknown, &odd);
        Py_DECREF(f);
        if (!ok) return -2;
        rows.push_back(row);
        h = mix(h ^ ((uint64_t)(uint32_t)row.name << 32 | (uint32_t)row.file) ^ mix((uint64_t)row.line));
    }
    const std::vector<Row>& flat = *t->stack_rows;
    const std::vector<int64_t>& start = *t->stack_start;
    int32_t sid = t->stack_ids->find(h, [&](int32_t k) {
        int64_t a = start[k], len = start[k + 1] - a;
        return len == (int64_t)rows.size() && std::memcmp(flat.data() + a, rows.data(), rows.size() * sizeof(Row)) == 0;
    });
    if (sid < 0) {
        sid = (int32_t)(start.size() - 1);
        t->stack_rows->insert(t->stack_rows->end(), rows.begin(), rows.end());
        t->stack_start->push_back((int64_t)t->stack_rows->size());
        t->stack_ids->insert(h, sid);
    }
    if (unknown || odd) {  // repairs count once per stack as written (snapshot_frames.repair_key)
        PyObject* key = PyObject_CallFunction(t->repair_key, "iO", sid, frames);
        if (!key) return -2;
        int seen = PySet_Contains(t->repairs_seen, key);
        if (seen == 0) seen = PySet_Add(t->repairs_seen, key);
        else if (seen == 1) { unknown = odd = 0; seen = 0; }
        Py_DECREF(key);
        if (seen < 0) return -2;
        t->unknown_lines += unknown;
        t->odd_frames += odd;
    }
    return sid;
}

PyObject* FrameTable_new(PyTypeObject* type, PyObject* args, PyObject*) {
    Py_ssize_t max_frames;
    PyObject *read_odd, *too_many, *ref_type, *repair_key;
    if (!PyArg_ParseTuple(args, "nOOOO", &max_frames, &read_odd, &too_many, &ref_type, &repair_key)) return nullptr;
    if (!PyType_Check(ref_type)) {
        PyErr_SetString(PyExc_TypeError, "stack_ref_type must be a type");
        return nullptr;
    }
    FrameTable* t = (FrameTable*)type->tp_alloc(type, 0);
    if (!t) return nullptr;
    t->strings = new std::vector<PyObject*>();
    t->string_ids = new IdSet();
    t->stack_rows = new std::vector<Row>();
    t->stack_start = new std::vector<int64_t>(1, 0);
    t->stack_ids = new IdSet();
    t->scratch = new std::vector<Row>();
    t->aten_names = new std::vector<int32_t>();
    t->max_frames = max_frames;
    Py_INCREF(read_odd); t->read_odd_frame = read_odd;
    Py_INCREF(too_many); t->too_many_frames = too_many;
    Py_INCREF(ref_type); t->stack_ref_type = ref_type;
    Py_INCREF(repair_key); t->repair_key = repair_key;
    t->repairs_seen = PySet_New(nullptr);
    t->key_name = PyUnicode_InternFromString("name");
    t->key_filename = PyUnicode_InternFromString("filename");
    t->key_line = PyUnicode_InternFromString("line");
    t->empty = PyUnicode_FromString("");
    t->aten_prefix = PyUnicode_FromString("at::_ops::");
    if (!t->key_name || !t->key_filename || !t->key_line || !t->empty || !t->aten_prefix || !t->repairs_seen) {
        Py_DECREF(t);
        return nullptr;
    }
    return (PyObject*)t;
}

void FrameTable_dealloc(FrameTable* t) {
    if (t->strings) for (PyObject* s : *t->strings) Py_DECREF(s);
    delete t->strings; delete t->string_ids; delete t->stack_rows; delete t->stack_start; delete t->stack_ids;
    delete t->scratch;
    delete t->aten_names;
    Py_XDECREF(t->read_odd_frame); Py_XDECREF(t->too_many_frames); Py_XDECREF(t->stack_ref_type);
    Py_XDECREF(t->repair_key); Py_XDECREF(t->repairs_seen);
    Py_XDECREF(t->key_name); Py_XDECREF(t->key_filename); Py_XDECREF(t->key_line); Py_XDECREF(t->empty);
    Py_XDECREF(t->aten_prefix);
    Py_TYPE(t)->tp_free((PyObject*)t);
}

PyObject* FrameTable_intern(FrameTable* t, PyObject* frames) {
    int64_t sid = intern_frames(t, frames);
    if (sid == -2) return nullptr;
    return PyLong_FromLongLong(sid);
}

template <class T>
PyObject* as_bytes(const std::vector<T>& v) {
    return PyBytes_FromStringAndSize((const char*)v.data(), (Py_ssize_t)(v.size() * sizeof(T)));
}

// columns() -> (strings, stack rows as (name id int32, file id int32, line int64) records, stack_start int64,
//               ids of strings starting "at::_ops::" int32), arrays as native bytes
PyObject* FrameTable_columns(FrameTable* t, PyObject*) {
    PyObject* strings = PyList_New((Py_ssize_t)t->strings->size());
    if (!strings) return nullptr;
    for (size_t i = 0; i < t->strings->size(); i++) {
        Py_INCREF((*t->strings)[i]);
        PyList_SET_ITEM(strings, (Py_ssize_t)i, (*t->strings)[i]);
    }
    return Py_BuildValue("(NNNN)", strings, as_bytes(*t->stack_rows), as_bytes(*t->stack_start),
                         as_bytes(*t->aten_names));
}

// plain_utf8() -> (plain: uint8 per string, offsets: int32 per plain string + 1, data), the "plain" strings
// (ASCII without a newline) as an Arrow string array's buffers, so that Arrow's kernels can test them
// without converting millions of Python strings; None when their bytes would overflow int32 offsets
PyObject* FrameTable_plain_utf8(FrameTable* t, PyObject*) {
    const std::vector<PyObject*>& strings = *t->strings;
    std::vector<uint8_t> plain(strings.size(), 0);
    std::vector<int32_t> offsets(1, 0);
    std::vector<char> data;
    for (size_t i = 0; i < strings.size(); i++) {
        PyObject* s = strings[i];
        if (!PyUnicode_IS_ASCII(s)) continue;
        const char* bytes = (const char*)PyUnicode_DATA(s);
        Py_ssize_t len = PyUnicode_GET_LENGTH(s);
        if (std::memchr(bytes, '\n', (size_t)len)) continue;
        if ((int64_t)data.size() + len > INT32_MAX) Py_RETURN_NONE;
        plain[i] = 1;
        data.insert(data.end(), bytes, bytes + len);
        offsets.push_back((int32_t)data.size());
    }
    return Py_BuildValue("(NNN)", as_bytes(plain), as_bytes(offsets), as_bytes(data));
}

// drop_index(): free the hash lookups (a third of the table's memory) once every stack is interned
PyObject* FrameTable_drop_index(FrameTable* t, PyObject*) {
    t->sealed = true;
    *t->string_ids = IdSet();
    *t->stack_ids = IdSet();
    Py_RETURN_NONE;
}

PyObject* FrameTable_counts(FrameTable* t, PyObject*) {
    return Py_BuildValue("(LLn)", t->unknown_lines, t->odd_frames, (Py_ssize_t)(t->stack_start->size() - 1));
}

PyMethodDef FrameTable_methods[] = {
    {"intern", (PyCFunction)FrameTable_intern, METH_O, "Stack id of a frames list (StackInterner.intern)."},
    {"columns", (PyCFunction)FrameTable_columns, METH_NOARGS, "The interned strings, frames and stacks."},
    {"counts", (PyCFunction)FrameTable_counts, METH_NOARGS, "(unknown_lines, odd_frames, stacks)."},
    {"drop_index", (PyCFunction)FrameTable_drop_index, METH_NOARGS, "Free the lookups; interning ends."},
    {"plain_utf8", (PyCFunction)FrameTable_plain_utf8, METH_NOARGS, "The plain strings as Arrow buffers."},
    {nullptr, nullptr, 0, nullptr},
};

PyTypeObject FrameTableType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ---- the columns of one device trace (snapshot_stream.EntryColumns) ------------------------------------------
constexpr int kIntFields = 5;    // addr, size, stream, time_us, device_free
constexpr int kCodedFields = 3;  // action, compile_context, user_metadata
const char* kIntNames[kIntFields] = {"addr", "size", "stream", "time_us", "device_free"};
const char* kCodedNames[kCodedFields] = {"action", "compile_context", "user_metadata"};

struct Columns {
    PyObject* target = nullptr;  // the device trace list (owned)
    std::vector<int64_t> ints[kIntFields];
    std::vector<int64_t> stack_id;
    std::vector<int32_t> codes[kCodedFields];
    PyObject* code_of[kCodedFields] = {};  // dict value -> code (owned)
    PyObject* names[kCodedFields] = {};    // list of values (owned)
};

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

struct Walk {
    const unsigned char* data = nullptr;
    Py_ssize_t n = 0;
    bool drop_pages = false;         // data is an mmap: give consumed pages back
    Py_ssize_t dropped = 0;          // bytes of data already given back
    SlotSet referenced;              // the memo slots some GET reads
    std::vector<PyObject*> kept;     // owned refs of those slots, in slot order (index: rank of the slot)
    Py_ssize_t memo_size = 0;        // slots memoized so far, kept or not
    std::unordered_map<PyObject*, size_t> slot_of;  // dict/list in a referenced slot -> its index in `kept`
    FrameTable* table = nullptr;
    PyObject* unsupported = nullptr;     // exception class
    PyObject* too_many_loose = nullptr;  // exception class
    PyObject* released = nullptr;
    PyObject* action_key = nullptr;      // "action" (owned)
    PyObject* frames_key = nullptr;      // "frames" (owned)
    PyObject* int_keys[kIntFields] = {};
    PyObject* coded_keys[kCodedFields] = {};
    Py_ssize_t max_stack = 0;
    PyObject* stack = nullptr;           // owned list
    std::vector<PyObject*> metastack;    // owned lists
    std::vector<Columns*> columns;       // in order of first entry
    std::unordered_map<PyObject*, Columns*> columns_of;

    ~Walk() {
        Py_XDECREF(stack);
        for (PyObject* s : metastack) Py_DECREF(s);
        for (PyObject* m : kept) Py_XDECREF(m);
        for (Columns* c : columns) {
            Py_XDECREF(c->target);
            for (int k = 0; k < kCodedFields; k++) { Py_XDECREF(c->code_of[k]); Py_XDECREF(c->names[k]); }
            delete c;
        }
        Py_XDECREF(action_key);
        Py_XDECREF(frames_key);
        for (PyObject* k : int_keys) Py_XDECREF(k);
        for (PyObject* k : coded_keys) Py_XDECREF(k);
    }
    bool init_keys() {
        action_key = PyUnicode_InternFromString("action");
        frames_key = PyUnicode_InternFromString("frames");
        bool ok = action_key && frames_key;
        for (int k = 0; k < kIntFields; k++) ok = ok && (int_keys[k] = PyUnicode_InternFromString(kIntNames[k]));
        for (int k = 0; k < kCodedFields; k++)
            ok = ok && (coded_keys[k] = PyUnicode_InternFromString(kCodedNames[k]));
        return ok;
    }
    PyObject* fail(const char* why) {
        PyErr_SetString(unsupported, why);
        return nullptr;
    }
    bool fail_b(const char* why) {
        PyErr_SetString(unsupported, why);
        return false;
    }
    bool loose_ok() {
        if (PyList_GET_SIZE(stack) > max_stack) {
            PyErr_SetString(too_many_loose, "too many loose objects");
            return false;
        }
        return true;
    }
    bool push(PyObject* obj) {  // steals obj
        if (obj == nullptr) return false;
        int rc = PyList_Append(stack, obj);
        Py_DECREF(obj);
        return rc == 0;
    }
    PyObject* pop_meta() {  // returns the owned list that becomes `stack`, or nullptr
        if (metastack.empty()) return fail("pop from empty metastack");
        PyObject* s = metastack.back();
        metastack.pop_back();
        return s;
    }
    PyObject* memo_get(Py_ssize_t slot) {  // borrowed
        if (slot < 0 || slot >= memo_size) return fail("memo index out of range");
        // the first pass saw every GET the walk executes, so a read slot is always kept
        if (!referenced.has((size_t)slot)) return fail("memo slot not kept");
        return kept[referenced.rank((size_t)slot)];
    }
    bool memoize_top(Py_ssize_t slot) {
        Py_ssize_t size = PyList_GET_SIZE(stack);
        if (size == 0) return fail_b("memoize on empty stack");
        PyObject* top = PyList_GET_ITEM(stack, size - 1);
        memo_size++;
        if (!referenced.has((size_t)slot)) return true;  // no GET reads this slot: hold nothing
        if (PyDict_CheckExact(top) || PyList_CheckExact(top)) slot_of[top] = kept.size();
        Py_INCREF(top);
        kept.push_back(top);  // slots are memoized in order, so this index is the slot's rank
        return true;
    }
    void forget(PyObject* obj, PyObject* replacement) {  // steals replacement
        auto it = slot_of.find(obj);
        if (it == slot_of.end()) { Py_DECREF(replacement); return; }
        PyObject*& cell = kept[it->second];
        Py_XDECREF(cell);
        cell = replacement;
        slot_of.erase(it);
    }
    int is_entry(PyObject* obj) {
        if (!PyDict_CheckExact(obj)) return 0;
        return PyDict_Contains(obj, action_key);
    }
    bool need(Py_ssize_t pos, Py_ssize_t count) {
        if (pos + count > n) return fail_b("truncated");
        return true;
    }
    // the last `take` items of the stack (fewer when it holds fewer), replaced by one tuple of them
    bool tuple_top(Py_ssize_t take) {
        Py_ssize_t size = PyList_GET_SIZE(stack);
        Py_ssize_t from = size >= take ? size - take : 0;
        PyObject* items = PyList_GetSlice(stack, from, size);
        if (!items) return false;
        PyObject* t = PyList_AsTuple(items);
        Py_DECREF(items);
        if (!t) return false;
        if (PyList_SetSlice(stack, from, size, nullptr)) { Py_DECREF(t); return false; }
        return push(t);
    }
    void drop_consumed(Py_ssize_t pos) {
        // every 16 MiB: the pages behind `pos` are never read again (arguments are decoded into objects)
        static const Py_ssize_t page = sysconf(_SC_PAGESIZE);
        Py_ssize_t upto = (pos / page) * page;
        if (!drop_pages || upto - dropped < (16 << 20)) return;
        madvise((void*)(data + dropped), (size_t)(upto - dropped), MADV_DONTNEED);
        dropped = upto;
    }
    // the frames limit while a list grows (snapshot_stream.check_frames; frames here are always dicts)
    bool check_frames(PyObject* target, PyObject* first, Py_ssize_t adding) {
        Py_ssize_t total = PyList_GET_SIZE(target) + adding;
        if (total <= table->max_frames || adding == 0 || !PyDict_CheckExact(first)) return true;
        int has = PyDict_Contains(first, table->key_filename);
        if (has < 0) return false;
        return has ? raise_too_many_frames(table, total) : true;
    }
    bool take_entries(PyObject* target, PyObject* const* items, Py_ssize_t count);
    PyObject* finish();
    PyObject* run();
};

// EntryColumns.add for one batch: typed columns, stack ids, and the entries' memo slots released
bool Walk::take_entries(PyObject* target, PyObject* const* items, Py_ssize_t count) {
    Columns* cols;
    auto found = columns_of.find(target);
    if (found == columns_of.end()) {
        if (PyList_GET_SIZE(target)) return fail_b("entries appended to a list that holds other items");
        cols = new Columns();
        columns.push_back(cols);
        Py_INCREF(target);
        cols->target = target;
        for (int k = 0; k < kCodedFields; k++) {
            cols->code_of[k] = PyDict_New();
            cols->names[k] = PyList_New(0);
            if (!cols->code_of[k] || !cols->names[k]) return false;
        }
        columns_of[target] = cols;
    } else {
        cols = found->second;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject* e = items[i];
        if (!PyDict_CheckExact(e)) return fail_b("entry is not a dict");
        for (int k = 0; k < kIntFields; k++) {
            PyObject* v = PyDict_GetItemWithError(e, int_keys[k]);
            if (!v && PyErr_Occurred()) return false;
            int64_t value = kMissing;
            if (v && v != Py_None) {
                if (!PyLong_Check(v)) return fail_b("entry field is not an int");  // array('q') TypeError
                int overflow = 0;
                long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
                if (x == -1 && PyErr_Occurred()) return false;
                if (overflow) return fail_b("entry field beyond int64");
                value = x;
            }
            cols->ints[k].push_back(value);
        }
        for (int k = 0; k < kCodedFields; k++) {
            PyObject* v = PyDict_GetItemWithError(e, coded_keys[k]);
            if (!v && PyErr_Occurred()) return false;
            if (!v) v = Py_None;
            PyObject* code = PyDict_GetItemWithError(cols->code_of[k], v);  // borrowed
            if (!code && PyErr_Occurred()) {  // unhashable: the Python dict lookup raises TypeError too
                PyErr_Clear();
                return fail_b("unhashable entry field");
            }
            long c;
            if (code) {
                c = PyLong_AsLong(code);
            } else {
                c = (long)PyList_GET_SIZE(cols->names[k]);
                PyObject* cobj = PyLong_FromLong(c);
                if (!cobj) return false;
                int rc = PyDict_SetItem(cols->code_of[k], v, cobj);
                Py_DECREF(cobj);
                if (rc || PyList_Append(cols->names[k], v)) return false;
            }
            cols->codes[k].push_back((int32_t)c);
        }
        PyObject* frames = PyDict_GetItemWithError(e, frames_key);
        if (!frames && PyErr_Occurred()) return false;
        if (!frames) frames = Py_None;
        Py_INCREF(frames);
        int64_t sid = intern_frames(table, frames);
        if (sid == -2) { Py_DECREF(frames); return false; }
        if (PyList_CheckExact(frames) && PyList_GET_SIZE(frames) && slot_of.count(frames)) {
            // a later reference to this list resolves to the id
            PyObject* ref = PyObject_CallFunction(table->stack_ref_type, "L", (long long)sid);
            if (!ref) { Py_DECREF(frames); return false; }
            forget(frames, ref);
        }
        Py_DECREF(frames);
        cols->stack_id.push_back(sid);
        Py_INCREF(released);
        forget(e, released);
    }
    return true;
}
PyObject* Walk::run() {
    stack = PyList_New(0);
    if (!stack) return nullptr;
    Py_ssize_t pos = 0;
    for (;;) {
        if (pos >= n) return fail("index out of range");
        unsigned char op = data[pos++];
        switch (op) {
        case 0x6A: {  // LONG_BINGET, a run of them
            Py_ssize_t start = PyList_GET_SIZE(stack);
            Py_ssize_t p = pos - 1;
            if (!(p + 5 <= n)) return fail("no run of gets");
            while (p + 5 <= n && data[p] == 0x6A) {
                uint32_t slot;
                std::memcpy(&slot, data + p + 1, 4);
                PyObject* v = memo_get((Py_ssize_t)slot);
                if (!v) return nullptr;
                if (PyList_Append(stack, v)) return nullptr;
                p += 5;
            }
            for (Py_ssize_t i = start; i < PyList_GET_SIZE(stack); i++)
                if (PyList_GET_ITEM(stack, i) == released) return fail("reference to a converted entry");
            pos = p;
            if (!loose_ok()) return nullptr;
            break;
        }
        case 0x68: {  // BINGET
            if (pos >= n) return fail("index out of range");
            PyObject* v = memo_get(data[pos]);
            if (!v) return nullptr;
            if (v == released) return fail("reference to a converted entry");
            if (PyList_Append(stack, v)) return nullptr;
            pos += 1;
            if (!loose_ok()) return nullptr;
            break;
        }
        case 0x94:  // MEMOIZE
            if (!memoize_top(memo_size)) return nullptr;
            break;
        case 0x28: {  // MARK
            PyObject* fresh = PyList_New(0);
            if (!fresh) return nullptr;
            metastack.push_back(stack);
            stack = fresh;
            break;
        }
        case 0x8A: {  // LONG1
            if (pos >= n) return fail("index out of range");
            Py_ssize_t size = data[pos];
            if (!need(pos, size + 1)) return nullptr;
            if (!push(_PyLong_FromByteArray(data + pos + 1, (size_t)size, 1, 1))) return nullptr;
            pos += 1 + size;
            break;
        }
        case 0x4A: {  // BININT
            if (!need(pos, 4)) return nullptr;
            int32_t v;
            std::memcpy(&v, data + pos, 4);
            if (!push(PyLong_FromLong(v))) return nullptr;
            pos += 4;
            break;
        }
        case 0x7D:  // EMPTY_DICT
            if (!push(PyDict_New()) || !loose_ok()) return nullptr;
            break;
        case 0x75: {  // SETITEMS
            PyObject* items = stack;
            PyObject* outer = pop_meta();
            if (!outer) return nullptr;
            stack = outer;
            Py_ssize_t size = PyList_GET_SIZE(stack);
            if (size == 0) { Py_DECREF(items); return fail("index out of range"); }
            PyObject* target = PyList_GET_ITEM(stack, size - 1);
            if (!PyDict_CheckExact(target)) { Py_DECREF(items); return fail("SETITEMS on a non-dict"); }
            Py_ssize_t m = PyList_GET_SIZE(items) / 2;
            for (Py_ssize_t i = 0; i < m; i++) {
                if (PyDict_SetItem(target, PyList_GET_ITEM(items, 2 * i), PyList_GET_ITEM(items, 2 * i + 1))) {
                    Py_DECREF(items);
                    return nullptr;
                }
            }
            Py_DECREF(items);
            break;
        }
        case 0x4B:  // BININT1
            if (pos >= n) return fail("index out of range");
            if (!push(PyLong_FromLong(data[pos]))) return nullptr;
            pos += 1;
            if (!loose_ok()) return nullptr;
            break;
        case 0x5D:  // EMPTY_LIST
            if (!push(PyList_New(0)) || !loose_ok()) return nullptr;
            break;
        case 0x65: {  // APPENDS
            PyObject* items = stack;
            PyObject* outer = pop_meta();
            if (!outer) return nullptr;
            stack = outer;
            Py_ssize_t size = PyList_GET_SIZE(stack);
            if (size == 0) { Py_DECREF(items); return fail("index out of range"); }
            PyObject* target = PyList_GET_ITEM(stack, size - 1);
            if (!PyList_CheckExact(target)) { Py_DECREF(items); return fail("APPENDS on a non-list"); }
            Py_INCREF(target);
            Py_ssize_t count = PyList_GET_SIZE(items);
            int entry = count ? is_entry(PyList_GET_ITEM(items, 0)) : 0;
            bool ok = entry >= 0;
            if (ok && entry) {
                ok = take_entries(target, PySequence_Fast_ITEMS(items), count);
            } else if (ok) {
                ok = check_frames(target, count ? PyList_GET_ITEM(items, 0) : nullptr, count);
                if (ok) ok = PyList_SetSlice(target, PyList_GET_SIZE(target), PyList_GET_SIZE(target), items) == 0;
            }
            Py_DECREF(target);
            Py_DECREF(items);
            if (!ok) return nullptr;
            drop_consumed(pos);
            break;
        }
        case 0x8C: {  // SHORT_BINUNICODE
            if (pos >= n) return fail("index out of range");
            Py_ssize_t size = data[pos];
            if (!need(pos, size + 1)) return nullptr;
            if (!push(PyUnicode_DecodeUTF8((const char*)data + pos + 1, size, "surrogatepass"))) return nullptr;
            pos += 1 + size;
            break;
        }
        case 0x4D: {  // BININT2
            if (!need(pos, 2)) return nullptr;
            long v = data[pos] | (data[pos + 1] << 8);
            if (!push(PyLong_FromLong(v))) return nullptr;
            pos += 2;
            break;
        }
        case 0x61: {  // APPEND
            Py_ssize_t size = PyList_GET_SIZE(stack);
            if (size == 0) return fail("pop from empty list");
            PyObject* value = PyList_GET_ITEM(stack, size - 1);
            Py_INCREF(value);
            if (PyList_SetSlice(stack, size - 1, size, nullptr)) { Py_DECREF(value); return nullptr; }
            size -= 1;
            if (size == 0) { Py_DECREF(value); return fail("index out of range"); }
            PyObject* target = PyList_GET_ITEM(stack, size - 1);
            if (!PyList_CheckExact(target)) { Py_DECREF(value); return fail("APPEND on a non-list"); }
            Py_INCREF(target);
            int entry = is_entry(value);
            bool ok = entry >= 0;
            if (ok && entry) {
                ok = take_entries(target, &value, 1);
            } else if (ok) {
                ok = check_frames(target, value, 1) && PyList_Append(target, value) == 0;
            }
            Py_DECREF(target);
            Py_DECREF(value);
            if (!ok) return nullptr;
            break;
        }
        case 0x73: {  // SETITEM
            Py_ssize_t size = PyList_GET_SIZE(stack);
            if (size < 2) return fail("pop from empty list");
            if (size < 3) return fail("index out of range");
            PyObject* target = PyList_GET_ITEM(stack, size - 3);
            if (!PyDict_CheckExact(target)) return fail("SETITEM on a non-dict");
            if (PyDict_SetItem(target, PyList_GET_ITEM(stack, size - 2), PyList_GET_ITEM(stack, size - 1)))
                return nullptr;
            if (PyList_SetSlice(stack, size - 2, size, nullptr)) return nullptr;
            break;
        }
        case 0x4E:  // NONE
            Py_INCREF(Py_None);
            if (!push(Py_None) || !loose_ok()) return nullptr;
            break;
        case 0x88:  // NEWTRUE
            Py_INCREF(Py_True);
            if (!push(Py_True) || !loose_ok()) return nullptr;
            break;
        case 0x89:  // NEWFALSE
            Py_INCREF(Py_False);
            if (!push(Py_False) || !loose_ok()) return nullptr;
            break;
        case 0x47: {  // BINFLOAT (big-endian)
            if (!need(pos, 8)) return nullptr;
            double v = PyFloat_Unpack8((const char*)data + pos, 0);
            if (v == -1.0 && PyErr_Occurred()) return nullptr;
            if (!push(PyFloat_FromDouble(v))) return nullptr;
            pos += 8;
            break;
        }
        case 0x58: {  // BINUNICODE
            if (!need(pos, 4)) return nullptr;
            uint32_t size;
            std::memcpy(&size, data + pos, 4);
            if (!need(pos, (Py_ssize_t)size + 4)) return nullptr;
            if (!push(PyUnicode_DecodeUTF8((const char*)data + pos + 4, size, "surrogatepass"))) return nullptr;
            pos += 4 + (Py_ssize_t)size;
            break;
        }
        case 0x95:  // FRAME
            pos += 8;
            break;
        case 0x29:  // EMPTY_TUPLE
            if (!push(PyTuple_New(0)) || !loose_ok()) return nullptr;
            break;
        case 0x85:  // TUPLE1
            if (PyList_GET_SIZE(stack) == 0) return fail("index out of range");
            if (!tuple_top(1)) return nullptr;
            break;
        case 0x86:  // TUPLE2
            if (!tuple_top(2)) return nullptr;
            break;
        case 0x87:  // TUPLE3
            if (!tuple_top(3)) return nullptr;
            break;
        case 0x74: {  // TUPLE (from mark)
            PyObject* items = PyList_AsTuple(stack);
            if (!items) return nullptr;
            PyObject* outer = pop_meta();
            if (!outer) { Py_DECREF(items); return nullptr; }
            Py_DECREF(stack);
            stack = outer;
            if (!push(items)) return nullptr;
            break;
        }
        case 0x71:    // BINPUT
        case 0x72: {  // LONG_BINPUT
            Py_ssize_t slot;
            if (op == 0x71) {
                if (pos >= n) return fail("index out of range");
                slot = data[pos];
                pos += 1;
            } else {
                if (!need(pos, 4)) return nullptr;
                uint32_t s;
                std::memcpy(&s, data + pos, 4);
                slot = (Py_ssize_t)s;
                pos += 4;
            }
            if (slot != memo_size) return fail("memo slots out of order");
            if (!memoize_top(slot)) return nullptr;
            break;
        }
        case 0x80:  // PROTO
            if (pos >= n) return fail("index out of range");
            if (data[pos] > 5) return fail("unknown protocol");
            pos += 1;
            break;
        case 0x2E:  // STOP
            return finish();
        default:
            return fail("unsupported opcode");
        }
    }
}

// (stack at STOP, metastack depth at STOP, [(device trace list, (int columns as int64 bytes, 5),
//  stack ids as int64 bytes, (codes as int32 bytes, 3), (distinct values, 3)), ...])
PyObject* Walk::finish() {
    PyObject* parts = PyList_New(0);
    if (!parts) return nullptr;
    for (Columns* c : columns) {
        PyObject* ints = PyTuple_New(kIntFields);
        PyObject* codes = PyTuple_New(kCodedFields);
        PyObject* names = PyTuple_New(kCodedFields);
        bool ok = ints && codes && names;
        for (int k = 0; ok && k < kIntFields; k++) {
            PyObject* b = as_bytes(c->ints[k]);
            ok = b != nullptr;
            if (ok) PyTuple_SET_ITEM(ints, k, b);
        }
        for (int k = 0; ok && k < kCodedFields; k++) {
            PyObject* b = as_bytes(c->codes[k]);
            ok = b != nullptr;
            if (ok) {
                PyTuple_SET_ITEM(codes, k, b);
                Py_INCREF(c->names[k]);
                PyTuple_SET_ITEM(names, k, c->names[k]);
            }
        }
        PyObject* stack_ids = ok ? as_bytes(c->stack_id) : nullptr;
        PyObject* part = stack_ids ? Py_BuildValue("(ONNNN)", c->target, ints, stack_ids, codes, names) : nullptr;
        if (!part) {
            if (!stack_ids) { Py_XDECREF(ints); Py_XDECREF(codes); Py_XDECREF(names); }
            Py_DECREF(parts);
            return nullptr;
        }
        int rc = PyList_Append(parts, part);
        Py_DECREF(part);
        if (rc) { Py_DECREF(parts); return nullptr; }
    }
    return Py_BuildValue("(OnN)", stack, (Py_ssize_t)metastack.size(), parts);
}

// walk(data, frame_table, unsupported, too_many_loose, released, max_stack, drop_pages)
//   -> (stack at STOP, metastack depth at STOP, entry columns per device trace list)
PyObject* walk(PyObject*, PyObject* args) {
    PyObject *data, *table, *unsupported, *too_many_loose, *released;
    Py_ssize_t max_stack;
    int drop_pages;
    if (!PyArg_ParseTuple(args, "OO!OOOnp", &data, &FrameTableType, &table, &unsupported, &too_many_loose,
                          &released, &max_stack, &drop_pages))
        return nullptr;
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)) return nullptr;
    PyObject* result = nullptr;
    {
        Walk w;
        w.data = (const unsigned char*)view.buf;
        w.n = view.len;
        w.drop_pages = drop_pages != 0;
        w.table = (FrameTable*)table;
        w.unsupported = unsupported;
        w.too_many_loose = too_many_loose;
        w.released = released;
        w.max_stack = max_stack;
        w.referenced = referenced_slots(w.data, w.n, w.drop_pages);
        if (w.init_keys()) result = w.run();
    }
    PyBuffer_Release(&view);
    return result;
}

PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, "Interpret a snapshot pickle's opcodes (see memlens/io/snapshot_stream.py)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "memlens_stream_walk", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_memlens_stream_walk(void) {
    FrameTableType.tp_name = "memlens_stream_walk.FrameTable";
    FrameTableType.tp_basicsize = sizeof(FrameTable);
    FrameTableType.tp_flags = Py_TPFLAGS_DEFAULT;
    FrameTableType.tp_doc = "Interned frames and stacks (the compiled StackInterner): "
                            "FrameTable(max_frames, read_odd_frame, too_many_frames, stack_ref_type).";
    FrameTableType.tp_new = FrameTable_new;
    FrameTableType.tp_dealloc = (destructor)FrameTable_dealloc;
    FrameTableType.tp_methods = FrameTable_methods;
    if (PyType_Ready(&FrameTableType) < 0) return nullptr;
    PyObject* m = PyModule_Create(&module);
    if (!m) return nullptr;
    Py_INCREF(&FrameTableType);
    if (PyModule_AddObject(m, "FrameTable", (PyObject*)&FrameTableType) < 0) {
        Py_DECREF(&FrameTableType);
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}

// FrameTable: the compiled StackInterner of memlens/io/snapshot/frames.py (strings interned once, each
// distinct stack a run of (name id, filename id, line) rows). Part of stream_walk.cpp's translation unit.
#pragma once
#include <Python.h>

#include <cstdint>
#include <cstring>
#include <new>
#include <stdexcept>
#include <vector>

#include "keyed_hash.h"

namespace {

constexpr int64_t kMissing = INT64_MIN;  // an absent/None integer field (snapshot_stream.MISSING)
constexpr int32_t kNoStack = -1;

// Every entry point from Python runs its C++ under this: a C++ exception (std::bad_alloc under a memory
// limit, std::length_error) must never cross into the interpreter, where it would abort the process. It
// becomes a MemoryError, which the reader treats as the Python walker treats its own (see
// snapshot_stream.stream_snapshot).
template <class F>
PyObject* guarded(F body) {
    try {
        return body();
    } catch (const std::bad_alloc&) {
        return PyErr_NoMemory();
    } catch (const std::exception& exc) {
        PyErr_Format(PyExc_MemoryError, "the compiled snapshot walker ran out of room (%s)", exc.what());
        return nullptr;
    } catch (...) {
        PyErr_SetString(PyExc_MemoryError, "the compiled snapshot walker failed (unknown C++ exception)");
        return nullptr;
    }
}

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
    uint64_t hh = keyed((uint64_t)h);
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
    // anything else is read by the Python rules (memlens/io/snapshot/frames.py `read_odd_frame`)
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
        __builtin_prefetch(&slots[(uint32_t)keyed((uint64_t)h) & mask]);
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
    SipHash hash;  // keyed: a file cannot choose lines that make its stacks collide
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
        hash.add((uint64_t)(uint32_t)row.name << 32 | (uint32_t)row.file);
        hash.add((uint64_t)row.line);
    }
    const std::vector<Row>& flat = *t->stack_rows;
    const std::vector<int64_t>& start = *t->stack_start;
    uint64_t h = hash.finish();
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
    try {  // the dealloc below frees whichever of these were made
        t->strings = new std::vector<PyObject*>();
        t->string_ids = new IdSet();
        t->stack_rows = new std::vector<Row>();
        t->stack_start = new std::vector<int64_t>(1, 0);
        t->stack_ids = new IdSet();
        t->scratch = new std::vector<Row>();
        t->aten_names = new std::vector<int32_t>();
    } catch (const std::bad_alloc&) {
        Py_DECREF(t);
        return PyErr_NoMemory();
    }
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

PyObject* FrameTable_intern_(FrameTable* t, PyObject* frames) {
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
PyObject* FrameTable_columns_(FrameTable* t, PyObject*) {
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
PyObject* FrameTable_plain_utf8_(FrameTable* t, PyObject*) {
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
PyObject* FrameTable_drop_index_(FrameTable* t, PyObject*) {
    t->sealed = true;
    *t->string_ids = IdSet();
    *t->stack_ids = IdSet();
    Py_RETURN_NONE;
}

PyObject* FrameTable_counts(FrameTable* t, PyObject*) {
    return Py_BuildValue("(LLn)", t->unknown_lines, t->odd_frames, (Py_ssize_t)(t->stack_start->size() - 1));
}

PyObject* FrameTable_intern(FrameTable* t, PyObject* frames) { return guarded([&] { return FrameTable_intern_(t, frames); }); }
PyObject* FrameTable_columns(FrameTable* t, PyObject* arg) { return guarded([&] { return FrameTable_columns_(t, arg); }); }
PyObject* FrameTable_plain_utf8(FrameTable* t, PyObject* arg) { return guarded([&] { return FrameTable_plain_utf8_(t, arg); }); }
PyObject* FrameTable_drop_index(FrameTable* t, PyObject* arg) { return guarded([&] { return FrameTable_drop_index_(t, arg); }); }
PyMethodDef FrameTable_methods[] = {
    {"intern", (PyCFunction)FrameTable_intern, METH_O, "Stack id of a frames list (StackInterner.intern)."},
    {"columns", (PyCFunction)FrameTable_columns, METH_NOARGS, "The interned strings, frames and stacks."},
    {"counts", (PyCFunction)FrameTable_counts, METH_NOARGS, "(unknown_lines, odd_frames, stacks)."},
    {"drop_index", (PyCFunction)FrameTable_drop_index, METH_NOARGS, "Free the lookups; interning ends."},
    {"plain_utf8", (PyCFunction)FrameTable_plain_utf8, METH_NOARGS, "The plain strings as Arrow buffers."},
    {nullptr, nullptr, 0, nullptr},
};

PyTypeObject FrameTableType = {PyVarObject_HEAD_INIT(nullptr, 0)};

}  // namespace

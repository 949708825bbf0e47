// The opcode walk of stream_walk.cpp: its state, its limits, and the conversion of entry batches into
// columns. Part of stream_walk.cpp's translation unit.
#pragma once
#include <Python.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "frame_table.h"
#include "read_slots.h"

namespace {

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
    PyObject* input_error = nullptr;     // exception class (memlens.errors.InputError): a limit was hit
    PyObject* too_many_loose = nullptr;  // its messages (str), the same as the Python walker's
    PyObject* too_deep = nullptr;
    PyObject* tuple_too_big = nullptr;
    PyObject* duplicate_entry = nullptr;
    std::unordered_set<PyObject*> released_now;  // GET-read entries converted in this batch (borrowed)
    PyObject* released = nullptr;
    PyObject* action_key = nullptr;      // "action" (owned)
    PyObject* frames_key = nullptr;      // "frames" (owned)
    PyObject* int_keys[kIntFields] = {};
    PyObject* coded_keys[kCodedFields] = {};
    Py_ssize_t max_stack = 0;            // loose objects, counted over every MARK level together
    Py_ssize_t below = 0;                // loose objects in the lists of `metastack`
    Py_ssize_t max_depth = 0;            // MARK nesting (memlens.limits.max_nesting)
    Py_ssize_t max_tuple = 0;            // nodes of a tuple's expansion (safe_pickle.MAX_TUPLE_NODES)
    PyObject* stack = nullptr;           // owned list
    std::vector<PyObject*> metastack;    // owned lists
    std::vector<Columns*> columns;       // in order of first entry
    std::unordered_map<PyObject*, Columns*> columns_of;

    ~Walk() {
        Py_XDECREF(stack);
        for (PyObject* s : metastack) Py_DECREF(s);
        for (PyObject* m : kept) Py_XDECREF(m);
        for (Columns* c : columns) {
            if (!c) continue;
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
    bool refuse(PyObject* message) {
        PyErr_SetObject(input_error, message);
        return false;
    }
    PyObject* refused(PyObject* message) {
        refuse(message);
        return nullptr;
    }
    // checked before anything is made for `more` objects: a run of 36M GETs must not first build 36M refs
    bool room_for(Py_ssize_t more) {
        return PyList_GET_SIZE(stack) + below + more <= max_stack || refuse(too_many_loose);
    }
    bool loose_ok() { return room_for(0); }
    bool mark() {  // MARK: nesting is limited as in safe_pickle.check_opcodes (each level is a list here)
        if ((Py_ssize_t)metastack.size() + 1 > max_depth) return refuse(too_deep);
        PyObject* fresh = PyList_New(0);
        if (!fresh) return false;
        metastack.push_back(nullptr);  // may throw: nothing changed yet
        metastack.back() = stack;
        below += PyList_GET_SIZE(stack);
        stack = fresh;
        return true;
    }
    // The nodes of a tuple's expansion (it, its items, theirs, counted through shared references) up to
    // max_tuple + 1. Hashing a tuple (a dict key, a coded field) or printing it walks all of them: a DAG of
    // shared pairs 40 levels deep, a few hundred bytes of pickle, would take 2**40 steps.
    bool tuple_ok(PyObject* t) {
        Py_ssize_t size = PyTuple_GET_SIZE(t), nodes = 1 + size;
        bool nested = false;
        for (Py_ssize_t i = 0; i < size && !nested; i++) nested = PyTuple_Check(PyTuple_GET_ITEM(t, i));
        if (!nested) return nodes <= max_tuple || refuse(tuple_too_big);
        std::vector<PyObject*> todo(1, t);
        nodes = 1;
        while (!todo.empty()) {
            PyObject* x = todo.back();
            todo.pop_back();
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(x); i++) {
                if (++nodes > max_tuple) return refuse(tuple_too_big);
                PyObject* item = PyTuple_GET_ITEM(x, i);
                if (PyTuple_Check(item)) todo.push_back(item);
            }
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
        below -= PyList_GET_SIZE(s);
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
        if (!tuple_ok(t) || PyList_SetSlice(stack, from, size, nullptr)) { Py_DECREF(t); return false; }
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
        columns.push_back(nullptr);  // may throw: nothing to free yet
        cols = columns.back() = new Columns();
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
    released_now.clear();
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject* e = items[i];
        if (!PyDict_CheckExact(e)) return fail_b("entry is not a dict");
        // the same entry dict again (GETs of it): each copy would be a row, 5 bytes of file per row
        if (!released_now.empty() && released_now.count(e)) return refuse(duplicate_entry);
        for (int k = 0; k < kIntFields; k++) {
            PyObject* v = PyDict_GetItemWithError(e, int_keys[k]);
            if (!v && PyErr_Occurred()) return false;
            int64_t value = kMissing;
            if (v && v != Py_None) {
                // a bool is an int to Python, not a size or address: the dict path names it in the error
                if (!PyLong_Check(v) || PyBool_Check(v)) return fail_b("entry field is not an int");
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
        if (slot_of.count(e)) released_now.insert(e);  // only a GET-read entry can come twice
        Py_INCREF(released);
        forget(e, released);
    }
    return true;
}

}  // namespace

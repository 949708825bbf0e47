// memlens compiled snapshot-pickle walker: the opcode loop of memlens/io/snapshot/stream.py `_parse` in C
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
//   in C++ vectors; the `stacks` table is built from them with numpy (memlens/io/snapshot/frames.py).
// - Consumed pages of a read-only mmap'ed file are dropped from the resident set as the walk passes them.
// - The entry columns are built here (`Walk::take_entries`), not by a Python callback per batch.
//
// Hostile files: the tables hash with a per-process key (keyed_hash.h); the loose-object, MARK
// depth and tuple-expansion limits of the Python walker hold here too, checked before anything is made;
// no C++ exception crosses into Python (`guarded`, frame_table.h).
//
// Files, one question each: keyed_hash.h (hashing, IdSet), frame_table.h (FrameTable), read_slots.h (which
// memo slots are read), walk.h (the walk's state, limits and entry columns), this file (the opcode loop).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "walk.h"

namespace {

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
            Py_ssize_t p = pos - 1, end = p;
            if (!(p + 5 <= n)) return fail("no run of gets");
            while (end + 5 <= n && data[end] == 0x6A) end += 5;
            if (!room_for((end - p) / 5)) return nullptr;
            while (p < end) {
                uint32_t slot;
                std::memcpy(&slot, data + p + 1, 4);
                PyObject* v = memo_get((Py_ssize_t)slot);
                if (!v) return nullptr;
                if (PyList_Append(stack, v)) return nullptr;
                p += 5;
            }
            for (Py_ssize_t i = start; i < PyList_GET_SIZE(stack); i++)
                if (PyList_GET_ITEM(stack, i) == released) return refused(duplicate_entry);  // an entry again
            pos = p;
            if (!loose_ok()) return nullptr;
            break;
        }
        case 0x68: {  // BINGET
            if (pos >= n) return fail("index out of range");
            PyObject* v = memo_get(data[pos]);
            if (!v) return nullptr;
            if (v == released) return refused(duplicate_entry);
            if (PyList_Append(stack, v)) return nullptr;
            pos += 1;
            if (!loose_ok()) return nullptr;
            break;
        }
        case 0x94:  // MEMOIZE
            if (!memoize_top(memo_size)) return nullptr;
            break;
        case 0x28:  // MARK
            if (!mark()) return nullptr;
            break;
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
            if (!tuple_ok(items)) { Py_DECREF(items); return nullptr; }
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

// walk(data, frame_table, unsupported, input_error,
//      (too many loose, too deep, tuple too big, duplicate entry messages),
//      released, max_stack, max_depth, max_tuple, drop_pages)
//   -> (stack at STOP, metastack depth at STOP, entry columns per device trace list)
PyObject* walk_(PyObject* args) {
    PyObject *data, *table, *unsupported, *input_error, *released;
    PyObject *loose_msg, *deep_msg, *tuple_msg, *duplicate_msg;
    Py_ssize_t max_stack, max_depth, max_tuple;
    int drop_pages;
    if (!PyArg_ParseTuple(args, "OO!OO(UUUU)Onnnp", &data, &FrameTableType, &table, &unsupported, &input_error,
                          &loose_msg, &deep_msg, &tuple_msg, &duplicate_msg, &released, &max_stack, &max_depth,
                          &max_tuple, &drop_pages))
        return nullptr;
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)) return nullptr;
    PyObject* result = nullptr;
    try {
        Walk w;
        w.data = (const unsigned char*)view.buf;
        w.n = view.len;
        w.drop_pages = drop_pages != 0;
        w.table = (FrameTable*)table;
        w.unsupported = unsupported;
        w.input_error = input_error;
        w.too_many_loose = loose_msg;
        w.too_deep = deep_msg;
        w.tuple_too_big = tuple_msg;
        w.duplicate_entry = duplicate_msg;
        w.released = released;
        w.max_stack = max_stack;
        w.max_depth = max_depth;
        w.max_tuple = max_tuple;
        w.referenced = referenced_slots(w.data, w.n, w.drop_pages);
        if (w.init_keys()) result = w.run();
    } catch (...) {  // the Walk's destructor has let its objects go; `guarded` says what happened
        Py_XDECREF(result);
        PyBuffer_Release(&view);
        throw;
    }
    PyBuffer_Release(&view);
    return result;
}

PyObject* walk(PyObject*, PyObject* args) { return guarded([&] { return walk_(args); }); }

PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, "Interpret a snapshot pickle's opcodes (see memlens/io/snapshot/stream.py)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "memlens_stream_walk", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_memlens_stream_walk(void) {
    seed_hash_key();
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

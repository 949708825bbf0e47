// memlens compiled snapshot-pickle walker: the opcode loop of memlens/io/snapshot_stream.py `_parse`,
// statement for statement, in C (the CPython API only, no torch headers).
//
// It interprets the same opcode subset with the same checks in the same order, and shares the Python
// side's state: `memo` (a list) and `memo_index` (a dict id(container) -> slot), so that the Python
// callbacks (`take_entries`, which converts a batch of trace entries to columns and releases their memo
// slots, and `check_frames`, the frames limit) work unchanged. Every failure the Python loop turns into
// "use the general unpickler" (IndexError, struct errors, decoding errors, unsupported opcodes) raises
// `unsupported` here; the loose-object limit raises `too_many_loose`; exceptions from the callbacks
// propagate. So the accept/refuse decisions are those of the Python loop.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace {

struct Walk {
    const unsigned char* data = nullptr;
    Py_ssize_t n = 0;
    PyObject* memo = nullptr;        // borrowed list
    PyObject* memo_index = nullptr;  // borrowed dict
    PyObject* take_entries = nullptr;
    PyObject* check_frames = nullptr;
    PyObject* unsupported = nullptr;  // exception class
    PyObject* too_many_loose = nullptr;  // exception class
    PyObject* released = nullptr;
    PyObject* action_key = nullptr;  // "action" (owned)
    Py_ssize_t max_stack = 0;
    PyObject* stack = nullptr;       // owned list
    std::vector<PyObject*> metastack;  // owned lists

    ~Walk() {
        Py_XDECREF(stack);
        for (PyObject* s : metastack) Py_DECREF(s);
        Py_XDECREF(action_key);
    }
    PyObject* fail(const char* why) {
        PyErr_SetString(unsupported, why);
        return nullptr;
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
        if (slot < 0 || slot >= PyList_GET_SIZE(memo)) return fail("memo index out of range");
        return PyList_GET_ITEM(memo, slot);
    }
    bool memoize_top(Py_ssize_t slot) {
        Py_ssize_t size = PyList_GET_SIZE(stack);
        if (size == 0) { fail("memoize on empty stack"); return false; }
        PyObject* top = PyList_GET_ITEM(stack, size - 1);
        if (PyDict_CheckExact(top) || PyList_CheckExact(top)) {
            PyObject* key = PyLong_FromVoidPtr(top);
            PyObject* value = PyLong_FromSsize_t(slot);
            int rc = (key && value) ? PyDict_SetItem(memo_index, key, value) : -1;
            Py_XDECREF(key);
            Py_XDECREF(value);
            if (rc) return false;
        }
        return PyList_Append(memo, top) == 0;
    }
    int is_entry(PyObject* obj) {
        if (!PyDict_CheckExact(obj)) return 0;
        return PyDict_Contains(obj, action_key);
    }
    bool call2(PyObject* fn, PyObject* a, PyObject* b) {
        PyObject* r = PyObject_CallFunctionObjArgs(fn, a, b, nullptr);
        Py_XDECREF(r);
        return r != nullptr;
    }
    bool need(Py_ssize_t pos, Py_ssize_t count) {
        if (pos + count > n) { fail("truncated"); return false; }
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

    PyObject* run();
};

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
            if (!memoize_top(PyList_GET_SIZE(memo))) return nullptr;
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
            int entry = PyList_GET_SIZE(items) ? is_entry(PyList_GET_ITEM(items, 0)) : 0;
            bool ok = entry >= 0;
            if (ok && entry) {
                ok = call2(take_entries, target, items);
            } else if (ok) {
                ok = call2(check_frames, target, items);
                if (ok) ok = PyList_SetSlice(target, PyList_GET_SIZE(target), PyList_GET_SIZE(target), items) == 0;
            }
            Py_DECREF(target);
            Py_DECREF(items);
            if (!ok) return nullptr;
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
            PyObject* one = PyList_New(1);
            bool ok = one != nullptr;
            if (ok) {
                Py_INCREF(value);
                PyList_SET_ITEM(one, 0, value);
                int entry = is_entry(value);
                ok = entry >= 0;
                if (ok && entry) {
                    ok = call2(take_entries, target, one);
                } else if (ok) {
                    ok = call2(check_frames, target, one) && PyList_Append(target, value) == 0;
                }
                Py_DECREF(one);
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
            if (slot != PyList_GET_SIZE(memo)) return fail("memo slots out of order");
            if (!memoize_top(slot)) return nullptr;
            break;
        }
        case 0x80:  // PROTO
            if (pos >= n) return fail("index out of range");
            if (data[pos] > 5) return fail("unknown protocol");
            pos += 1;
            break;
        case 0x2E: {  // STOP
            PyObject* result = Py_BuildValue("(On)", stack, (Py_ssize_t)metastack.size());
            return result;
        }
        default:
            return fail("unsupported opcode");
        }
    }
}

// walk(data, memo, memo_index, take_entries, check_frames, unsupported, too_many_loose, released, max_stack)
// -> (stack at STOP, metastack depth at STOP)
PyObject* walk(PyObject*, PyObject* args) {
    PyObject *data, *memo, *memo_index, *take_entries, *check_frames, *unsupported, *too_many_loose, *released;
    Py_ssize_t max_stack;
    if (!PyArg_ParseTuple(args, "OO!O!OOOOOn", &data, &PyList_Type, &memo, &PyDict_Type, &memo_index,
                          &take_entries, &check_frames, &unsupported, &too_many_loose, &released, &max_stack))
        return nullptr;
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)) return nullptr;
    PyObject* result;
    {
        Walk w;
        w.data = (const unsigned char*)view.buf;
        w.n = view.len;
        w.memo = memo;
        w.memo_index = memo_index;
        w.take_entries = take_entries;
        w.check_frames = check_frames;
        w.unsupported = unsupported;
        w.too_many_loose = too_many_loose;
        w.released = released;
        w.max_stack = max_stack;
        w.action_key = PyUnicode_InternFromString("action");
        result = w.action_key ? w.run() : nullptr;
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

PyMODINIT_FUNC PyInit_memlens_stream_walk(void) { return PyModule_Create(&module); }

/* The source's per-record loop for values a sink's row decoder takes, in C (see records.py).
 *
 * fill(msgs, start, row, out, cls, slots, at_end, max_records, max_bytes, nbytes) -> (next, nbytes, full):
 * for msgs[start:], while a message has no error and a bytes value that row(value) takes, append to `out`
 * an instance of `cls` (a SinkRecord subclass with slots) holding topic, partition, offset, key, the row,
 * the value's bytes, the message itself (in the headers slot: converted when read) and the timestamp, as
 * KafkaSource._poll_batch builds it, and discard (topic, partition) from `at_end`. Stops at the first
 * message it does not take (an error, an end-of-partition event, no value, a value the decoder refuses:
 * the caller handles it the Python way) or once `out` holds max_records or nbytes reaches max_bytes
 * (full). `slots` are the member descriptors of cls's nine slots, in SinkRecord's field order. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define NSLOTS 9
enum { S_TOPIC, S_PARTITION, S_OFFSET, S_KEY, S_VALUE, S_RAW, S_HEADERS, S_TS, S_SCHEMA };

static PyObject *n_error, *n_topic, *n_partition, *n_offset, *n_key, *n_value, *n_timestamp;

/* The messages' methods, looked up once per call on their type (a method descriptor called with the
 * message: no lookup and no bound method per call); NULL: looked up on each message. */
enum { M_ERROR, M_VALUE, M_TOPIC, M_PARTITION, M_OFFSET, M_KEY, M_TIMESTAMP, NMETHODS };
static PyObject **names[NMETHODS] = {&n_error, &n_value, &n_topic, &n_partition, &n_offset, &n_key, &n_timestamp};

static inline PyObject *call0(PyObject *m, PyTypeObject *type, PyObject *const *methods, int k) {
    if (Py_TYPE(m) == type && methods[k] != NULL) return PyObject_CallOneArg(methods[k], m);
    return PyObject_CallMethodNoArgs(m, *names[k]);
}

static PyObject *fill(PyObject *mod, PyObject *args) {
    PyObject *msgs, *row, *out, *slots, *at_end;
    PyTypeObject *cls;
    Py_ssize_t start, max_records, max_bytes, nbytes;
    (void)mod;
    if (!PyArg_ParseTuple(args, "O!nOO!O!O!O!nnn", &PyList_Type, &msgs, &start, &row, &PyList_Type, &out, &PyType_Type, &cls,
                          &PyTuple_Type, &slots, &PySet_Type, &at_end, &max_records, &max_bytes, &nbytes)) return NULL;
    if (PyTuple_GET_SIZE(slots) != NSLOTS) { PyErr_SetString(PyExc_ValueError, "nine slot descriptors"); return NULL; }
    Py_ssize_t offsets[NSLOTS];
    for (int k = 0; k < NSLOTS; k++) {
        PyObject *d = PyTuple_GET_ITEM(slots, k);
        if (Py_TYPE(d) != &PyMemberDescr_Type) { PyErr_SetString(PyExc_TypeError, "not a slot descriptor"); return NULL; }
        PyMemberDef *def = ((PyMemberDescrObject *)d)->d_member;
        if (def->type != T_OBJECT_EX || !PyType_IsSubtype(cls, PyDescr_TYPE(d))) { PyErr_SetString(PyExc_TypeError, "not a slot of the class"); return NULL; }
        offsets[k] = def->offset;
    }
    Py_ssize_t n = PyList_GET_SIZE(msgs), i = start;
    int full = 0;
    PyTypeObject *type = n > start ? Py_TYPE(PyList_GET_ITEM(msgs, start)) : NULL;
    PyObject *methods[NMETHODS] = {NULL};
    for (int k = 0; type != NULL && k < NMETHODS; k++) {
        PyObject *d = _PyType_Lookup(type, *names[k]);  /* borrowed: the type holds it */
        methods[k] = d != NULL && Py_TYPE(d) == &PyMethodDescr_Type ? d : NULL;
    }
    for (; i < n; i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i);
        PyObject *err = call0(m, type, methods, M_ERROR);
        if (!err) return NULL;
        int has_err = err != Py_None;
        Py_DECREF(err);
        if (has_err) break;
        PyObject *raw = call0(m, type, methods, M_VALUE);
        if (!raw) return NULL;
        if (!PyBytes_CheckExact(raw)) { Py_DECREF(raw); break; }
        PyObject *value = PyObject_CallOneArg(row, raw);
        if (!value) {
            if (PyErr_ExceptionMatches(PyExc_ValueError) || PyErr_ExceptionMatches(PyExc_TypeError)) {
                PyErr_Clear();  /* the caller decodes it as without the row decoder */
                Py_DECREF(raw);
                break;
            }
            Py_DECREF(raw);
            return NULL;
        }
        PyObject *vals[NSLOTS] = {NULL};
        vals[S_VALUE] = value;
        vals[S_RAW] = raw;
        vals[S_TOPIC] = call0(m, type, methods, M_TOPIC);
        vals[S_PARTITION] = call0(m, type, methods, M_PARTITION);
        vals[S_OFFSET] = call0(m, type, methods, M_OFFSET);
        vals[S_KEY] = call0(m, type, methods, M_KEY);
        PyObject *ts = call0(m, type, methods, M_TIMESTAMP);
        if (ts && PyTuple_Check(ts) && PyTuple_GET_SIZE(ts) == 2) {
            vals[S_TS] = Py_NewRef(PyTuple_GET_ITEM(ts, 1));
        }
        Py_XDECREF(ts);
        vals[S_HEADERS] = Py_NewRef(m);
        vals[S_SCHEMA] = Py_NewRef(Py_None);
        PyObject *rec = NULL;
        int ok = 1;
        for (int k = 0; k < NSLOTS; k++) ok &= vals[k] != NULL;
        if (ok && PySet_GET_SIZE(at_end) > 0) {
            PyObject *tp = PyTuple_Pack(2, vals[S_TOPIC], vals[S_PARTITION]);
            ok = tp != NULL && PySet_Discard(at_end, tp) >= 0;
            Py_XDECREF(tp);
        }
        if (ok) rec = cls->tp_alloc(cls, 0);
        if (!rec) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "a message without its coordinates");
            for (int k = 0; k < NSLOTS; k++) Py_XDECREF(vals[k]);
            return NULL;
        }
        for (int k = 0; k < NSLOTS; k++) *(PyObject **)((char *)rec + offsets[k]) = vals[k];  /* references moved */
        int appended = PyList_Append(out, rec);
        Py_DECREF(rec);
        if (appended < 0) return NULL;
        nbytes += PyBytes_GET_SIZE(raw);
        if (PyList_GET_SIZE(out) >= max_records || nbytes >= max_bytes) { full = 1; i++; break; }
    }
    return Py_BuildValue("(nnO)", i, nbytes, full ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"fill", fill, METH_VARARGS, "fill(msgs, start, row, out, cls, slots, at_end, max_records, max_bytes, nbytes) -> (next, nbytes, full)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_records", NULL, -1, methods};

PyMODINIT_FUNC PyInit__records(void) {
    n_error = PyUnicode_InternFromString("error");
    n_topic = PyUnicode_InternFromString("topic");
    n_partition = PyUnicode_InternFromString("partition");
    n_offset = PyUnicode_InternFromString("offset");
    n_key = PyUnicode_InternFromString("key");
    n_value = PyUnicode_InternFromString("value");
    n_timestamp = PyUnicode_InternFromString("timestamp");
    if (!n_error || !n_topic || !n_partition || !n_offset || !n_key || !n_value || !n_timestamp) return NULL;
    return PyModule_Create(&module);
}

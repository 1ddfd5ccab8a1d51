/* A batch's records as a batching sink handles them, in C: grouped per partition, and JSON Lines bodies.
 *
 * group(records, topic, partition) -> dict | None: the records of the list `records` per partition
 * number ({partition: [records in order]}), reading the two slots (member descriptors: SinkRecord.topic
 * and .partition) of each; None when the records do not all have the first one's topic (the caller
 * groups by (topic, partition) then) or a slot is unset. Why C: the Python loop is a dict lookup and
 * two attribute reads per record, ~3 ms per 50,000 records, on the cycle's path in every write.
 *
 * join(slices, cls, raw) -> bytes | None: the `raw` slot (a member descriptor: SinkRecord.raw_value) of
 * every record of every list in `slices`, each followed by b"\n", as one bytes object - exactly
 * b"".join(value + b"\n" for each record). None, having written nothing, when a record is not exactly of
 * class `cls` (LazyJsonRecord: its raw bytes are the topic's JSON object or array), its raw slot is not
 * bytes, or a value holds a line break: the caller then takes the Python path, which re-encodes such a
 * value on one line or refuses the record naming it.
 *
 * Why C: the Python path reads every record's slot, checks the records' classes, joins the values once to
 * look for a line break and again with the separators - five passes over 50,000 records and two copies
 * of 12 MB, ~10 ms of CPU per cycle under the GIL, beside the request threads of the S3 sink's prepare
 * (its creates' answers wait for the GIL). Here the records are read once under the GIL and the copy
 * and the line-break search run with it released: the request threads go on meanwhile. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

/* The offset of the slot `descr` describes in instances of `cls`; -1 with TypeError when it is not one of its slots. */
static Py_ssize_t slot_offset(PyObject *descr, PyTypeObject *cls) {
    if (Py_TYPE(descr) != &PyMemberDescr_Type) { PyErr_SetString(PyExc_TypeError, "not a slot descriptor"); return -1; }
    PyMemberDef *def = ((PyMemberDescrObject *)descr)->d_member;
    if (def->type != T_OBJECT_EX || !PyType_IsSubtype(cls, PyDescr_TYPE(descr))) {
        PyErr_SetString(PyExc_TypeError, "not a slot of the class");
        return -1;
    }
    return def->offset;
}

#define SLOT(r, offset) (*(PyObject **)((char *)(r) + (offset)))

static PyObject *group(PyObject *mod, PyObject *args) {
    PyObject *records, *topic_d, *partition_d;
    (void)mod;
    if (!PyArg_ParseTuple(args, "O!OO", &PyList_Type, &records, &topic_d, &partition_d)) return NULL;
    if (Py_TYPE(topic_d) != &PyMemberDescr_Type) { PyErr_SetString(PyExc_TypeError, "topic: not a slot descriptor"); return NULL; }
    PyTypeObject *base = PyDescr_TYPE(topic_d);
    Py_ssize_t t_off = slot_offset(topic_d, base), p_off = slot_offset(partition_d, base);
    if (t_off < 0 || p_off < 0) return NULL;
    PyObject *out = PyDict_New();
    if (out == NULL) return NULL;
    PyObject *topic = NULL, *last_p = NULL, *last_g = NULL;  /* borrowed: the records and `out` hold them */
    /* The size read on every step (an append may run the garbage collector): never past the list's end. */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(records); i++) {
        PyObject *r = PyList_GET_ITEM(records, i);
        if (!PyObject_TypeCheck(r, base)) goto python;
        PyObject *t = SLOT(r, t_off), *p = SLOT(r, p_off);
        if (t == NULL || p == NULL) goto python;
        if (topic == NULL) topic = t;
        else if (t != topic) {
            int same = PyObject_RichCompareBool(t, topic, Py_EQ);
            if (same < 0) goto error;
            if (!same) goto python;
        }
        PyObject *g = last_g;
        if (p != last_p) {  /* runs of one partition are the usual slice: one lookup per run */
            g = PyDict_GetItemWithError(out, p);
            if (g == NULL) {
                if (PyErr_Occurred()) goto error;
                g = PyList_New(0);
                if (g == NULL) goto error;
                int bad = PyDict_SetItem(out, p, g);
                Py_DECREF(g);
                if (bad < 0) goto error;
            }
            last_p = p;
            last_g = g;
        }
        if (PyList_Append(g, r) < 0) goto error;
    }
    return out;
python:
    Py_DECREF(out);
    Py_RETURN_NONE;
error:
    Py_DECREF(out);
    return NULL;
}

static PyObject *join(PyObject *mod, PyObject *args) {
    PyObject *slices, *cls, *raw;
    (void)mod;
    if (!PyArg_ParseTuple(args, "O!O!O", &PyList_Type, &slices, &PyType_Type, &cls, &raw)) return NULL;
    Py_ssize_t offset = slot_offset(raw, (PyTypeObject *)cls), n = 0, nslices = PyList_GET_SIZE(slices);
    if (offset < 0) return NULL;
    for (Py_ssize_t s = 0; s < nslices; s++) {
        PyObject *sl = PyList_GET_ITEM(slices, s);
        if (!PyList_Check(sl)) { PyErr_SetString(PyExc_TypeError, "slices: a list of lists"); return NULL; }
        n += PyList_GET_SIZE(sl);
    }
    /* The values, held (a reference each) while the GIL is released: nothing can free them meanwhile. */
    PyObject **values = PyMem_Malloc(sizeof(PyObject *) * (size_t)(n ? n : 1));
    if (values == NULL) return PyErr_NoMemory();
    Py_ssize_t k = 0, total = 0;
    PyObject *result = NULL;
    for (Py_ssize_t s = 0; s < nslices; s++) {
        PyObject *sl = PyList_GET_ITEM(slices, s);
        Py_ssize_t m = PyList_GET_SIZE(sl);
        for (Py_ssize_t i = 0; i < m; i++) {
            PyObject *r = PyList_GET_ITEM(sl, i);
            if ((PyObject *)Py_TYPE(r) != cls) goto python;
            PyObject *v = SLOT(r, offset);
            if (v == NULL || !PyBytes_CheckExact(v)) goto python;
            Py_INCREF(v);
            values[k++] = v;
            total += PyBytes_GET_SIZE(v) + 1;
        }
    }
    result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL) goto done;
    int broken = 0;
    char *out = PyBytes_AS_STRING(result);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < k; i++) {
        const char *p = PyBytes_AS_STRING(values[i]);
        size_t len = (size_t)PyBytes_GET_SIZE(values[i]);
        if (memchr(p, '\n', len) != NULL) { broken = 1; break; }
        memcpy(out, p, len);
        out[len] = '\n';
        out += len + 1;
    }
    Py_END_ALLOW_THREADS
    if (broken) Py_CLEAR(result);
    else goto done;
python:
    result = Py_NewRef(Py_None);
done:
    for (Py_ssize_t i = 0; i < k; i++) Py_DECREF(values[i]);
    PyMem_Free(values);
    return result;
}

static PyMethodDef methods[] = {
    {"group", group, METH_VARARGS, "group(records, topic, partition) -> dict | None: the records per partition (see the module's source)."},
    {"join", join, METH_VARARGS, "join(slices, cls, raw) -> bytes | None: the JSON Lines body (see the module's source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_batches", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__batches(void) { return PyModule_Create(&module); }

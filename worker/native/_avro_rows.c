/* Avro values decoded into native row tuples in C: the compiled form of avro_rows' generated Python decoder
 * (see __init__.py). Every refusal is a ValueError where the Python decoder raises one. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>
#include <stdint.h>
#include <string.h>

enum { K_LONG = 0, K_BOOLEAN = 1, K_DOUBLE = 2, K_STRING = 3, K_BYTES = 4, K_DECIMAL = 5, K_MILLIS = 6, K_MICROS = 7 };

/* The instants a datetime holds, in microseconds from the epoch: 0001-01-01 .. 9999-12-31T23:59:59.999999. */
#define MIN_US (-62135596800000000LL)
#define MAX_US (253402300799999999LL)

typedef struct {
    int kind;
    int null_at;          /* -1: not a union; else the null branch's index (0 or 1) */
    PyObject *create;     /* decimal: the context's create_decimal */
    PyObject *neg_scale;  /* decimal: -scale, an int */
    PyObject *ctx;        /* decimal: the context of the schema's precision */
} Field;

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    unsigned char header[5];
    Field *fields;
} Program;

static PyObject *scaleb_name;

static inline int bad(const char *why) { PyErr_SetString(PyExc_ValueError, why); return -1; }

/* A zigzag long at *p (up to 10 bytes; the 10th at most 1, else beyond 64 bits). */
static inline int read_long(const unsigned char *b, Py_ssize_t len, Py_ssize_t *p, int64_t *out) {
    uint64_t n = 0;
    Py_ssize_t i = *p;
    for (int shift = 0; shift < 70; shift += 7) {
        if (i >= len) return bad("bytes too few");
        unsigned char c = b[i++];
        if (shift == 63) {
            if (c & 0x80) return bad("a long longer than 10 bytes");
            if (c > 1) return bad("a long beyond 64 bits");
        }
        n |= (uint64_t)(c & 0x7F) << shift;
        if (!(c & 0x80)) {
            *p = i;
            *out = (int64_t)((n >> 1) ^ (0 - (n & 1)));
            return 0;
        }
    }
    return bad("a long longer than 10 bytes");  /* not reached */
}

/* Where a string or bytes value starts and how long it is. */
static inline int read_sized(const unsigned char *b, Py_ssize_t len, Py_ssize_t *p, Py_ssize_t *start, Py_ssize_t *size) {
    int64_t n;
    if (read_long(b, len, p, &n)) return -1;
    if (n < 0) return bad("negative length");
    if (n > len - *p) return bad("bytes left over, or too few");
    *start = *p;
    *size = (Py_ssize_t)n;
    *p += (Py_ssize_t)n;
    return 0;
}

static PyObject *instant(int64_t us) {
    if (us < MIN_US || us > MAX_US) { bad("date value out of range"); return NULL; }
    int64_t secs = us / 1000000, frac = us % 1000000;
    if (frac < 0) { frac += 1000000; secs -= 1; }
    int64_t days = secs / 86400, sod = secs % 86400;
    if (sod < 0) { sod += 86400; days -= 1; }
    /* civil_from_days (H. Hinnant) */
    days += 719468;
    int64_t era = (days >= 0 ? days : days - 146096) / 146097;
    int64_t doe = days - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t y = yoe + era * 400;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    int d = (int)(doy - (153 * mp + 2) / 5 + 1);
    int m = (int)(mp < 10 ? mp + 3 : mp - 9);
    if (m <= 2) y += 1;
    return PyDateTimeAPI->DateTime_FromDateAndTime((int)y, m, d, (int)(sod / 3600), (int)(sod / 60 % 60), (int)(sod % 60),
                                                   (int)frac, PyDateTime_TimeZone_UTC, PyDateTimeAPI->DateTimeType);
}

static inline int ascii_only(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        if (w & 0x8080808080808080ULL) return 0;
    }
    for (; i < n; i++) if (s[i] & 0x80) return 0;
    return 1;
}

static PyObject *value(const Field *f, const unsigned char *b, Py_ssize_t len, Py_ssize_t *p) {
    int64_t n;
    Py_ssize_t s, size;
    switch (f->kind) {
    case K_LONG:
        if (read_long(b, len, p, &n)) return NULL;
        return PyLong_FromLongLong(n);
    case K_BOOLEAN:
        if (*p >= len) { bad("bytes too few"); return NULL; }
        if (b[*p] > 1) { bad("boolean"); return NULL; }
        return PyBool_FromLong(b[(*p)++]);
    case K_DOUBLE: {
        if (len - *p < 8) { bad("bytes too few"); return NULL; }
        double x = PyFloat_Unpack8((const char *)b + *p, 1);
        if (x == -1.0 && PyErr_Occurred()) return NULL;
        *p += 8;
        return PyFloat_FromDouble(x);
    }
    case K_STRING:
        if (read_sized(b, len, p, &s, &size)) return NULL;
        if (!ascii_only(b + s, size)) {  /* checked only when not ASCII, as the Python decoder does */
            PyObject *u = PyUnicode_DecodeUTF8((const char *)b + s, size, "strict");
            if (u == NULL) return NULL;
            Py_DECREF(u);
        }
        return PyBytes_FromStringAndSize((const char *)b + s, size);
    case K_BYTES:
        if (read_sized(b, len, p, &s, &size)) return NULL;
        return PyBytes_FromStringAndSize((const char *)b + s, size);
    case K_DECIMAL: {
        if (read_sized(b, len, p, &s, &size)) return NULL;
        PyObject *unscaled = _PyLong_FromByteArray(b + s, (size_t)size, 0, 1);
        if (unscaled == NULL) return NULL;
        PyObject *d = PyObject_CallOneArg(f->create, unscaled);
        Py_DECREF(unscaled);
        if (d == NULL) return NULL;
        PyObject *args[3] = {d, f->neg_scale, f->ctx};
        PyObject *r = PyObject_VectorcallMethod(scaleb_name, args, 3, NULL);
        Py_DECREF(d);
        return r;
    }
    case K_MILLIS:
        if (read_long(b, len, p, &n)) return NULL;
        if (n < MIN_US / 1000 || n > MAX_US / 1000) { bad("date value out of range"); return NULL; }
        return instant(n * 1000);
    case K_MICROS:
        if (read_long(b, len, p, &n)) return NULL;
        return instant(n);
    }
    bad("unknown kind");
    return NULL;
}

/* The row of one value's bytes (header included, not checked), or NULL with ValueError set. */
static PyObject *decode_row(const Program *prog, const unsigned char *b, Py_ssize_t len) {
    PyObject *row = PyTuple_New(prog->n);
    if (row == NULL) return NULL;
    Py_ssize_t p = 5;
    for (Py_ssize_t i = 0; i < prog->n; i++) {
        const Field *f = &prog->fields[i];
        PyObject *v;
        if (f->null_at >= 0) {
            if (p >= len) { bad("bytes too few"); goto fail; }
            unsigned char c = b[p++];
            if (c == 2 * f->null_at) { v = Py_NewRef(Py_None); PyTuple_SET_ITEM(row, i, v); continue; }
            if (c != 2 * (1 - f->null_at)) { bad("union branch"); goto fail; }
        }
        v = value(f, b, len, &p);
        if (v == NULL) goto fail;
        PyTuple_SET_ITEM(row, i, v);
    }
    if (p != len) { bad("bytes left over, or too few"); goto fail; }
    return row;
fail:
    Py_DECREF(row);
    if (!PyErr_ExceptionMatches(PyExc_ValueError)) {  /* decimal's Overflow, MemoryError: not this row */
        PyObject *type, *val, *tb;
        PyErr_Fetch(&type, &val, &tb);
        PyErr_NormalizeException(&type, &val, &tb);
        PyErr_Format(PyExc_ValueError, "%s: %S", ((PyTypeObject *)type)->tp_name, val ? val : Py_None);
        Py_XDECREF(type); Py_XDECREF(val); Py_XDECREF(tb);
    }
    return NULL;
}

static PyObject *Program_call(PyObject *self, PyObject *args, PyObject *kw) {
    PyObject *raw;
    if (kw != NULL && PyDict_GET_SIZE(kw)) { PyErr_SetString(PyExc_TypeError, "no keyword arguments"); return NULL; }
    if (!PyArg_UnpackTuple(args, "decode", 1, 1, &raw)) return NULL;
    if (!PyBytes_Check(raw)) { PyErr_SetString(PyExc_TypeError, "bytes expected"); return NULL; }
    return decode_row((Program *)self, (const unsigned char *)PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw));
}

/* many(values, start) -> (rows, stop): the rows of values[start:stop], stop the index of the first value that
 * is not bytes, has another 5-byte header than the program's, or is refused (or len(values)). */
static PyObject *Program_many(PyObject *self, PyObject *args) {
    PyObject *values;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "O!n", &PyList_Type, &values, &start)) return NULL;
    Program *prog = (Program *)self;
    PyObject *rows = PyList_New(0);
    if (rows == NULL) return NULL;
    Py_ssize_t i = start < 0 ? 0 : start;
    for (; i < PyList_GET_SIZE(values); i++) {
        PyObject *raw = PyList_GET_ITEM(values, i);
        if (!PyBytes_Check(raw)) break;
        const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(raw);
        Py_ssize_t len = PyBytes_GET_SIZE(raw);
        if (len < 5 || memcmp(b, prog->header, 5) != 0) break;
        PyObject *row = decode_row(prog, b, len);
        if (row == NULL) { PyErr_Clear(); break; }
        int rc = PyList_Append(rows, row);
        Py_DECREF(row);
        if (rc) { Py_DECREF(rows); return NULL; }
    }
    return Py_BuildValue("(Nn)", rows, i);
}

static void Program_dealloc(PyObject *self) {
    Program *prog = (Program *)self;
    if (prog->fields) {
        for (Py_ssize_t i = 0; i < prog->n; i++) {
            Py_XDECREF(prog->fields[i].create); Py_XDECREF(prog->fields[i].neg_scale); Py_XDECREF(prog->fields[i].ctx);
        }
        PyMem_Free(prog->fields);
    }
    Py_TYPE(self)->tp_free(self);
}

/* Program(header, fields): fields a sequence of (kind, null_at, context or None, -scale or None). */
static PyObject *Program_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    const char *header;
    Py_ssize_t header_len;
    PyObject *fields;
    if (!PyArg_ParseTuple(args, "y#O", &header, &header_len, &fields)) return NULL;
    if (header_len != 5) { PyErr_SetString(PyExc_ValueError, "a header is 5 bytes"); return NULL; }
    PyObject *seq = PySequence_Fast(fields, "fields: a sequence");
    if (seq == NULL) return NULL;
    Program *prog = (Program *)type->tp_alloc(type, 0);
    if (prog == NULL) { Py_DECREF(seq); return NULL; }
    memcpy(prog->header, header, 5);
    prog->n = PySequence_Fast_GET_SIZE(seq);
    prog->fields = PyMem_Calloc(prog->n ? prog->n : 1, sizeof(Field));
    if (prog->fields == NULL) { prog->n = 0; Py_DECREF(seq); Py_DECREF(prog); return PyErr_NoMemory(); }
    for (Py_ssize_t i = 0; i < prog->n; i++) {
        Field *f = &prog->fields[i];
        PyObject *ctx, *neg_scale;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "iiOO", &f->kind, &f->null_at, &ctx, &neg_scale)) goto fail;
        if (f->kind < K_LONG || f->kind > K_MICROS || f->null_at < -1 || f->null_at > 1) {
            PyErr_SetString(PyExc_ValueError, "not a field of a program"); goto fail;
        }
        if (f->kind == K_DECIMAL) {
            f->create = PyObject_GetAttrString(ctx, "create_decimal");
            if (f->create == NULL) goto fail;
            f->ctx = Py_NewRef(ctx);
            f->neg_scale = Py_NewRef(neg_scale);
        }
    }
    Py_DECREF(seq);
    return (PyObject *)prog;
fail:
    Py_DECREF(seq);
    Py_DECREF(prog);
    return NULL;
}

static PyMethodDef Program_methods[] = {
    {"many", Program_many, METH_VARARGS, "many(values, start) -> (rows, stop)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ProgramType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "eosink.worker.native._avro_rows.Program",
    .tp_basicsize = sizeof(Program),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The row decoder of one writer's schema for one target: Program(header, fields)(raw) -> row.",
    .tp_new = Program_new,
    .tp_dealloc = Program_dealloc,
    .tp_call = Program_call,
    .tp_methods = Program_methods,
};

/* Rows(by_header, registry, build): the per-record decoder of AvroRows, the writer's schema picked by the value's
 * 5-byte header (the last one remembered) from by_header, a dict of header -> (decode, writer) that build(raw)
 * fills (or raises); registry.schema is set to the writer before decoding, as the Python closure does. */
typedef struct {
    PyObject_HEAD
    PyObject *by_header, *registry, *build;
    unsigned char last[5];
    PyObject *last_decode, *last_writer;  /* NULL until a value of 5 bytes or more was looked up */
} Rows;

static PyObject *schema_name;

static PyObject *Rows_call(PyObject *self, PyObject *args, PyObject *kw) {
    Rows *r = (Rows *)self;
    PyObject *raw;
    if (kw != NULL && PyDict_GET_SIZE(kw)) { PyErr_SetString(PyExc_TypeError, "no keyword arguments"); return NULL; }
    if (!PyArg_UnpackTuple(args, "decode", 1, 1, &raw)) return NULL;
    if (!PyBytes_Check(raw)) { PyErr_SetString(PyExc_TypeError, "bytes expected"); return NULL; }
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(raw);
    Py_ssize_t len = PyBytes_GET_SIZE(raw);
    PyObject *decode, *writer;
    if (r->last_decode != NULL && len >= 5 && memcmp(b, r->last, 5) == 0) {
        decode = Py_NewRef(r->last_decode);
        writer = Py_NewRef(r->last_writer);
    } else {
        PyObject *key = PyBytes_FromStringAndSize((const char *)b, len < 5 ? len : 5);
        if (key == NULL) return NULL;
        PyObject *entry = PyDict_GetItemWithError(r->by_header, key);  /* borrowed */
        Py_DECREF(key);
        if (entry != NULL) Py_INCREF(entry);
        else if (PyErr_Occurred() || (entry = PyObject_CallOneArg(r->build, raw)) == NULL) return NULL;
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2) {
            Py_DECREF(entry);
            PyErr_SetString(PyExc_TypeError, "an entry is (decode, writer)");
            return NULL;
        }
        decode = Py_NewRef(PyTuple_GET_ITEM(entry, 0));
        writer = Py_NewRef(PyTuple_GET_ITEM(entry, 1));
        Py_DECREF(entry);
        if (len >= 5) {
            memcpy(r->last, b, 5);
            Py_XSETREF(r->last_decode, Py_NewRef(decode));
            Py_XSETREF(r->last_writer, Py_NewRef(writer));
        }
    }
    PyObject *row = NULL;
    if (PyObject_SetAttr(r->registry, schema_name, writer) == 0)
        row = Py_IS_TYPE(decode, &ProgramType) ? decode_row((Program *)decode, b, len) : PyObject_CallOneArg(decode, raw);
    Py_DECREF(decode);
    Py_DECREF(writer);
    return row;
}

static PyObject *Rows_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *by_header, *registry, *build;
    (void)kw;
    if (!PyArg_ParseTuple(args, "O!OO", &PyDict_Type, &by_header, &registry, &build)) return NULL;
    Rows *r = (Rows *)type->tp_alloc(type, 0);
    if (r == NULL) return NULL;
    r->by_header = Py_NewRef(by_header);
    r->registry = Py_NewRef(registry);
    r->build = Py_NewRef(build);
    return (PyObject *)r;
}

static int Rows_traverse(PyObject *self, visitproc visit, void *arg) {
    Rows *r = (Rows *)self;
    Py_VISIT(r->by_header); Py_VISIT(r->registry); Py_VISIT(r->build); Py_VISIT(r->last_decode); Py_VISIT(r->last_writer);
    return 0;
}

static int Rows_clear(PyObject *self) {
    Rows *r = (Rows *)self;
    Py_CLEAR(r->by_header); Py_CLEAR(r->registry); Py_CLEAR(r->build); Py_CLEAR(r->last_decode); Py_CLEAR(r->last_writer);
    return 0;
}

static void Rows_dealloc(PyObject *self) {
    PyObject_GC_UnTrack(self);
    Rows_clear(self);
    Py_TYPE(self)->tp_free(self);
}

static PyTypeObject RowsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "eosink.worker.native._avro_rows.Rows",
    .tp_basicsize = sizeof(Rows),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Rows(by_header, registry, build)(raw) -> row: the decoder of each value's writer's schema.",
    .tp_new = Rows_new,
    .tp_dealloc = Rows_dealloc,
    .tp_traverse = Rows_traverse,
    .tp_clear = Rows_clear,
    .tp_call = Rows_call,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_avro_rows", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__avro_rows(void) {
    PyDateTime_IMPORT;
    if (PyDateTimeAPI == NULL) return NULL;
    scaleb_name = PyUnicode_InternFromString("scaleb");
    schema_name = PyUnicode_InternFromString("schema");
    if (scaleb_name == NULL || schema_name == NULL || PyType_Ready(&ProgramType) < 0 || PyType_Ready(&RowsType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Program", (PyObject *)&ProgramType) < 0 || PyModule_AddObjectRef(m, "Rows", (PyObject *)&RowsType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

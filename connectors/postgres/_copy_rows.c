/* JSON objects of a fixed field set encoded straight into binary COPY rows, in C (see copy_native.py).
 *
 * Encoder(kinds, names)(raw) -> the row's value fields, each as binary COPY sends it (int32 length, or -1
 * for NULL, then the bytes), in column order: exactly what psycopg's binary dumpers write for the values
 * of the msgspec row type (copy.row_type) decoding `raw`. Anything outside the plain cases - a missing,
 * unknown or repeated key, an escaped key, another JSON type, an int beyond int64, a float that is not
 * finite, invalid UTF-8, a lone surrogate, a NUL, malformed JSON - raises ValueError: the caller decodes the
 * value as it would without this encoder (and the sink writes it the Python way, or refuses it there).
 *
 * join(rows, recs, start, nfields, partition_width, ordinal) -> (bytes, count): the binary COPY tuples of
 * rows[start:] (each a field count, the encoded value fields, then the record's Kafka coordinates - topic,
 * partition as int4 or int8, offset - when partition_width is 4 or 8, then offset and ordinal + i when
 * ordinal >= 0), stopping at the first row that is not bytes. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <structmember.h>

#include "../common/_json_scan.h"

enum { K_INT8 = 0, K_BOOL = 1, K_FLOAT8 = 2, K_TEXT = 3 };

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    int *kinds;
    char **names;
    Py_ssize_t *name_lens;
    /* Scratch: the decoded fields (each at its offset), grown as needed. */
    unsigned char *buf;
    Py_ssize_t cap;
    Py_ssize_t *starts;  /* per column: offset into buf, or -1 NULL, or -2 not seen */
    Py_ssize_t *lens;
} Encoder;

static inline int refuse(const char *why) { PyErr_SetString(PyExc_ValueError, why); return -1; }

static inline void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16); p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
}
static inline void put64(unsigned char *p, uint64_t v) { put32(p, (uint32_t)(v >> 32)); put32(p + 4, (uint32_t)v); }

/* Bytes a JSON string holds as they are (printable ASCII but the quote and the backslash), set at import. */
static unsigned char plain[256];

/* A JSON string whose opening quote is at s[*p]: its UTF-8 bytes written at out (room: its raw length). */
static int read_string(const unsigned char *s, Py_ssize_t len, Py_ssize_t *p, unsigned char *out, Py_ssize_t *out_len) {
    Py_ssize_t i = *p + 1, o = 0;
    for (;;) {
        while (i < len && plain[s[i]]) out[o++] = s[i++];  /* the common run, one test a byte */
        if (i >= len) return refuse("an unterminated string");
        unsigned char c = s[i];
        if (c == '"') break;
        if (c < 0x20) return refuse("a control character in a string");
        if (c < 0x80 && c != '\\') { out[o++] = c; i++; continue; }
        if (c >= 0x80) {
            int n = utf8_seq(s, i, len);
            if (!n) return refuse("invalid UTF-8");
            memcpy(out + o, s + i, (size_t)n);
            o += n; i += n;
            continue;
        }
        if (i + 1 >= len) return refuse("an unterminated string");
        unsigned char e = s[i + 1];
        i += 2;
        switch (e) {
        case '"': out[o++] = '"'; break;
        case '\\': out[o++] = '\\'; break;
        case '/': out[o++] = '/'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'n': out[o++] = '\n'; break;
        case 'r': out[o++] = '\r'; break;
        case 't': out[o++] = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (hex4(s, i, len, &cp)) return refuse("a bad \\u escape");
            i += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (i + 1 >= len || s[i] != '\\' || s[i + 1] != 'u') return refuse("a lone surrogate");
                if (hex4(s, i + 2, len, &lo)) return refuse("a bad \\u escape");
                if (lo < 0xDC00 || lo > 0xDFFF) return refuse("a lone surrogate");
                i += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return refuse("a lone surrogate");
            }
            if (cp == 0) return refuse("a NUL in a string (PostgreSQL text cannot hold it)");
            o = put_cp(out + o, cp) - out;
            break;
        }
        default: return refuse("a bad escape");
        }
    }
    *p = i + 1;
    *out_len = o;
    return 0;
}

/* A JSON number at s[*p]: sets *is_int and *iv (an integer within int64) or *dv (any other, finite). */
static int read_number(const unsigned char *s, Py_ssize_t len, Py_ssize_t *p, int *is_int, int64_t *iv, double *dv) {
    Py_ssize_t i = *p, start = *p;
    int neg = 0;
    if (i < len && s[i] == '-') { neg = 1; i++; }
    if (i >= len || s[i] < '0' || s[i] > '9') return refuse("not a number");
    Py_ssize_t digits = i;
    if (s[i] == '0') i++;
    else while (i < len && s[i] >= '0' && s[i] <= '9') i++;
    Py_ssize_t int_end = i;
    int frac = 0;
    if (i < len && s[i] == '.') {
        i++;
        if (i >= len || s[i] < '0' || s[i] > '9') return refuse("a malformed number");
        while (i < len && s[i] >= '0' && s[i] <= '9') i++;
        frac = 1;
    }
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < len && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= len || s[i] < '0' || s[i] > '9') return refuse("a malformed number");
        while (i < len && s[i] >= '0' && s[i] <= '9') i++;
        frac = 1;
    }
    if (i < len && s[i] >= '0' && s[i] <= '9') return refuse("a number with a leading zero");
    *p = i;
    if (!frac) {
        if (int_end - digits > 19) return refuse("an int beyond int64");
        uint64_t u = 0;
        for (Py_ssize_t k = digits; k < int_end; k++) u = u * 10 + (uint64_t)(s[k] - '0');
        if (neg ? u > (uint64_t)INT64_MAX + 1 : u > (uint64_t)INT64_MAX) return refuse("an int beyond int64");
        *is_int = 1;
        *iv = neg ? (int64_t)(0 - u) : (int64_t)u;
        return 0;
    }
    char tmp[64];
    Py_ssize_t n = i - start;
    if (n >= (Py_ssize_t)sizeof(tmp)) return refuse("a float too long to parse here");
    memcpy(tmp, s + start, (size_t)n);
    tmp[n] = 0;
    char *end;
    double d = PyOS_string_to_double(tmp, &end, NULL);
    if (d == -1.0 && PyErr_Occurred()) { PyErr_Clear(); return refuse("a malformed float"); }
    if (end != tmp + n || !isfinite(d)) return refuse("a float that is not finite");
    *is_int = 0;
    *dv = d;
    return 0;
}

static inline int literal(const unsigned char *s, Py_ssize_t len, Py_ssize_t *p, const char *word, Py_ssize_t n) {
    if (*p + n > len || memcmp(s + *p, word, (size_t)n) != 0) return 0;
    *p += n;
    return 1;
}

/* One value for column c at s[*p], its encoded bytes written at buf + at (room: raw length + 8). */
static int read_value(Encoder *self, Py_ssize_t c, const unsigned char *s, Py_ssize_t len, Py_ssize_t *p, Py_ssize_t at) {
    unsigned char *out = self->buf + at;
    int kind = self->kinds[c];
    if (literal(s, len, p, "null", 4)) { self->starts[c] = -1; return 0; }
    self->starts[c] = at;
    switch (kind) {
    case K_TEXT:
        if (*p >= len || s[*p] != '"') return refuse("not a string");
        return read_string(s, len, p, out, &self->lens[c]);
    case K_BOOL:
        if (literal(s, len, p, "true", 4)) out[0] = 1;
        else if (literal(s, len, p, "false", 5)) out[0] = 0;
        else return refuse("not a bool");
        self->lens[c] = 1;
        return 0;
    default: {
        int is_int;
        int64_t iv;
        double dv;
        if (*p >= len || (s[*p] != '-' && (s[*p] < '0' || s[*p] > '9'))) return refuse("not a number");
        if (read_number(s, len, p, &is_int, &iv, &dv)) return -1;
        if (kind == K_INT8) {
            if (!is_int) return refuse("not an int");
            put64(out, (uint64_t)iv);
        } else {
            double d = is_int ? (double)iv : dv;
            uint64_t bits;
            memcpy(&bits, &d, 8);
            put64(out, bits);
        }
        self->lens[c] = 8;
        return 0;
    }
    }
}

static int grow(Encoder *self, Py_ssize_t need) {
    if (need <= self->cap) return 0;
    Py_ssize_t cap = need * 2 + 256;
    unsigned char *b = PyMem_Realloc(self->buf, (size_t)cap);
    if (!b) { PyErr_NoMemory(); return -1; }
    self->buf = b;
    self->cap = cap;
    return 0;
}

static PyObject *Encoder_call(Encoder *self, PyObject *args, PyObject *kw) {
    PyObject *raw;
    if (kw || PyTuple_GET_SIZE(args) != 1) { PyErr_SetString(PyExc_TypeError, "one argument: the value's bytes"); return NULL; }
    raw = PyTuple_GET_ITEM(args, 0);
    if (!PyBytes_Check(raw)) { PyErr_SetString(PyExc_TypeError, "the value is not bytes"); return NULL; }
    const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(raw);
    Py_ssize_t len = PyBytes_GET_SIZE(raw), n = self->n;
    if (grow(self, len + 8 * n + 16)) return NULL;
    for (Py_ssize_t c = 0; c < n; c++) self->starts[c] = -2;
    Py_ssize_t i = skip_ws(s, 0, len), at = 0, seen = 0, guess = 0;
    if (i >= len || s[i] != '{') { refuse("not a JSON object"); return NULL; }
    i = skip_ws(s, i + 1, len);
    if (i < len && s[i] == '}') { refuse("an empty object"); return NULL; }
    for (;;) {
        if (i >= len || s[i] != '"') { refuse("a malformed object"); return NULL; }
        Py_ssize_t k0 = i + 1, k1 = k0;
        while (k1 < len && s[k1] != '"' && s[k1] != '\\' && s[k1] >= 0x20) k1++;
        if (k1 >= len || s[k1] != '"') { refuse("an escaped or malformed key"); return NULL; }
        Py_ssize_t kl = k1 - k0, c = -1;
        for (Py_ssize_t t = 0; t < n; t++) {
            Py_ssize_t cc = guess + t < n ? guess + t : guess + t - n;
            if (self->name_lens[cc] == kl && memcmp(self->names[cc], s + k0, (size_t)kl) == 0) { c = cc; break; }
        }
        if (c < 0) { refuse("a field the row does not have"); return NULL; }
        if (self->starts[c] != -2) { refuse("a repeated field"); return NULL; }
        guess = c + 1;
        i = skip_ws(s, k1 + 1, len);
        if (i >= len || s[i] != ':') { refuse("a malformed object"); return NULL; }
        i = skip_ws(s, i + 1, len);
        if (read_value(self, c, s, len, &i, at)) return NULL;
        if (self->starts[c] >= 0) at += self->lens[c];
        seen++;
        i = skip_ws(s, i, len);
        if (i < len && s[i] == ',') { i = skip_ws(s, i + 1, len); continue; }
        if (i < len && s[i] == '}') { i++; break; }
        refuse("a malformed object");
        return NULL;
    }
    if (skip_ws(s, i, len) != len) { refuse("trailing data"); return NULL; }
    if (seen != n) { refuse("a field missing"); return NULL; }
    Py_ssize_t size = 0;
    for (Py_ssize_t c = 0; c < n; c++) size += 4 + (self->starts[c] >= 0 ? self->lens[c] : 0);
    PyObject *res = PyBytes_FromStringAndSize(NULL, size);
    if (!res) return NULL;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(res);
    for (Py_ssize_t c = 0; c < n; c++) {
        if (self->starts[c] < 0) { put32(o, 0xFFFFFFFFu); o += 4; continue; }
        put32(o, (uint32_t)self->lens[c]);
        memcpy(o + 4, self->buf + self->starts[c], (size_t)self->lens[c]);
        o += 4 + self->lens[c];
    }
    return res;
}

static void Encoder_dealloc(Encoder *self) {
    if (self->names) for (Py_ssize_t c = 0; c < self->n; c++) PyMem_Free(self->names[c]);
    PyMem_Free(self->names); PyMem_Free(self->name_lens); PyMem_Free(self->kinds);
    PyMem_Free(self->starts); PyMem_Free(self->lens); PyMem_Free(self->buf);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Encoder_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *kinds, *names;
    (void)kw;
    if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &kinds, &PyTuple_Type, &names)) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(kinds);
    if (n == 0 || n != PyTuple_GET_SIZE(names)) { PyErr_SetString(PyExc_ValueError, "as many kinds as names, at least one"); return NULL; }
    Encoder *self = (Encoder *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->n = n;
    self->kinds = PyMem_Calloc((size_t)n, sizeof(int));
    self->names = PyMem_Calloc((size_t)n, sizeof(char *));
    self->name_lens = PyMem_Calloc((size_t)n, sizeof(Py_ssize_t));
    self->starts = PyMem_Calloc((size_t)n, sizeof(Py_ssize_t));
    self->lens = PyMem_Calloc((size_t)n, sizeof(Py_ssize_t));
    if (!self->kinds || !self->names || !self->name_lens || !self->starts || !self->lens) { Py_DECREF(self); return PyErr_NoMemory(); }
    for (Py_ssize_t c = 0; c < n; c++) {
        long k = PyLong_AsLong(PyTuple_GET_ITEM(kinds, c));
        PyObject *name = PyTuple_GET_ITEM(names, c);
        if (k < K_INT8 || k > K_TEXT || !PyBytes_Check(name)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a kind 0..3 and a bytes name per column");
            Py_DECREF(self);
            return NULL;
        }
        self->kinds[c] = (int)k;
        self->name_lens[c] = PyBytes_GET_SIZE(name);
        self->names[c] = PyMem_Malloc((size_t)self->name_lens[c] + 1);
        if (!self->names[c]) { Py_DECREF(self); return PyErr_NoMemory(); }
        memcpy(self->names[c], PyBytes_AS_STRING(name), (size_t)self->name_lens[c] + 1);
    }
    return (PyObject *)self;
}

static PyTypeObject EncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "eosink.connectors.postgres._copy_rows.Encoder",
    .tp_basicsize = sizeof(Encoder),
    .tp_dealloc = (destructor)Encoder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Encoder_new,
    .tp_call = (ternaryfunc)Encoder_call,
    .tp_doc = "Encoder(kinds, names)(raw) -> the binary COPY fields of a JSON object's values, in column order.",
};

static PyObject *s_topic, *s_partition, *s_offset;

/* Where a record type keeps an attribute as a slot (looked up once per join), or -1: read it as an attribute. */
static Py_ssize_t slot_of(PyTypeObject *type, PyObject *name) {
    PyObject *d = _PyType_Lookup(type, name);  /* borrowed */
    if (d == NULL || Py_TYPE(d) != &PyMemberDescr_Type) return -1;
    PyMemberDef *def = ((PyMemberDescrObject *)d)->d_member;
    return def->type == T_OBJECT_EX ? def->offset : -1;
}

/* A new reference to rec's attribute: from its slot when rec is of `type` and the slot is set. */
static inline PyObject *attr(PyObject *rec, PyTypeObject *type, Py_ssize_t slot, PyObject *name) {
    if (slot >= 0 && Py_TYPE(rec) == type) {
        PyObject *v = *(PyObject **)((char *)rec + slot);
        if (v != NULL) return Py_NewRef(v);
    }
    return PyObject_GetAttr(rec, name);
}

static int int_attr(PyObject *rec, PyTypeObject *type, Py_ssize_t slot, PyObject *name, int64_t *out) {
    PyObject *v = attr(rec, type, slot, name);
    if (!v) return -1;
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    *out = (int64_t)x;
    return 0;
}

static PyObject *join(PyObject *mod, PyObject *args) {
    PyObject *rows, *recs;
    Py_ssize_t start, nfields, ordinal;
    int pwidth;
    (void)mod;
    if (!PyArg_ParseTuple(args, "O!O!nnin", &PyList_Type, &rows, &PyList_Type, &recs, &start, &nfields, &pwidth, &ordinal)) return NULL;
    if (pwidth != 0 && pwidth != 4 && pwidth != 8) { PyErr_SetString(PyExc_ValueError, "partition_width: 0, 4 or 8"); return NULL; }
    Py_ssize_t total = PyList_GET_SIZE(rows) < PyList_GET_SIZE(recs) ? PyList_GET_SIZE(rows) : PyList_GET_SIZE(recs);
    Py_ssize_t stop = start, size = 0;
    while (stop < total && PyBytes_CheckExact(PyList_GET_ITEM(rows, stop))) {
        size += PyBytes_GET_SIZE(PyList_GET_ITEM(rows, stop));
        stop++;
    }
    Py_ssize_t count = stop - start, nf = nfields + (pwidth ? 3 : 0) + (ordinal >= 0 ? 2 : 0);
    if (nf > 32767) { PyErr_SetString(PyExc_ValueError, "too many fields"); return NULL; }
    PyTypeObject *rtype = stop > start ? Py_TYPE(PyList_GET_ITEM(recs, start)) : NULL;
    Py_ssize_t o_topic = rtype ? slot_of(rtype, s_topic) : -1, o_partition = rtype ? slot_of(rtype, s_partition) : -1;
    Py_ssize_t o_offset = rtype ? slot_of(rtype, s_offset) : -1;
    PyObject *topic = NULL;  /* the last record's topic, and its UTF-8 */
    const char *tbytes = NULL;
    Py_ssize_t tlen = 0;
    /* Fixed part per row: count, coordinates' lengths and values, order columns. The topic's length is added per row. */
    Py_ssize_t fixed = 2 + (pwidth ? 4 + 4 + pwidth + 4 + 8 : 0) + (ordinal >= 0 ? 24 : 0);
    /* First pass: the size (topics may differ from row to row). */
    if (pwidth) {
        for (Py_ssize_t i = start; i < stop; i++) {
            PyObject *t = attr(PyList_GET_ITEM(recs, i), rtype, o_topic, s_topic);
            if (!t) { Py_XDECREF(topic); return NULL; }
            if (t != topic) {
                Py_XDECREF(topic);
                topic = t;
                tbytes = PyUnicode_AsUTF8AndSize(t, &tlen);
                if (!tbytes) { Py_DECREF(topic); return NULL; }
            } else {
                Py_DECREF(t);
            }
            size += tlen;
        }
    }
    size += fixed * count;
    PyObject *res = PyBytes_FromStringAndSize(NULL, size);
    if (!res) { Py_XDECREF(topic); return NULL; }
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(res);
    for (Py_ssize_t i = start; i < stop; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i), *rec = PyList_GET_ITEM(recs, i);
        o[0] = (unsigned char)(nf >> 8); o[1] = (unsigned char)nf; o += 2;
        Py_ssize_t rl = PyBytes_GET_SIZE(row);
        memcpy(o, PyBytes_AS_STRING(row), (size_t)rl);
        o += rl;
        int64_t part = 0, off = 0;
        if (pwidth || ordinal >= 0) {
            if (int_attr(rec, rtype, o_offset, s_offset, &off)) goto fail;
        }
        if (pwidth) {
            PyObject *t = attr(rec, rtype, o_topic, s_topic);
            if (!t) goto fail;
            if (t != topic) {
                Py_XDECREF(topic);
                topic = t;
                tbytes = PyUnicode_AsUTF8AndSize(t, &tlen);
                if (!tbytes) goto fail;
            } else {
                Py_DECREF(t);
            }
            if (int_attr(rec, rtype, o_partition, s_partition, &part)) goto fail;
            put32(o, (uint32_t)tlen); memcpy(o + 4, tbytes, (size_t)tlen); o += 4 + tlen;
            if (pwidth == 4) {
                if (part < INT32_MIN || part > INT32_MAX) { PyErr_SetString(PyExc_OverflowError, "partition beyond int4"); goto fail; }
                put32(o, 4); put32(o + 4, (uint32_t)(int32_t)part); o += 8;
            } else {
                put32(o, 8); put64(o + 4, (uint64_t)part); o += 12;
            }
            put32(o, 8); put64(o + 4, (uint64_t)off); o += 12;
        }
        if (ordinal >= 0) {
            put32(o, 8); put64(o + 4, (uint64_t)off); o += 12;
            put32(o, 8); put64(o + 4, (uint64_t)(int64_t)(ordinal + (i - start))); o += 12;
        }
    }
    if (o != (unsigned char *)PyBytes_AS_STRING(res) + size) {  /* a topic that changed between the passes */
        PyErr_SetString(PyExc_RuntimeError, "records changed while joined");
        goto fail;
    }
    Py_XDECREF(topic);
    return Py_BuildValue("(Nn)", res, count);
fail:
    Py_XDECREF(topic);
    Py_DECREF(res);
    return NULL;
}

static PyMethodDef methods[] = {
    {"join", join, METH_VARARGS, "join(rows, recs, start, nfields, partition_width, ordinal) -> (bytes, count)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_copy_rows", NULL, -1, methods};

PyMODINIT_FUNC PyInit__copy_rows(void) {
    for (int c = 0x20; c < 0x80; c++) plain[c] = c != '"' && c != '\\';
    s_topic = PyUnicode_InternFromString("topic");
    s_partition = PyUnicode_InternFromString("partition");
    s_offset = PyUnicode_InternFromString("offset");
    if (!s_topic || !s_partition || !s_offset || PyType_Ready(&EncoderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&EncoderType);
    if (PyModule_AddObject(m, "Encoder", (PyObject *)&EncoderType) < 0) { Py_DECREF(&EncoderType); Py_DECREF(m); return NULL; }
    return m;
}

/* A batch's JSON objects parsed straight into Arrow column buffers, in C (see jsonnative.py).
 *
 * parse(records, names, kinds, required, plain, lazy, coords) -> None or (columns, partitions, offsets)
 *
 * records: a list of SinkRecords; names: a tuple of the value columns' UTF-8 names (bytes); kinds: bytes,
 * one per column (0 int64, 1 float64, 2 large_string, 3 boolean); required: bytes, one flag per column;
 * plain, lazy: the SinkRecord and LazyJsonRecord classes (a record of another class than lazy must hold a dict
 * as its value; the fields of both are read from their slots, of any other class as attributes); coords: 0 (no
 * Kafka coordinate columns), 4 or 8 (the width of the partition column; offsets are int64).
 *
 * Each column comes back as (null_count, validity or None, data, offsets or None), bytes objects that
 * pyarrow's from_buffers takes as they are; partitions and offsets are bytes (or None without coords).
 *
 * None - never an exception, but for memory or a record attribute that raises - for anything the checked path (arrow.py's to_arrow on the
 * decoded values) would not make exactly the same column of: a value that is not a JSON object, a record
 * without its bytes, a field with no column, an escaped or repeated key, a value of another JSON type
 * than its column's (an object or array, a number for a string or a boolean, a float for an int64), an
 * int beyond int64, a float beyond the double range (json.loads: inf), an integer of magnitude 2**53 or more
 * in a float64 column, NaN/Infinity, a null or missing required value, invalid UTF-8, a control
 * character or a lone surrogate in a string, malformed JSON, a partition beyond the column's width.
 *
 * The parse runs with the GIL released (the records' bytes held by reference meanwhile), a batch of SPLIT_MIN
 * records or more in two halves on two threads (the second half's strings copied after the first's once both
 * are done, its offsets shifted; fixed-width buffers and bitmaps shared, split at a whole byte). Floats parse as
 * Python's float() does: the exact fast path (at most 15 digits, a power of ten up to 22: one correctly
 * rounded IEEE operation), else strtod_l in the C locale (correctly rounded in glibc). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <structmember.h>

#include "../common/_json_scan.h"
#ifdef __SSE2__
#include <emmintrin.h>
#endif

enum { K_LONG = 0, K_DOUBLE = 1, K_STRING = 2, K_BOOL = 3 };

typedef struct {
    int kind, required;
    const char *name;
    Py_ssize_t name_len;
    unsigned char *valid;  /* validity bitmap (in `validity`) */
    unsigned char *data;   /* fixed-width values or the boolean bitmap (in `fixed`); string bytes (malloc'd) */
    int64_t *offsets;      /* strings: in `offs` */
    Py_ssize_t len, cap;   /* strings: bytes written, room */
    Py_ssize_t nulls, seen;
    PyObject *validity, *fixed, *offs;
} Col;

static locale_t c_locale;
static PyObject *s_raw_value, *s_value, *s_partition, *s_offset;
static unsigned char plain[256];  /* bytes a string holds as they are: ASCII from the space on, but '"' and '\\' */
static const double POW10[23] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* The bytes from s[i] on that a string holds as they are, copied to *o (advanced past them); the index of the
 * first byte that is not one (or len). 16 bytes a step where SSE2 is there (every x86-64), each step storing
 * all 16 (the room has 16 bytes to spare), then byte by byte. */
static inline Py_ssize_t copy_run(const unsigned char *s, Py_ssize_t i, Py_ssize_t len, unsigned char **o) {
    unsigned char *out = *o;
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'), space = _mm_set1_epi8(0x20);
    while (i + 16 <= len) {
        __m128i v = _mm_loadu_si128((const __m128i *)(s + i));
        _mm_storeu_si128((__m128i *)out, v);
        /* signed: below the space is a control character or (negative) a non-ASCII byte */
        __m128i stop = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)), _mm_cmplt_epi8(v, space));
        int mask = _mm_movemask_epi8(stop);
        if (mask) {
            int k = __builtin_ctz((unsigned)mask);
            *o = out + k;
            return i + k;
        }
        i += 16;
        out += 16;
    }
#endif
    while (i < len && plain[s[i]]) *out++ = s[i++];
    *o = out;
    return i;
}

/* The string whose opening quote is at s[*p], as UTF-8 at out (room: its raw length + 16); -1 to refuse. */
static int read_string(const unsigned char *s, Py_ssize_t len, Py_ssize_t *p, unsigned char *out, Py_ssize_t *out_len) {
    Py_ssize_t i = *p + 1;
    unsigned char *o = out;
    for (;;) {
        i = copy_run(s, i, len, &o);
        if (i >= len) return -1;
        unsigned char c = s[i];
        if (c == '"') break;
        if (c < 0x20) return -1;  /* json.loads refuses control characters in strings */
        if (c >= 0x80) {
            int n = utf8_seq(s, i, len);
            if (!n) return -1;
            memcpy(o, s + i, (size_t)n);
            o += n; i += n;
            continue;
        }
        if (c != '\\' || i + 1 >= len) return -1;
        unsigned char e = s[i + 1];
        i += 2;
        switch (e) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            uint32_t cp, lo;
            if (hex4(s, i, len, &cp)) return -1;
            i += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) {  /* a pair, or a lone surrogate: UTF-8 has none */
                if (i + 1 >= len || s[i] != '\\' || s[i + 1] != 'u' || hex4(s, i + 2, len, &lo)) return -1;
                if (lo < 0xDC00 || lo > 0xDFFF) return -1;
                i += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return -1;
            }
            o = put_cp(o, cp);
            break;
        }
        default: return -1;
        }
    }
    *p = i + 1;
    *out_len = o - out;
    return 0;
}

#define EXACT_INT (INT64_C(1) << 53)

/* A number at s[*p] for a long (is_double 0) or double column, into *out; -1 to refuse. */
static int read_number(const unsigned char *s, Py_ssize_t len, Py_ssize_t *p, int is_double, unsigned char *out) {
    Py_ssize_t i = *p, start = *p;
    int neg = 0;
    if (i < len && s[i] == '-') { neg = 1; i++; }
    if (i >= len || s[i] < '0' || s[i] > '9') return -1;  /* NaN, Infinity, -Infinity: the checked path's */
    Py_ssize_t d0 = i;
    uint64_t m = 0;
    if (s[i] == '0') i++;
    else while (i < len && s[i] >= '0' && s[i] <= '9') { if (i - d0 < 19) m = m * 10 + (uint64_t)(s[i] - '0'); i++; }
    Py_ssize_t int_digits = i - d0, frac_digits = 0;
    int is_float = 0, fast = int_digits <= 15;
    if (i < len && s[i] == '.') {
        Py_ssize_t f0 = ++i;
        while (i < len && s[i] >= '0' && s[i] <= '9') { if (i - f0 + int_digits < 16) m = m * 10 + (uint64_t)(s[i] - '0'); i++; }
        frac_digits = i - f0;
        if (!frac_digits) return -1;
        is_float = 1;
    }
    long e = 0;
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        int eneg = 0;
        i++;
        if (i < len && (s[i] == '+' || s[i] == '-')) eneg = s[i++] == '-';
        Py_ssize_t e0 = i;
        while (i < len && s[i] >= '0' && s[i] <= '9') { if (i - e0 < 6) e = e * 10 + (s[i] - '0'); i++; }
        if (i == e0) return -1;
        if (i - e0 >= 6) fast = 0;
        if (eneg) e = -e;
        is_float = 1;
    }
    if (i < len && s[i] >= '0' && s[i] <= '9') return -1;  /* a leading zero: json.loads stops there */
    *p = i;
    if (!is_float) {
        if (int_digits > 19) return -1;
        if (neg ? m > (uint64_t)INT64_MAX + 1 : m > (uint64_t)INT64_MAX) return -1;
        /* (19 digits can wrap beyond 2**64: recheck those against the text's order) */
        if (int_digits == 19 && memcmp(s + d0, neg ? "9223372036854775808" : "9223372036854775807", 19) > 0) return -1;
        int64_t v = neg ? (int64_t)(0 - m) : (int64_t)m;
        if (is_double) {
            if (v >= EXACT_INT || v <= -EXACT_INT) return -1;  /* the checked path refuses or rounds: not ours */
            double d = (double)v;  /* -0 is the int 0: +0.0 */
            memcpy(out, &d, 8);
        } else {
            memcpy(out, &v, 8);
        }
        return 0;
    }
    if (!is_double) return -1;  /* a float for a long column */
    double d;
    if (fast && int_digits + frac_digits <= 15) {
        long e10 = e - (long)frac_digits;
        if (e10 >= -22 && e10 <= 22) {
            d = (double)m;  /* below 10**15: exact, and so is the power; one rounding */
            d = e10 < 0 ? d / POW10[-e10] : d * POW10[e10];
            if (neg) d = -d;
            memcpy(out, &d, 8);
            return 0;
        }
    }
    char tmp[128];
    Py_ssize_t n = i - start;
    if (n >= (Py_ssize_t)sizeof(tmp)) return -1;
    memcpy(tmp, s + start, (size_t)n);
    tmp[n] = 0;
    char *end;
    d = strtod_l(tmp, &end, c_locale);  /* subnormals and underflows to 0 too, as float() rounds them */
    if (end != tmp + n || !isfinite(d)) return -1;
    memcpy(out, &d, 8);
    return 0;
}

static inline int literal(const unsigned char *s, Py_ssize_t len, Py_ssize_t *p, const char *word, Py_ssize_t n) {
    if (*p + n > len || memcmp(s + *p, word, (size_t)n) != 0) return 0;
    *p += n;
    return 1;
}

static int grow(Col *c, Py_ssize_t need) {
    if (c->len + need <= c->cap) return 0;
    Py_ssize_t cap = (c->len + need) * 2;
    unsigned char *b = realloc(c->data, (size_t)cap);
    if (!b) return -1;
    c->data = b;
    c->cap = cap;
    return 0;
}

/* Record `row`'s value for column c at s[*p]. -1 refuses, -2 is out of memory. */
static int read_value(Col *c, Py_ssize_t row, const unsigned char *s, Py_ssize_t len, Py_ssize_t *p) {
    if (literal(s, len, p, "null", 4)) return c->required ? -1 : 0;
    switch (c->kind) {
    case K_STRING: {
        Py_ssize_t n;
        if (*p >= len || s[*p] != '"') return -1;
        if (grow(c, len - *p + 16)) return -2;
        if (read_string(s, len, p, c->data + c->len, &n)) return -1;
        c->len += n;
        break;
    }
    case K_BOOL:
        if (literal(s, len, p, "true", 4)) c->data[row >> 3] |= (unsigned char)(1u << (row & 7));
        else if (!literal(s, len, p, "false", 5)) return -1;
        break;
    default:
        if (read_number(s, len, p, c->kind == K_DOUBLE, c->data + 8 * row)) return -1;
    }
    c->valid[row >> 3] |= (unsigned char)(1u << (row & 7));
    return 0;
}

/* Whether n bytes are equal: inline, for names of a few bytes (a call to memcmp costs more). */
static inline int same(const char *a, const unsigned char *b, Py_ssize_t n) {
    for (Py_ssize_t k = 0; k < n; k++) if ((unsigned char)a[k] != b[k]) return 0;
    return 1;
}

/* Record `row`'s object into the columns: 0, -1 to refuse, -2 out of memory. */
static int parse_one(Col *cols, Py_ssize_t ncols, Py_ssize_t row, const unsigned char *s, Py_ssize_t len) {
    Py_ssize_t i = skip_ws(s, 0, len), guess = 0;
    if (i >= len || s[i] != '{') return -1;
    i = skip_ws(s, i + 1, len);
    if (i < len && s[i] == '}') i++;
    else for (;;) {
        if (i >= len || s[i] != '"') return -1;
        Py_ssize_t k0 = i + 1, k1, c = -1;
        /* The next column's name, then the closing quote (names hold no quote, backslash or control character):
         * that key, without a scan, in a batch whose fields come in the table's order */
        Col *g = &cols[guess < ncols ? guess : 0];
        if (k0 + g->name_len < len && s[k0 + g->name_len] == '"' && same(g->name, s + k0, g->name_len)) {
            c = g - cols;
            k1 = k0 + g->name_len;
        } else {
            k1 = k0;
            while (k1 < len && s[k1] != '"' && s[k1] != '\\' && s[k1] >= 0x20) k1++;
            if (k1 >= len || s[k1] != '"') return -1;  /* an escaped key (or malformed): the checked path decodes it */
            Py_ssize_t kl = k1 - k0;
            for (Py_ssize_t cc = 0; cc < ncols; cc++)
                if (cols[cc].name_len == kl && memcmp(cols[cc].name, s + k0, (size_t)kl) == 0) { c = cc; break; }
        }
        if (c < 0 || cols[c].seen == row) return -1;  /* no column, or a repeated key */
        cols[c].seen = row;
        guess = c + 1;
        i = skip_ws(s, k1 + 1, len);
        if (i >= len || s[i] != ':') return -1;
        i = skip_ws(s, i + 1, len);
        int rc = read_value(&cols[c], row, s, len, &i);
        if (rc) return rc;
        i = skip_ws(s, i, len);
        if (i < len && s[i] == ',') { i = skip_ws(s, i + 1, len); continue; }
        if (i < len && s[i] == '}') { i++; break; }
        return -1;
    }
    if (skip_ws(s, i, len) != len) return -1;
    for (Py_ssize_t c = 0; c < ncols; c++) {
        Col *col = &cols[c];
        if (!(col->valid[row >> 3] & (1u << (row & 7)))) {
            if (col->required) return -1;
            col->nulls++;
        }
        if (col->kind == K_STRING) col->offsets[row + 1] = col->len;
    }
    return 0;
}

/* Rows [from, to) of the batch into cols (a thread's body): rc as parse_one's. */
typedef struct { Col *cols; Py_ssize_t ncols; PyObject **raws; Py_ssize_t from, to; int rc; } Part;
#define SPLIT_MIN 4096  /* fewer rows are parsed on one thread (starting one costs ~50 us) */

static void *run_part(void *arg) {
    Part *p = arg;
    for (Py_ssize_t r = p->from; r < p->to && !p->rc; r++)
        p->rc = parse_one(p->cols, p->ncols, r, (const unsigned char *)PyBytes_AS_STRING(p->raws[r]), PyBytes_GET_SIZE(p->raws[r]));
    return NULL;
}

/* A string column's bytes: the first half's, then the second's (or NULL: one thread). */
static PyObject *joined(Col *a, Col *b) {
    Py_ssize_t more = b ? b->len : 0;
    PyObject *out = PyBytes_FromStringAndSize(NULL, a->len + more);
    if (!out) return NULL;
    memcpy(PyBytes_AS_STRING(out), a->data, (size_t)a->len);
    if (more) memcpy(PyBytes_AS_STRING(out) + a->len, b->data, (size_t)more);
    return out;
}

static PyObject *zeroed(Py_ssize_t size) {
    PyObject *b = PyBytes_FromStringAndSize(NULL, size);
    if (b) memset(PyBytes_AS_STRING(b), 0, (size_t)size);
    return b;
}

/* String columns' scratch buffers kept between calls (taken and given back with the GIL held, so calls on
 * several threads each get their own): a fresh buffer of a few MB costs a page fault every 4 KB. */
#define POOL 32
#define POOL_BYTES ((Py_ssize_t)64 << 20)
static struct { unsigned char *data; Py_ssize_t cap; } pool[POOL];
static Py_ssize_t pooled;

static int take_scratch(Col *c, Py_ssize_t want) {
    for (int k = 0; k < POOL; k++) {
        if (pool[k].data) {
            c->data = pool[k].data; c->cap = pool[k].cap; pooled -= c->cap;
            pool[k].data = NULL;
            return 0;
        }
    }
    c->cap = want;
    c->data = malloc((size_t)want);
    return c->data ? 0 : -1;
}

static void give_scratch(Col *c) {
    for (int k = 0; k < POOL && pooled + c->cap <= POOL_BYTES; k++) {
        if (!pool[k].data) {
            pool[k].data = c->data; pool[k].cap = c->cap; pooled += c->cap;
            return;
        }
    }
    free(c->data);
}

static void free_cols(Col *cols, Py_ssize_t ncols) {
    for (Py_ssize_t c = 0; c < ncols; c++) {
        Py_XDECREF(cols[c].validity); Py_XDECREF(cols[c].fixed); Py_XDECREF(cols[c].offs);
        if (cols[c].kind == K_STRING && cols[c].data) give_scratch(&cols[c]);
    }
    PyMem_Free(cols);
}

/* Where the slot `name` of the records' own class (SinkRecord: a slots dataclass) is, when the lazy subclass
 * reads the same slot (value: it does not, a property decodes it) - read in place, no attribute lookup a
 * record and field; -1 to look the attribute up. */
static Py_ssize_t slot_offset(PyTypeObject *plain, PyTypeObject *lazy, PyObject *name) {
    PyObject *d = _PyType_Lookup(plain, name);
    if (!d || !Py_IS_TYPE(d, &PyMemberDescr_Type) || ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) return -1;
    if (name != s_value && _PyType_Lookup(lazy, name) != d) return -1;
    return ((PyMemberDescrObject *)d)->d_member->offset;
}

/* Field `name` of record `rec` (a new reference): in place where its class is plain or lazy, else looked up.
 * NULL with an exception set on an error; NULL without one for an unset slot (the caller declines). */
static inline PyObject *field(PyObject *rec, int in_place, Py_ssize_t off, PyObject *name) {
    if (in_place && off >= 0) return Py_XNewRef(*(PyObject **)((char *)rec + off));
    return PyObject_GetAttr(rec, name);
}

/* The records' bytes (new references, in raws) and their coordinates; 1 to decline, -1 on an error. */
static int gather(PyObject *records, Py_ssize_t n, PyTypeObject *plain, PyTypeObject *lazy, int coords, PyObject **raws,
                  unsigned char *parts, int64_t *offs) {
    Py_ssize_t o_value = slot_offset(plain, lazy, s_value), o_raw = slot_offset(plain, lazy, s_raw_value);
    Py_ssize_t o_coord[2] = {slot_offset(plain, lazy, s_partition), slot_offset(plain, lazy, s_offset)};
    for (Py_ssize_t r = 0; r < n; r++) {
        PyObject *rec = PyList_GET_ITEM(records, r);
        PyTypeObject *t = Py_TYPE(rec);
        int in_place = t == plain || t == lazy;
        if (t != lazy) {
            PyObject *v = field(rec, t == plain, o_value, s_value);
            if (!v) return PyErr_Occurred() ? -1 : 1;
            int ok = PyDict_CheckExact(v);
            Py_DECREF(v);
            if (!ok) return 1;
        }
        PyObject *raw = field(rec, in_place, o_raw, s_raw_value);
        if (!raw) return PyErr_Occurred() ? -1 : 1;
        raws[r] = raw;
        if (!PyBytes_CheckExact(raw)) return 1;
        if (!coords) continue;
        for (int k = 0; k < 2; k++) {
            PyObject *o = field(rec, in_place, o_coord[k], k ? s_offset : s_partition);
            if (!o) return PyErr_Occurred() ? -1 : 1;
            int overflow = 0;
            long long v = PyLong_Check(o) ? PyLong_AsLongLongAndOverflow(o, &overflow) : -1;
            int bad = !PyLong_Check(o) || overflow || (v == -1 && PyErr_Occurred());
            Py_DECREF(o);
            if (bad) { PyErr_Clear(); return 1; }
            if (k) { offs[r] = (int64_t)v; continue; }
            if (coords == 4) {
                if (v < INT32_MIN || v > INT32_MAX) return 1;
                int32_t w = (int32_t)v;
                memcpy(parts + 4 * r, &w, 4);
            } else {
                int64_t w = (int64_t)v;
                memcpy(parts + 8 * r, &w, 8);
            }
        }
    }
    return 0;
}

static PyObject *parse(PyObject *self, PyObject *args) {
    PyObject *records, *names, *kinds, *required;
    PyTypeObject *plain, *lazy;
    int coords;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!O!SSO!O!i", &PyList_Type, &records, &PyTuple_Type, &names, &kinds, &required,
                          &PyType_Type, &plain, &PyType_Type, &lazy, &coords))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(records), ncols = PyTuple_GET_SIZE(names);
    if (PyBytes_GET_SIZE(kinds) != ncols || PyBytes_GET_SIZE(required) != ncols || (coords && coords != 4 && coords != 8)) {
        PyErr_SetString(PyExc_ValueError, "a kind and a required flag per name; coords 0, 4 or 8");
        return NULL;
    }
    if (n == 0 || ncols == 0) Py_RETURN_NONE;
    Col *cols = PyMem_Calloc((size_t)ncols, sizeof(Col));
    PyObject **raws = PyMem_Calloc((size_t)n, sizeof(PyObject *));
    PyObject *parts = NULL, *offs = NULL, *result = NULL;
    Col *cols2 = NULL;
    int rc = -1;
    if (!cols || !raws) { PyErr_NoMemory(); goto done; }
    Py_ssize_t bitmap = (n + 7) / 8;
    for (Py_ssize_t c = 0; c < ncols; c++) {
        Col *col = &cols[c];
        PyObject *name = PyTuple_GET_ITEM(names, c);
        col->kind = (unsigned char)PyBytes_AS_STRING(kinds)[c];
        col->required = PyBytes_AS_STRING(required)[c] != 0;
        col->seen = -1;
        if (!PyBytes_Check(name) || col->kind > K_BOOL) { PyErr_SetString(PyExc_ValueError, "bytes names, kinds 0..3"); goto done; }
        col->name = PyBytes_AS_STRING(name);
        col->name_len = PyBytes_GET_SIZE(name);
        if (!(col->validity = zeroed(bitmap))) goto done;
        col->valid = (unsigned char *)PyBytes_AS_STRING(col->validity);
        if (col->kind == K_STRING) {
            if (!(col->offs = zeroed(8 * (n + 1)))) goto done;
            col->offsets = (int64_t *)PyBytes_AS_STRING(col->offs);
            if (take_scratch(col, 64 * n)) { PyErr_NoMemory(); goto done; }
        } else {
            if (!(col->fixed = col->kind == K_BOOL ? zeroed(bitmap) : zeroed(8 * n))) goto done;
            col->data = (unsigned char *)PyBytes_AS_STRING(col->fixed);
        }
    }
    if (coords) {
        if (!(parts = PyBytes_FromStringAndSize(NULL, coords * n)) || !(offs = PyBytes_FromStringAndSize(NULL, 8 * n))) goto done;
    }
    rc = gather(records, n, plain, lazy, coords, raws, parts ? (unsigned char *)PyBytes_AS_STRING(parts) : NULL,
                offs ? (int64_t *)PyBytes_AS_STRING(offs) : NULL);
    if (rc) goto done;
    /* The second half on a thread of its own: its own string buffers and offsets from 0 (shifted after), the
     * same fixed-width buffers and bitmaps (rows from a multiple of 8: no byte written by both). */
    Py_ssize_t mid = n >= SPLIT_MIN ? ((n / 2) + 7) & ~(Py_ssize_t)7 : n;
    if (mid < n) {
        if (!(cols2 = PyMem_Calloc((size_t)ncols, sizeof(Col)))) { PyErr_NoMemory(); rc = -1; goto done; }
        for (Py_ssize_t c = 0; c < ncols; c++) {
            cols2[c] = cols[c];
            cols2[c].validity = cols2[c].fixed = cols2[c].offs = NULL;  /* (owned by cols) */
            if (cols[c].kind == K_STRING) {
                cols2[c].data = NULL;
                if (take_scratch(&cols2[c], 64 * (n - mid))) { PyErr_NoMemory(); rc = -1; goto done; }
            }
        }
    }
    Part first = {cols, ncols, raws, 0, mid, 0}, second = {cols2, ncols, raws, mid, n, 0};
    Py_BEGIN_ALLOW_THREADS
    pthread_t thread;
    int threaded = mid < n && pthread_create(&thread, NULL, run_part, &second) == 0;
    run_part(&first);
    if (threaded) pthread_join(thread, NULL);
    else if (mid < n && !first.rc) run_part(&second);
    rc = first.rc ? first.rc : second.rc;
    if (!rc && mid < n) {
        for (Py_ssize_t c = 0; c < ncols; c++) {
            Col *a = &cols[c], *b = &cols2[c];
            a->nulls += b->nulls;
            if (a->kind != K_STRING) continue;
            for (Py_ssize_t r = mid + 1; r <= n; r++) a->offsets[r] += a->len;
        }
    }
    Py_END_ALLOW_THREADS
    if (rc == -2) { PyErr_NoMemory(); rc = -1; }
    if (rc) { rc = rc == -1 && !PyErr_Occurred() ? 1 : -1; goto done; }
    PyObject *columns = PyTuple_New(ncols);
    if (!columns) goto done;
    for (Py_ssize_t c = 0; c < ncols; c++) {
        Col *col = &cols[c];
        PyObject *data = col->kind == K_STRING ? joined(col, cols2 ? &cols2[c] : NULL) : Py_NewRef(col->fixed);
        PyObject *item = data ? Py_BuildValue("(nOOO)", col->nulls, col->nulls ? col->validity : Py_None, data,
                                              col->offs ? col->offs : Py_None) : NULL;
        Py_XDECREF(data);
        if (!item) { Py_DECREF(columns); goto done; }
        PyTuple_SET_ITEM(columns, c, item);
    }
    result = Py_BuildValue("(NOO)", columns, parts ? parts : Py_None, offs ? offs : Py_None);
done:
    if (raws) for (Py_ssize_t r = 0; r < n; r++) Py_XDECREF(raws[r]);
    PyMem_Free(raws);
    if (cols) free_cols(cols, ncols);
    if (cols2) free_cols(cols2, ncols);
    Py_XDECREF(parts);
    Py_XDECREF(offs);
    if (rc == 1) Py_RETURN_NONE;
    return result;
}

static PyMethodDef methods[] = {
    {"parse", parse, METH_VARARGS, "The records' JSON objects as Arrow column buffers, or None (see jsonnative.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_json_columns", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__json_columns(void) {
    for (int c = 0x20; c < 0x80; c++) plain[c] = c != '"' && c != '\\';
    c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
    if (!c_locale) return PyErr_NoMemory();
    if (!(s_raw_value = PyUnicode_InternFromString("raw_value")) || !(s_value = PyUnicode_InternFromString("value"))
        || !(s_partition = PyUnicode_InternFromString("partition")) || !(s_offset = PyUnicode_InternFromString("offset")))
        return NULL;
    return PyModule_Create(&module);
}

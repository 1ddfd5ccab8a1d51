/* The publisher's produce loop in C: one rd_kafka_producev() per row of an Arrow batch (see __init__.py). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* librdkafka's stable ABI (rdkafka.h): the varargs tags of rd_kafka_producev(). */
enum { VT_END = 0, VT_TOPIC = 1, VT_RKT = 2, VT_PARTITION = 3, VT_VALUE = 4, VT_KEY = 5, VT_OPAQUE = 6,
       VT_MSGFLAGS = 7, VT_TIMESTAMP = 8, VT_HEADER = 9, VT_HEADERS = 10 };
#define MSG_F_COPY 0x2
#define PARTITION_UA (-1)
typedef int (*producev_fn)(void *rk, ...);

static int get_buf(PyObject *o, Py_buffer *b) {
    if (o == Py_None) { memset(b, 0, sizeof(*b)); return 0; }
    return PyObject_GetBuffer(o, b, PyBUF_SIMPLE);
}

static inline int is_valid(const uint8_t *bitmap, int64_t offset, int64_t i) {
    if (!bitmap) return 1;
    int64_t j = offset + i;
    return (bitmap[j >> 3] >> (j & 7)) & 1;
}

static inline void slot(const Py_buffer *offsets, int wide, int64_t off, int64_t i, int64_t *start, int64_t *len) {
    if (wide) {
        const int64_t *o = (const int64_t *)offsets->buf;
        *start = o[off + i]; *len = o[off + i + 1] - o[off + i];
    } else {
        const int32_t *o = (const int32_t *)offsets->buf;
        *start = o[off + i]; *len = (int64_t)o[off + i + 1] - o[off + i];
    }
}

/* produce(producev, rk, topic, n, first,
 *         key_validity, key_offsets, key_data, key_offset, key_wide,
 *         val_validity, val_offsets, val_data, val_offset, val_wide,
 *         id_name, id_prefix, seq, run_name, run_value) -> (rows produced, error code)
 * Stops at the first error (the queue full: -184), returning how far it got. */
static PyObject *produce(PyObject *self, PyObject *args) {
    unsigned long long producev_addr, rk_addr;
    const char *topic, *id_name, *run_name;
    Py_ssize_t n, first;
    PyObject *kv, *ko, *kd, *vv, *vo, *vd;
    Py_ssize_t koff, voff;
    int kwide, vwide;
    const char *prefix, *run_value;
    Py_ssize_t prefix_len, run_len;
    long long seq;
    if (!PyArg_ParseTuple(args, "KKsnnOOOnpOOOnpsy#Lsy#", &producev_addr, &rk_addr, &topic, &n, &first,
                          &kv, &ko, &kd, &koff, &kwide, &vv, &vo, &vd, &voff, &vwide,
                          &id_name, &prefix, &prefix_len, &seq, &run_name, &run_value, &run_len))
        return NULL;
    producev_fn producev = (producev_fn)(uintptr_t)producev_addr;
    void *rk = (void *)(uintptr_t)rk_addr;
    Py_buffer kvb, kob, kdb, vvb, vob, vdb;
    if (get_buf(kv, &kvb) || get_buf(ko, &kob) || get_buf(kd, &kdb) || get_buf(vv, &vvb) || get_buf(vo, &vob) || get_buf(vd, &vdb))
        return NULL;  /* (a buffer already taken stays taken: only on a caller's bug) */
    char id[512];
    if (prefix_len > 480) { PyErr_SetString(PyExc_ValueError, "id prefix too long"); return NULL; }
    memcpy(id, prefix, prefix_len);
    Py_ssize_t i = first;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; i < n; i++) {
        int64_t ks = 0, kl = 0, vs = 0, vl = 0;
        const void *kp = NULL, *vp = NULL;
        if (kob.buf && is_valid(kvb.buf, koff, i)) { slot(&kob, kwide, koff, i, &ks, &kl); kp = (const char *)kdb.buf + ks; }
        if (vob.buf && is_valid(vvb.buf, voff, i)) { slot(&vob, vwide, voff, i, &vs, &vl); vp = (const char *)vdb.buf + vs; }
        int idl = prefix_len + snprintf(id + prefix_len, sizeof(id) - prefix_len, "%lld", seq + (long long)(i - first));
        err = producev(rk, VT_TOPIC, topic, VT_PARTITION, (int32_t)PARTITION_UA, VT_MSGFLAGS, (int)MSG_F_COPY,
                       VT_KEY, kp, (size_t)kl, VT_VALUE, vp, (size_t)vl,
                       VT_HEADER, id_name, (const void *)id, (ssize_t)idl,
                       VT_HEADER, run_name, (const void *)run_value, (ssize_t)run_len,
                       VT_END);
        if (err) break;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&kvb); PyBuffer_Release(&kob); PyBuffer_Release(&kdb);
    PyBuffer_Release(&vvb); PyBuffer_Release(&vob); PyBuffer_Release(&vdb);
    return Py_BuildValue("(ni)", i, err);
}

/* The content fingerprint of a streaming partition (see eosink/spark_jobs/fingerprint.py, which has the same
 * function in Python): the sum, modulo 2^64, of one 64-bit hash per (key, value) row, so that the order of the
 * rows does not change it. Words are read little-endian, as the Python version reads them. */
#define FP_PRIME 0x9E3779B97F4A7C15ULL
static inline uint64_t fmix64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
    return x;
}

static uint64_t hash_bytes(const uint8_t *p, int64_t len, uint64_t seed) {
    uint64_t h = seed ^ ((uint64_t)len * FP_PRIME);
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * FP_PRIME;
        h ^= h >> 32;
    }
    uint64_t t = 0;
    for (int64_t j = 0; i + j < len; j++) t |= (uint64_t)p[i + j] << (8 * j);
    return fmix64((h ^ fmix64(t ^ (uint64_t)(len - i))) * FP_PRIME);
}

#define FP_KEY_SEED 0x6b6579ULL
#define FP_VALUE_SEED 0x76616c7565ULL
#define FP_NULL 0x6e756c6cULL

/* fingerprint(key_validity, key_offsets, key_data, key_offset, key_wide,
 *             val_validity, val_offsets, val_data, val_offset, val_wide, n) -> int */
static PyObject *fingerprint(PyObject *self, PyObject *args) {
    PyObject *kv, *ko, *kd, *vv, *vo, *vd;
    Py_ssize_t koff, voff, n;
    int kwide, vwide;
    if (!PyArg_ParseTuple(args, "OOOnpOOOnpn", &kv, &ko, &kd, &koff, &kwide, &vv, &vo, &vd, &voff, &vwide, &n))
        return NULL;
    Py_buffer kvb, kob, kdb, vvb, vob, vdb;
    if (get_buf(kv, &kvb) || get_buf(ko, &kob) || get_buf(kd, &kdb) || get_buf(vv, &vvb) || get_buf(vo, &vob) || get_buf(vd, &vdb))
        return NULL;
    uint64_t sum = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t s = 0, l = 0;
        uint64_t hk = fmix64(FP_KEY_SEED ^ FP_NULL), hv = fmix64(FP_VALUE_SEED ^ FP_NULL);
        if (kob.buf && is_valid(kvb.buf, koff, i)) { slot(&kob, kwide, koff, i, &s, &l); hk = hash_bytes((const uint8_t *)kdb.buf + s, l, FP_KEY_SEED); }
        if (vob.buf && is_valid(vvb.buf, voff, i)) { slot(&vob, vwide, voff, i, &s, &l); hv = hash_bytes((const uint8_t *)vdb.buf + s, l, FP_VALUE_SEED); }
        sum += fmix64(hk * FP_PRIME + hv);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&kvb); PyBuffer_Release(&kob); PyBuffer_Release(&kdb);
    PyBuffer_Release(&vvb); PyBuffer_Release(&vob); PyBuffer_Release(&vdb);
    return PyLong_FromUnsignedLongLong(sum);
}

static PyMethodDef methods[] = {
    {"produce", produce, METH_VARARGS, "Produce rows [first, n) of an Arrow key/value batch with the two eosink headers."},
    {"fingerprint", fingerprint, METH_VARARGS, "The order-independent content fingerprint of an Arrow key/value batch."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_produce", NULL, -1, methods};

PyMODINIT_FUNC PyInit__produce(void) { return PyModule_Create(&module); }

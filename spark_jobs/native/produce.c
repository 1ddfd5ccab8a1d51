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

static PyMethodDef methods[] = {
    {"produce", produce, METH_VARARGS, "Produce rows [first, n) of an Arrow key/value batch with the two eosink headers."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_produce", NULL, -1, methods};

PyMODINIT_FUNC PyInit__produce(void) { return PyModule_Create(&module); }

/* JSON text scanning shared by the C extensions that parse record values (connectors/postgres/_copy_rows.c,
 * connectors/iceberg/_json_columns.c): pure functions, no Python objects, safe without the GIL. */
#ifndef EOSINK_JSON_SCAN_H
#define EOSINK_JSON_SCAN_H

#include <Python.h>
#include <stdint.h>

/* The index of the first byte at or after i that is not JSON whitespace (json.loads' four). */
static inline Py_ssize_t skip_ws(const unsigned char *s, Py_ssize_t i, Py_ssize_t len) {
    while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    return i;
}

/* The four hex digits at s[i] as *out; -1 for anything else (or too few bytes). */
static inline int hex4(const unsigned char *s, Py_ssize_t i, Py_ssize_t len, uint32_t *out) {
    uint32_t v = 0;
    if (i + 4 > len) return -1;
    for (int k = 0; k < 4; k++) {
        unsigned char c = s[i + k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

/* The length of the valid UTF-8 sequence at s[i] (a non-ASCII lead byte; no surrogates), or 0. */
static inline int utf8_seq(const unsigned char *s, Py_ssize_t i, Py_ssize_t len) {
    unsigned char c = s[i];
    int n;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) { n = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; cp = c & 0x07; }
    else return 0;
    if (i + n > len) return 0;
    for (int k = 1; k < n; k++) {
        if ((s[i + k] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
    return n;
}

/* Code point cp (no surrogate) as UTF-8 at o; the byte after it. */
static inline unsigned char *put_cp(unsigned char *o, uint32_t cp) {
    if (cp < 0x80) *o++ = (unsigned char)cp;
    else if (cp < 0x800) { *o++ = (unsigned char)(0xC0 | (cp >> 6)); *o++ = (unsigned char)(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
        *o++ = (unsigned char)(0xE0 | (cp >> 12)); *o++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        *o++ = (unsigned char)(0x80 | (cp & 0x3F));
    } else {
        *o++ = (unsigned char)(0xF0 | (cp >> 18)); *o++ = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        *o++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3F)); *o++ = (unsigned char)(0x80 | (cp & 0x3F));
    }
    return o;
}

#endif

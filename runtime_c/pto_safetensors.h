/* pto_safetensors.h - 2-D tensors in and out of safetensors files, for the standalone program
 * `pto codegen` writes (main.c: `graph SEQ --run IN --out OUT`), with no Python.
 *
 * Header-only (static), plain C99. A safetensors file is an 8-byte little-endian header length,
 * a JSON object (each tensor's name -> {"dtype", "shape", "data_offsets"}, and optionally
 * "__metadata__"), then the data, row-major, little-endian. The reader walks the top-level
 * object (strings with their escapes, nested objects and arrays skipped) and takes a tensor by
 * name; the writer writes F32, F16 and BF16 tensors. Every failure is a message in `err`, never
 * an abort: a missing or truncated file, a tensor not there, another dtype or shape.
 */
#ifndef PTO_SAFETENSORS_H
#define PTO_SAFETENSORS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    unsigned char *bytes; /* the whole file */
    size_t size;
    size_t header; /* JSON from 8 to 8 + header, data from there on */
} pto_st_file;

/* safetensors' dtype names, by element size and kind as pto stores them */
static const char *const pto_st_dtypes[3] = {"F32", "F16", "BF16"};

static int pto_st_open(pto_st_file *f, const char *path, char *err, size_t n)
{
    FILE *fp = fopen(path, "rb");
    long size;
    uint64_t h = 0;
    int k;
    memset(f, 0, sizeof *f);
    if (fp == NULL || fseek(fp, 0, SEEK_END) != 0 || (size = ftell(fp)) < 0 || fseek(fp, 0, SEEK_SET) != 0) {
        snprintf(err, n, "cannot read %s", path);
        if (fp != NULL) {
            fclose(fp);
        }
        return -1;
    }
    f->size = (size_t)size;
    f->bytes = malloc(f->size + 1);
    if (f->bytes == NULL || fread(f->bytes, 1, f->size, fp) != f->size) {
        snprintf(err, n, "cannot read %s", path);
        fclose(fp);
        return -1;
    }
    fclose(fp);
    f->bytes[f->size] = '\0';
    for (k = 7; k >= 0 && f->size >= 8; k--) {
        h = h << 8 | f->bytes[k];
    }
    if (f->size < 8 || h > f->size - 8) {
        snprintf(err, n, "%s is not a safetensors file (its header length does not fit the file)", path);
        return -1;
    }
    f->header = (size_t)h;
    return 0;
}

static void pto_st_close(pto_st_file *f)
{
    free(f->bytes);
    f->bytes = NULL;
}

/* the end of the JSON value starting at p (within [p, end)), or NULL */
static const char *pto_st_skip(const char *p, const char *end)
{
    int depth = 0;
    for (; p < end; p++) {
        if (*p == '"') {
            for (p++; p < end && *p != '"'; p++) {
                if (*p == '\\') {
                    p++;
                }
            }
            if (p >= end) {
                return NULL;
            }
            if (depth == 0) {
                return p + 1;
            }
        } else if (*p == '{' || *p == '[') {
            depth++;
        } else if (*p == '}' || *p == ']') {
            if (--depth == 0) {
                return p + 1;
            }
            if (depth < 0) {
                return NULL;
            }
        } else if (depth == 0 && (*p == ',' || *p == '}')) {
            return p;
        }
    }
    return NULL;
}

/* the first integers after `"key"` inside [p, end): up to `max` of them */
static int pto_st_ints(const char *p, const char *end, const char *key, int64_t *out, int max)
{
    char quoted[32];
    const char *at;
    int k = 0;
    snprintf(quoted, sizeof quoted, "\"%s\"", key);
    at = strstr(p, quoted);
    if (at == NULL || at >= end || (at = strchr(at, '[')) == NULL || at >= end) {
        return -1;
    }
    for (at++; k < max && at < end && *at != ']';) {
        char *next;
        long long v = strtoll(at, &next, 10);
        if (next == at) {
            at++;
            continue;
        }
        out[k++] = (int64_t)v;
        at = next;
    }
    return k;
}

/* Tensor `name` of the file into `dst` (rows x cols elements of `dtype`: 0 f32, 1 f16, 2 bf16). */
static int pto_st_get(const pto_st_file *f, const char *name, int dtype, int64_t rows, int64_t cols, void *dst,
                      char *err, size_t n)
{
    const char *json = (const char *)f->bytes + 8, *end = json + f->header, *p = json;
    size_t len = strlen(name);
    while (p != NULL && p < end && *p != '{') {
        p++;
    }
    for (p = p ? p + 1 : NULL; p != NULL && p < end;) {
        const char *key, *value, *after;
        while (p < end && (*p == ' ' || *p == ',' || *p == '\n' || *p == '\t' || *p == '\r')) {
            p++;
        }
        if (p >= end || *p != '"') {
            break;
        }
        key = p + 1;
        p = pto_st_skip(p, end);
        value = p == NULL ? NULL : strchr(p, ':');
        if (value == NULL || value >= end) {
            break;
        }
        after = pto_st_skip(value + 1 + strspn(value + 1, " \t\r\n"), end);
        if (after == NULL) {
            break;
        }
        if ((size_t)(p - 1 - key) == len && memcmp(key, name, len) == 0) {
            int64_t shape[3], offs[2];
            const char *dt = strstr(value, "\"dtype\"");
            int ns = pto_st_ints(value, after, "shape", shape, 3);
            size_t bytes = (size_t)(rows * cols) * (dtype == 0 ? 4 : 2);
            char want[16];
            snprintf(want, sizeof want, "\"%s\"", pto_st_dtypes[dtype]);
            if (dt == NULL || dt >= after || strstr(dt, want) == NULL || strstr(dt, want) >= after) {
                snprintf(err, n, "tensor `%s` is not %s", name, pto_st_dtypes[dtype]);
                return -1;
            }
            if (!((ns == 2 && shape[0] == rows && shape[1] == cols) || (ns == 1 && rows == 1 && shape[0] == cols))) {
                snprintf(err, n, "tensor `%s` is not %lld x %lld", name, (long long)rows, (long long)cols);
                return -1;
            }
            if (pto_st_ints(value, after, "data_offsets", offs, 2) != 2 || offs[0] < 0 || offs[1] - offs[0] != (int64_t)bytes
                || (size_t)offs[1] > f->size - 8 - f->header) {
                snprintf(err, n, "tensor `%s`: its data offsets do not fit the file", name);
                return -1;
            }
            memcpy(dst, f->bytes + 8 + f->header + offs[0], bytes);
            return 0;
        }
        p = after;
    }
    snprintf(err, n, "no tensor `%s` in the file", name);
    return -1;
}

/* `count` tensors (names, dtypes, shapes, data) as one safetensors file */
static int pto_st_write(const char *path, int count, const char *const *names, const int *dtypes,
                        const int64_t *rows, const int64_t *cols, void *const *data, char *err, size_t n)
{
    size_t cap = 64 + (size_t)count * 512, len = 1, at = 0;
    char *json = malloc(cap);
    unsigned char lenbytes[8];
    FILE *fp;
    int k, ok = 1;
    if (json == NULL) {
        snprintf(err, n, "out of memory");
        return -1;
    }
    json[0] = '{';
    for (k = 0; k < count; k++) {
        size_t bytes = (size_t)(rows[k] * cols[k]) * (dtypes[k] == 0 ? 4 : 2);
        len += (size_t)snprintf(json + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],"
                                "\"data_offsets\":[%llu,%llu]}", k ? "," : "", names[k], pto_st_dtypes[dtypes[k]],
                                (long long)rows[k], (long long)cols[k], (unsigned long long)at,
                                (unsigned long long)(at + bytes));
        at += bytes;
    }
    json[len++] = '}';
    while (len % 8) {
        json[len++] = ' ';
    }
    for (k = 0; k < 8; k++) {
        lenbytes[k] = (unsigned char)((uint64_t)len >> (8 * k));
    }
    fp = fopen(path, "wb");
    if (fp == NULL) {
        snprintf(err, n, "cannot write %s", path);
        free(json);
        return -1;
    }
    ok = fwrite(lenbytes, 1, 8, fp) == 8 && fwrite(json, 1, len, fp) == len;
    for (k = 0; k < count && ok; k++) {
        size_t bytes = (size_t)(rows[k] * cols[k]) * (dtypes[k] == 0 ? 4 : 2);
        ok = fwrite(data[k], 1, bytes, fp) == bytes;
    }
    ok = fclose(fp) == 0 && ok;
    free(json);
    if (!ok) {
        snprintf(err, n, "cannot write %s", path);
        return -1;
    }
    return 0;
}

#endif /* PTO_SAFETENSORS_H */

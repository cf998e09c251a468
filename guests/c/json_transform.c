/* JSON-ABI reactor guest: a pure input -> output transform, no WASI calls.
 *
 * Input:  {"items": [numbers...], ...}      (other keys are ignored)
 * Output: {"items": [each doubled], "sum": S, "count": N}
 *
 * ABI (see the README): alloc(len) -> ptr; run(ptr, len) -> (out_ptr << 32) | out_len.
 * The parser is deliberately small: it finds the "items" array and reads the
 * numbers in it; anything else yields {"error": "..."} as the output.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((export_name("alloc"))) void *guest_alloc(int32_t len) { return malloc(len > 0 ? (size_t)len : 1); }

static char *out;
static size_t out_len, out_cap;

static void emit(const char *s, size_t n) {
    if (out_len + n + 1 > out_cap) {
        out_cap = (out_len + n + 1) * 2;
        out = realloc(out, out_cap);
        if (!out) abort();
    }
    memcpy(out + out_len, s, n);
    out_len += n;
}

static void emit_str(const char *s) { emit(s, strlen(s)); }

static void emit_num(double v) {
    char buf[64];
    int n = snprintf(buf, sizeof buf, "%.17g", v);
    emit(buf, (size_t)n);
}

static int64_t pack(void) { return ((int64_t)(uintptr_t)out << 32) | (int64_t)out_len; }

static int64_t fail(const char *why) {
    out_len = 0;
    emit_str("{\"error\":\"");
    emit_str(why);
    emit_str("\"}");
    return pack();
}

__attribute__((export_name("run"))) int64_t run(const char *in, int32_t len) {
    char *text = malloc((size_t)len + 1);
    if (!text) return fail("out of memory");
    memcpy(text, in, (size_t)len);
    text[len] = 0;
    out_len = 0;

    char *key = strstr(text, "\"items\"");
    if (!key) return fail("input has no \"items\"");
    char *p = strchr(key + 7, '[');
    if (!p) return fail("\"items\" is not an array");
    p++;

    double sum = 0;
    long count = 0;
    emit_str("{\"items\":[");
    for (;;) {
        while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r' || *p == ',') p++;
        if (*p == ']') break;
        char *end;
        double v = strtod(p, &end);
        if (end == p) return fail("\"items\" must hold only numbers");
        if (count > 0) emit_str(",");
        emit_num(v * 2);
        sum += v;
        count++;
        p = end;
    }
    emit_str("],\"sum\":");
    emit_num(sum);
    emit_str(",\"count\":");
    emit_num((double)count);
    emit_str("}");
    free(text);
    return pack();
}

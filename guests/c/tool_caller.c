/* tool_caller: a WASI command that calls the host's tools through the
 * `execbox_tools` import module (Code Mode for WebAssembly guests; the ABI is
 * documented in src/backends/wasm/tool_import.rs).
 *
 *   tool_caller NAME [REPEAT] < args.json
 *
 * calls the tool NAME (e.g. `math.add`) REPEAT times (default 1) with the
 * JSON object on stdin as its arguments (`{}` when stdin is empty) and prints
 * each answer, a ToolResult as JSON, on a line of its own:
 *
 *   {"id":1,"ok":true,"value":5}
 *   {"id":2,"ok":false,"error":{"tool":"math.add","kind":"budget_exhausted","message":"..."}}
 *
 * `tool_caller --malformed` sends a request that is not JSON and prints what
 * `call` returned (-2). The tool's name is written into the request as is:
 * it must need no JSON escaping. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* call(ptr, len): runs the call whose JSON is at ptr; returns the answer's
 * length, or a negative number for a malformed request. */
__attribute__((import_module("execbox_tools"), import_name("call")))
extern int64_t execbox_tools_call(const char *request, int32_t len);

/* result(ptr, len): copies the last answer to ptr (at most len bytes);
 * returns the bytes copied. */
__attribute__((import_module("execbox_tools"), import_name("result")))
extern int32_t execbox_tools_result(char *answer, int32_t len);

static char *read_all(FILE *f, size_t *len) {
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    *len = n;
    return buf;
}

/* Calls `name` with `args` (JSON text) as call number `id`; prints the
 * answer. Returns 0, or 1 if the request was malformed. */
static int call_once(long id, const char *name, const char *args, size_t args_len) {
    size_t cap = args_len + strlen(name) + 64;
    char *request = malloc(cap);
    if (!request) return 1;
    int head = snprintf(request, cap, "{\"id\":%ld,\"name\":\"%s\",\"args\":", id, name);
    memcpy(request + head, args, args_len);
    request[head + args_len] = '}';
    int64_t answer_len = execbox_tools_call(request, (int32_t)(head + args_len + 1));
    free(request);
    if (answer_len < 0) {
        fprintf(stderr, "malformed request: %lld\n", (long long)answer_len);
        return 1;
    }
    char *answer = malloc((size_t)answer_len + 1);
    if (!answer) return 1;
    int32_t copied = execbox_tools_result(answer, (int32_t)answer_len);
    fwrite(answer, 1, (size_t)copied, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    free(answer);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: tool_caller NAME [REPEAT] < args.json\n");
        return 2;
    }
    if (strcmp(argv[1], "--malformed") == 0) {
        printf("%lld\n", (long long)execbox_tools_call("nope", 4));
        return 0;
    }
    long repeat = argc > 2 ? strtol(argv[2], NULL, 10) : 1;
    size_t args_len = 0;
    char *args = read_all(stdin, &args_len);
    if (!args) return 1;
    while (args_len > 0 && (args[args_len - 1] == '\n' || args[args_len - 1] == ' ')) args_len--;
    if (args_len == 0) {
        free(args);
        args = strdup("{}");
        args_len = 2;
    }
    for (long id = 1; id <= repeat; id++) {
        if (call_once(id, argv[1], args, args_len) != 0) return 1;
    }
    free(args);
    return 0;
}

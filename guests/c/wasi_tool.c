/* WASI preview-1 command guest, a small busybox for the tests and the CLI docs.
 *
 *   wasi_tool cat                  copy stdin to stdout
 *   wasi_tool args                 print each argument on its own line
 *   wasi_tool env                  print the whole environment
 *   wasi_tool ls DIR               list DIR's entries
 *   wasi_tool read PATH            print a file
 *   wasi_tool write PATH TEXT      create/overwrite a file with TEXT
 *   wasi_tool symlink TARGET LINK  create LINK pointing at TARGET (hostile: a
 *                                  link left in a grant that points out of it)
 *   wasi_tool sleep MS             sleep MS milliseconds, then print "awake"
 *   wasi_tool malloc-bomb          allocate and touch 1 MiB blocks until malloc
 *                                  fails, print how many, exit 3
 *   wasi_tool exit N               exit with status N
 *
 * Errors go to stderr with errno's text, and the exit status is 1.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

static int fail(const char *what, const char *path) {
    fprintf(stderr, "%s %s: %s\n", what, path, strerror(errno));
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: wasi_tool cat|args|env|ls|read|write|symlink|sleep|malloc-bomb|exit ...\n");
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "cat")) {
        char buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, stdin)) > 0) fwrite(buf, 1, n, stdout);
        return 0;
    }
    if (!strcmp(cmd, "args")) {
        for (int i = 2; i < argc; i++) printf("%s\n", argv[i]);
        return 0;
    }
    if (!strcmp(cmd, "env")) {
        for (char **e = environ; e && *e; e++) printf("%s\n", *e);
        return 0;
    }
    if (!strcmp(cmd, "ls") && argc == 3) {
        DIR *d = opendir(argv[2]);
        if (!d) return fail("ls", argv[2]);
        struct dirent *ent;
        while ((ent = readdir(d))) {
            if (strcmp(ent->d_name, ".") && strcmp(ent->d_name, "..")) printf("%s\n", ent->d_name);
        }
        closedir(d);
        return 0;
    }
    if (!strcmp(cmd, "read") && argc == 3) {
        FILE *f = fopen(argv[2], "rb");
        if (!f) return fail("read", argv[2]);
        char buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, stdout);
        fclose(f);
        return 0;
    }
    if (!strcmp(cmd, "write") && argc == 4) {
        FILE *f = fopen(argv[2], "wb");
        if (!f) return fail("write", argv[2]);
        if (fputs(argv[3], f) < 0 || fclose(f) != 0) return fail("write", argv[2]);
        printf("wrote %s\n", argv[2]);
        return 0;
    }
    if (!strcmp(cmd, "symlink") && argc == 4) {
        if (symlink(argv[2], argv[3]) != 0) return fail("symlink", argv[3]);
        printf("linked %s\n", argv[3]);
        return 0;
    }
    if (!strcmp(cmd, "sleep") && argc == 3) {
        usleep((useconds_t)atol(argv[2]) * 1000);
        printf("awake\n");
        return 0;
    }
    if (!strcmp(cmd, "malloc-bomb")) {
        /* Chain the blocks so the compiler cannot elide the allocations. */
        long blocks = 0;
        void **head = NULL;
        for (;;) {
            void **p = malloc(1 << 20);
            if (!p) break;
            memset(p, 1, 1 << 20);
            *p = head;
            head = p;
            blocks++;
        }
        if (head && *head == head) return 4; /* never true; keeps `head` live */
        printf("malloc failed after %ld MiB\n", blocks);
        return 3;
    }
    if (!strcmp(cmd, "exit") && argc == 3) return atoi(argv[2]);
    fprintf(stderr, "unknown command %s\n", cmd);
    return 2;
}

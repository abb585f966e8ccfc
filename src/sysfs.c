/* Owns the sysfs root and small-file reads; callers decide what the text means. */
#define _GNU_SOURCE
#include "sysfs.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char root[PATH_MAX] = "";

void sysfs_set_root(const char *r) {
    snprintf(root, sizeof(root), "%s", r ? r : "");
    size_t n = strlen(root);
    while (n > 0 && root[n - 1] == '/')
        root[--n] = 0;
}

const char *sysfs_root(void) {
    return root[0] ? root : "/";
}

static void build(char *path, size_t len, const char *fmt, va_list ap) {
    size_t n = strlen(root);
    if (n >= len) n = len - 1;
    memcpy(path, root, n);
    vsnprintf(path + n, len - n, fmt, ap);
}

int sysfs_read(char *out, size_t outlen, const char *fmt, ...) {
    char path[PATH_MAX];
    va_list ap;
    va_start(ap, fmt);
    build(path, sizeof(path), fmt, ap);
    va_end(ap);
    FILE *f = fopen(path, "re");
    if (!f) return -errno;
    if (!fgets(out, (int)outlen, f)) {
        fclose(f);
        out[0] = 0;
        return -EIO;
    }
    fclose(f);
    out[strcspn(out, "\n")] = 0;
    return 0;
}

int sysfs_read_long(long *out, const char *fmt, ...) {
    char path[PATH_MAX], buf[64], *end;
    va_list ap;
    va_start(ap, fmt);
    build(path, sizeof(path), fmt, ap);
    va_end(ap);
    FILE *f = fopen(path, "re");
    if (!f) return -errno;
    char *ok = fgets(buf, sizeof(buf), f);
    fclose(f);
    if (!ok) return -EIO;
    errno = 0;
    long v = strtol(buf, &end, 0);
    if (errno || end == buf) return -EINVAL;
    *out = v;
    return 0;
}

int sysfs_exists(const char *fmt, ...) {
    char path[PATH_MAX];
    va_list ap;
    va_start(ap, fmt);
    build(path, sizeof(path), fmt, ap);
    va_end(ap);
    return access(path, F_OK) == 0;
}

int sysfs_realpath(char *out, size_t outlen, const char *fmt, ...) {
    char path[PATH_MAX], real[PATH_MAX];
    va_list ap;
    va_start(ap, fmt);
    build(path, sizeof(path), fmt, ap);
    va_end(ap);
    if (!realpath(path, real)) return -errno;
    size_t rl = strlen(root);
    const char *rest = (rl && !strncmp(real, root, rl)) ? real + rl : real;
    snprintf(out, outlen, "%s", rest);
    return 0;
}

/*
 * Reading small sysfs files. The root is "/" except in unit tests, which point
 * it at fixture trees.
 */
#ifndef ERDMA_SYSFS_H
#define ERDMA_SYSFS_H

#include <stddef.h>

void sysfs_set_root(const char *root); /* NULL restores "/" */
const char *sysfs_root(void);
/* Reads the first line of <root>/<path> (printf-style), newline stripped. 0 or -errno. */
int sysfs_read(char *out, size_t outlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int sysfs_read_long(long *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int sysfs_exists(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* realpath of <root>/<path>, with the root prefix removed again. */
int sysfs_realpath(char *out, size_t outlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif

/* Helpers shared by the store tests: deterministic entries whose payload is a
 * function of (index, term), so any reader can tell a right entry from a
 * wrong or damaged one, and temporary directories. Header-only (static
 * functions) so each test binary stays one file plus this. */
#ifndef TK_TESTS_STORE_TESTLIB_H
#define TK_TESTS_STORE_TESTLIB_H

#include <ftw.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/blob.h"
#include "store/store.h"

static inline size_t tl_len(uint64_t index, uint64_t term)
{
    uint64_t h = index * 2654435761u + term * 40503u;
    /* Mostly small, some empty, a few bigger ones. */
    if (h % 11 == 0)
        return 0;
    if (h % 17 == 0)
        return 300 + (size_t)(h % 700);
    return (size_t)(h % 97);
}

static inline uint8_t tl_byte(uint64_t index, uint64_t term, size_t k)
{
    return (uint8_t)(index * 31 + term * 7 + k * 13 + (k >> 8));
}

static inline void tl_entry(struct raft_entry *e, uint64_t index, uint64_t term)
{
    memset(e, 0, sizeof(*e));
    e->index = index;
    e->term = term;
    e->time_ms = index * 1000 + term;
    e->type = (uint8_t)(index % 3 == 0 ? RAFT_ENTRY_NOOP : RAFT_ENTRY_NORMAL);
    size_t len = tl_len(index, term);
    if (len > 0) {
        e->data = tk_blob_new(len);
        for (size_t k = 0; k < len; k++)
            e->data->data[k] = tl_byte(index, term, k);
    }
}

/* True if `e` is exactly what tl_entry(index, e->term) makes. */
static inline bool tl_check(const struct raft_entry *e, uint64_t index)
{
    if (e->index != index || e->time_ms != index * 1000 + e->term)
        return false;
    if (e->type != (index % 3 == 0 ? RAFT_ENTRY_NOOP : RAFT_ENTRY_NORMAL))
        return false;
    size_t len = tl_len(index, e->term);
    size_t have = e->data != NULL ? e->data->len : 0;
    if (have != len)
        return false;
    for (size_t k = 0; k < len; k++)
        if (e->data->data[k] != tl_byte(index, e->term, k))
            return false;
    return true;
}

/* Entries lo..lo+n-1 of `term` into a new array; free with tl_free. */
static inline struct raft_entry *tl_batch(uint64_t lo, size_t n, uint64_t term)
{
    struct raft_entry *v = calloc(n, sizeof(*v));
    for (size_t i = 0; i < n; i++)
        tl_entry(&v[i], lo + i, term);
    return v;
}

static inline void tl_free(struct raft_entry *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        tk_blob_unref(v[i].data);
    free(v);
}

static int tl_rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static inline void tl_rmrf(const char *dir)
{
    nftw(dir, tl_rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

/* A fresh directory under $TMPDIR (or /tmp); the caller owns the string
 * (tl_tmpdir_drop removes both). */
static inline char *tl_tmpdir(const char *tag)
{
    const char *base = getenv("TMPDIR");
    char *p = malloc(4096);
    snprintf(p, 4096, "%s/tk-store-%s-XXXXXX", base ? base : "/tmp", tag);
    if (mkdtemp(p) == NULL) {
        perror("mkdtemp");
        abort();
    }
    return p;
}

/* Removes a tl_tmpdir directory with all it holds, and frees its name. */
static inline void tl_tmpdir_drop(char *dir)
{
    tl_rmrf(dir);
    free(dir);
}

#endif

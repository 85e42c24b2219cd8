/* The fs backend under damage and faults.
 *
 * Corruption: build a log over small segments, damage the files the way a
 * crash or a bad disk would, reopen, and require either recovery to exactly
 * the last valid record (a cut or zero-filled tail of the last segment) or a
 * refusal (a flipped byte in synced data, a gap in the indexes, a missing
 * segment) whose message names the file, the offset and the index where the
 * damage starts, each checked against the value the layout predicts. The
 * expected recovery point and refusal point are computed from the on-disk
 * layout (32-byte segment header, 48-byte record header, payload padded to
 * 8), so these tests know the format on purpose.
 *
 * Faults: a replacement file-operations table makes fdatasync fail with EIO,
 * pwritev fail with ENOSPC, or write only a few bytes at a time. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/err.h"
#include "base/log.h"
#include "base/prng.h"
#include "store/store.h"
#include "store_testlib.h"
#include "store_truncate.h"
#include "tests/check_run.h"

#define SEG_BYTES 8192
#define SEG_HDR 32
#define REC_HDR 48
#define N_ENTRIES 700

static uint64_t pad8(uint64_t n)
{
    return (n + 7) & ~(uint64_t)7;
}

struct layout {
    size_t nsegs;
    uint64_t first[256];
    uint64_t used[256]; /* bytes used in each segment */
    char path[256][4200];
};

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Lists segments; computes how many bytes each uses (log of term 1 entries
 * 1..last, as build() makes). */
static void scan_layout(const char *dir, uint64_t last, struct layout *L)
{
    memset(L, 0, sizeof(*L));
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strlen(de->d_name) == 24 && strstr(de->d_name, ".seg") != NULL) {
            ck_assert_uint_lt(L->nsegs, 256);
            L->first[L->nsegs++] = strtoull(de->d_name, NULL, 10);
        }
    }
    closedir(d);
    qsort(L->first, L->nsegs, sizeof(uint64_t), cmp_u64);
    for (size_t i = 0; i < L->nsegs; i++) {
        snprintf(L->path[i], sizeof(L->path[i]), "%s/%020llu.seg", dir,
                 (unsigned long long)L->first[i]);
        uint64_t end = i + 1 < L->nsegs ? L->first[i + 1] - 1 : last;
        uint64_t off = SEG_HDR;
        for (uint64_t x = L->first[i]; x <= end; x++)
            off += REC_HDR + pad8(tl_len(x, 1));
        L->used[i] = off;
    }
}

/* The last index that survives when segment `seg` keeps only its first
 * `keep` bytes intact. */
static uint64_t expected_last(const struct layout *L, size_t seg, uint64_t keep)
{
    if (keep < SEG_HDR)
        return L->first[seg] - 1;
    uint64_t off = SEG_HDR, x = L->first[seg];
    for (;;) {
        uint64_t rl = REC_HDR + pad8(tl_len(x, 1));
        if (off + rl > keep || off + rl > L->used[seg])
            return x - 1;
        off += rl;
        x++;
    }
}

static struct store *open_ok(const char *dir, const struct store_options *o,
                             struct store_boot *boot)
{
    struct store *s;
    char err[STORE_ERRMSG_MAX];
    int rc = store_open_fs(dir, o, &s, boot, err, sizeof(err));
    ck_assert_msg(rc == 0, "open %s: %s: %s", dir, tk_errname(rc), err);
    return s;
}

static void opts_small(struct store_options *o)
{
    store_options_default(o);
    o->segment_bytes = SEG_BYTES;
}

/* Opens dir with opts_small's options (boot may be NULL). */
static struct store *open_small(const char *dir, struct store_boot *boot)
{
    struct store_options o;
    opts_small(&o);
    return open_ok(dir, &o, boot);
}

/* Appends 1..n in term 1, `batch` entries per synced append. */
static void build(const char *dir, uint64_t n, size_t batch)
{
    struct store *s = open_small(dir, NULL);
    for (uint64_t lo = 1; lo <= n; lo += batch) {
        size_t k = lo + batch - 1 <= n ? batch : (size_t)(n - lo + 1);
        struct raft_entry *v = tl_batch(lo, k, 1);
        ck_assert_int_eq(store_append(s, v, k), 0);
        tl_free(v, k);
    }
    store_close(s);
}

static void copy_file(const char *from, const char *to)
{
    int in = open(from, O_RDONLY);
    ck_assert_int_ge(in, 0);
    int out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(out, 0);
    static uint8_t buf[1 << 16];
    ssize_t n;
    while ((n = read(in, buf, sizeof(buf))) > 0)
        ck_assert_int_eq(write(out, buf, (size_t)n), n);
    ck_assert_int_eq(n, 0);
    close(in);
    close(out);
}

/* Copies a store directory (segments and meta/), one level of subdirectory. */
static void copy_dir(const char *from, const char *to)
{
    DIR *d = opendir(from);
    ck_assert_ptr_nonnull(d);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        char a[4200], b[4200];
        snprintf(a, sizeof(a), "%s/%s", from, de->d_name);
        snprintf(b, sizeof(b), "%s/%s", to, de->d_name);
        struct stat st;
        ck_assert_int_eq(stat(a, &st), 0);
        if (S_ISDIR(st.st_mode)) {
            ck_assert_int_eq(mkdir(b, 0755), 0);
            copy_dir(a, b);
        } else {
            copy_file(a, b);
        }
    }
    closedir(d);
}

/* A fresh directory holding a copy of the log build(N_ENTRIES, 10) makes,
 * its layout in *L; the log is built once per test process. */
static char *template_dir;

static char *fresh_log(const char *tag, struct layout *L)
{
    if (template_dir == NULL) {
        template_dir = tl_tmpdir("template");
        build(template_dir, N_ENTRIES, 10);
    }
    char *dir = tl_tmpdir(tag);
    copy_dir(template_dir, dir);
    scan_layout(dir, N_ENTRIES, L);
    return dir;
}

static void template_teardown(void)
{
    if (template_dir != NULL) {
        tl_tmpdir_drop(template_dir);
        template_dir = NULL;
    }
}

static void verify(const char *dir, uint64_t want_last)
{
    struct store_boot boot;
    struct store *s = open_small(dir, &boot);
    ck_assert_uint_eq(boot.first_index, 1);
    ck_assert_msg(boot.last_index == want_last, "recovered to %llu, want %llu",
                  (unsigned long long)boot.last_index, (unsigned long long)want_last);
    struct raft_entry *e;
    size_t n;
    ck_assert_int_eq(store_read(s, 1, want_last + 1, 0, &e, &n), 0);
    ck_assert_uint_eq(n, want_last);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(tl_check(&e[i], i + 1), "entry %zu damaged", i + 1);
    store_entries_free(e, n);
    /* The recovered log takes appends, and they survive another reopen. */
    struct raft_entry *v = tl_batch(want_last + 1, 7, 1);
    ck_assert_int_eq(store_append(s, v, 7), 0);
    tl_free(v, 7);
    store_close(s);
    s = open_small(dir, &boot);
    ck_assert_uint_eq(boot.last_index, want_last + 7);
    ck_assert_int_eq(store_read(s, 1, want_last + 8, 0, &e, &n), 0);
    for (size_t i = 0; i < n; i++)
        ck_assert(tl_check(&e[i], i + 1));
    store_entries_free(e, n);
    store_close(s);
}

/* Where recovery must say the damage starts: the record holding byte `off`
 * of segment `seg` (offset 0 and the segment's first index for a byte of the
 * segment header), in a log of term 1 entries as build() makes. */
static void damage_at(const struct layout *L, size_t seg, uint64_t off, uint64_t *rec_off,
                      uint64_t *rec_index)
{
    ck_assert_uint_lt(off, L->used[seg]);
    *rec_off = 0;
    *rec_index = L->first[seg];
    if (off < SEG_HDR)
        return;
    uint64_t at = SEG_HDR;
    for (uint64_t x = L->first[seg];; x++) {
        uint64_t rl = REC_HDR + pad8(tl_len(x, 1));
        if (off < at + rl) {
            *rec_off = at;
            *rec_index = x;
            return;
        }
        at += rl;
    }
}

/* True if `err` holds `word` directly followed by the number `v`. */
static bool names_number(const char *err, const char *word, uint64_t v)
{
    size_t wl = strlen(word);
    for (const char *p = strstr(err, word); p != NULL; p = strstr(p + 1, word)) {
        const char *d = p + wl;
        if (*d < '0' || *d > '9')
            continue;
        char *end;
        if (strtoull(d, &end, 10) == v)
            return true;
    }
    return false;
}

#define NO_OFFSET UINT64_MAX

/* Opening `dir` must fail with TK_ECORRUPT and a message naming `file` (a
 * path or a segment name), the byte offset `off` in it (unless NO_OFFSET:
 * see the missing-first-segment case) and the log index `index` at which the
 * damage starts (issue 3: "an error naming the file, the offset and the
 * index"). The message is kept for the caller's own checks. */
static void expect_refusal(const char *dir, const char *file, uint64_t off,
                           uint64_t index, char *err, size_t err_len)
{
    struct store_options o;
    opts_small(&o);
    struct store *s = NULL;
    err[0] = '\0';
    int rc = store_open_fs(dir, &o, &s, NULL, err, err_len);
    ck_assert_msg(rc == TK_ECORRUPT, "open gave %s (%s), want TK_ECORRUPT",
                  tk_errname(rc), err);
    printf("refused as expected: %s\n", err);
    ck_assert_msg(strstr(err, file) != NULL, "error \"%s\" does not name %s", err, file);
    if (off != NO_OFFSET)
        ck_assert_msg(names_number(err, "offset ", off),
                      "error \"%s\" does not name offset %llu", err,
                      (unsigned long long)off);
    ck_assert_msg(names_number(err, "index ", index),
                  "error \"%s\" does not name index %llu", err,
                  (unsigned long long)index);
}

/* expect_refusal, then the directory goes. */
static void refused_then_drop(char *dir, const char *file, uint64_t off, uint64_t index)
{
    char err[STORE_ERRMSG_MAX];
    expect_refusal(dir, file, off, index, err, sizeof(err));
    tl_tmpdir_drop(dir);
}

static void write_at(const char *path, uint64_t off, const void *buf, size_t len)
{
    int fd = open(path, O_WRONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pwrite(fd, buf, len, (off_t)off), (ssize_t)len);
    close(fd);
}

static const char *base_name(const char *path)
{
    const char *b = strrchr(path, '/');
    return b ? b + 1 : path;
}

START_TEST(test_cut_last_segment_recovers_to_last_whole_record)
{
    struct tk_prng p;
    tk_prng_seed(&p, 42);
    for (int iter = 0; iter < 16; iter++) {
        struct layout L;
        char *dir = fresh_log("cut", &L);
        ck_assert_uint_ge(L.nsegs, 3);
        size_t last = L.nsegs - 1;
        uint64_t cut = iter == 0   ? L.used[last]
                       : iter == 1 ? 0
                                   : tk_prng_below(&p, L.used[last] + 1);
        ck_assert_int_eq(truncate(L.path[last], (off_t)cut), 0);
        verify(dir, expected_last(&L, last, cut));
        tl_tmpdir_drop(dir);
    }
}
END_TEST

START_TEST(test_zero_filled_tail_recovers_to_last_whole_record)
{
    struct tk_prng p;
    tk_prng_seed(&p, 7);
    static uint8_t z[SEG_BYTES];
    for (int iter = 0; iter < 16; iter++) {
        struct layout L;
        char *dir = fresh_log("zero", &L);
        size_t last = L.nsegs - 1;
        uint64_t from = tk_prng_below(&p, L.used[last]);
        write_at(L.path[last], from, z, L.used[last] - from);
        verify(dir, expected_last(&L, last, from));
        tl_tmpdir_drop(dir);
    }
}
END_TEST

START_TEST(test_garbage_after_tail_is_dropped)
{
    struct layout L;
    char *dir = fresh_log("garbage", &L);
    size_t last = L.nsegs - 1;
    uint8_t junk[300];
    struct tk_prng p;
    tk_prng_seed(&p, 3);
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (uint8_t)tk_prng_next(&p);
    write_at(L.path[last], L.used[last], junk, sizeof(junk));
    verify(dir, N_ENTRIES);
    tl_tmpdir_drop(dir);
}
END_TEST

START_TEST(test_flipped_byte_in_sealed_segment_refuses_naming_it)
{
    struct tk_prng p;
    tk_prng_seed(&p, 99);
    for (int iter = 0; iter < 12; iter++) {
        struct layout L;
        char *dir = fresh_log("flip", &L);
        size_t seg = tk_prng_below(&p, L.nsegs - 1); /* not the last */
        uint64_t off = tk_prng_below(&p, L.used[seg]);
        int fd = open(L.path[seg], O_RDWR);
        uint8_t b;
        ck_assert_int_eq(pread(fd, &b, 1, (off_t)off), 1);
        b ^= (uint8_t)(1u << tk_prng_below(&p, 8));
        ck_assert_int_eq(pwrite(fd, &b, 1, (off_t)off), 1);
        close(fd);
        uint64_t rec_off, rec_index;
        damage_at(&L, seg, off, &rec_off, &rec_index);
        refused_then_drop(dir, L.path[seg], rec_off, rec_index);
    }
}
END_TEST

START_TEST(test_flipped_byte_before_synced_records_in_last_segment_refuses)
{
    char *dir = tl_tmpdir("flip-last");
    /* One big segment: everything is in the last one. */
    struct store_options o;
    store_options_default(&o);
    o.segment_bytes = 1 << 20;
    struct store *s = open_ok(dir, &o, NULL);
    for (uint64_t lo = 1; lo <= 200; lo += 10) {
        struct raft_entry *v = tl_batch(lo, 10, 1);
        ck_assert_int_eq(store_append(s, v, 10), 0);
        tl_free(v, 10);
    }
    store_close(s);
    struct layout L;
    scan_layout(dir, 200, &L);
    ck_assert_uint_eq(L.nsegs, 1);
    size_t last = L.nsegs - 1;
    /* A byte in the payload area of the first record of the last segment;
     * later batches in that segment were written after it was synced. */
    uint64_t off = SEG_HDR + 20;
    uint8_t b = 0x5a;
    write_at(L.path[last], off, &b, 1);
    refused_then_drop(dir, L.path[last], SEG_HDR, 1);
}
END_TEST

/* A gap in the indexes: a record in a sealed segment that is whole (its CRC
 * holds) but carries the index after the one due there. */
START_TEST(test_index_gap_in_sealed_segment_refuses_naming_it)
{
    struct layout L;
    char *dir = fresh_log("gap", &L);
    ck_assert_uint_ge(L.nsegs, 3);
    size_t seg = L.nsegs / 2;
    /* The third record of the segment. */
    uint64_t x = L.first[seg], off = SEG_HDR;
    for (int i = 0; i < 2; i++, x++)
        off += REC_HDR + pad8(tl_len(x, 1));
    ck_assert_uint_lt(off, L.used[seg]);

    uint8_t rec[REC_HDR + 1024];
    uint64_t rl = REC_HDR + pad8(tl_len(x, 1));
    ck_assert_uint_le(rl, sizeof(rec));
    int fd = open(L.path[seg], O_RDWR);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pread(fd, rec, rl, (off_t)off), (ssize_t)rl);
    uint64_t idx = 0;
    for (int i = 7; i >= 0; i--)
        idx = (idx << 8) | rec[8 + i];
    ck_assert_uint_eq(idx, x);
    for (int i = 0; i < 8; i++)
        rec[8 + i] = (uint8_t)((x + 1) >> (8 * i)); /* little-endian */
    uint32_t len = (uint32_t)rec[4] | (uint32_t)rec[5] << 8 | (uint32_t)rec[6] << 16 |
                   (uint32_t)rec[7] << 24;
    ck_assert_uint_eq(len, tl_len(x, 1));
    uint32_t crc = tk_crc32c(0, rec + 4, REC_HDR - 4);
    crc = tk_crc32c(crc, rec + REC_HDR, len);
    for (int i = 0; i < 4; i++)
        rec[i] = (uint8_t)(crc >> (8 * i));
    ck_assert_int_eq(pwrite(fd, rec, rl, (off_t)off), (ssize_t)rl);
    close(fd);

    refused_then_drop(dir, L.path[seg], off, x);
}
END_TEST

START_TEST(test_missing_middle_segment_refuses)
{
    struct layout L;
    char *dir = fresh_log("missing", &L);
    ck_assert_uint_ge(L.nsegs, 4);
    size_t mid = L.nsegs / 2;
    ck_assert_int_eq(unlink(L.path[mid]), 0);
    /* The log breaks off at the end of the segment before the hole, where
     * the missing segment's first index was due; the message also names the
     * segment after the hole, whose records prove the lost ones were synced.
     * The missing file's own name is not in it (its index is). */
    char err[STORE_ERRMSG_MAX];
    expect_refusal(dir, L.path[mid - 1], L.used[mid - 1], L.first[mid], err, sizeof(err));
    ck_assert_ptr_nonnull(strstr(err, base_name(L.path[mid + 1])));
    tl_tmpdir_drop(dir);
}
END_TEST

START_TEST(test_missing_first_segment_refuses)
{
    struct layout L;
    char *dir = fresh_log("missing-first", &L);
    ck_assert_int_eq(unlink(L.path[0]), 0);
    /* The message names the directory, the index the log should start at and
     * the first segment present; it has no offset (nor the missing file's
     * name). */
    char err[STORE_ERRMSG_MAX];
    expect_refusal(dir, dir, NO_OFFSET, L.first[0], err, sizeof(err));
    ck_assert_ptr_nonnull(strstr(err, "missing segment"));
    ck_assert_ptr_nonnull(strstr(err, base_name(L.path[1])));
    tl_tmpdir_drop(dir);
}
END_TEST

/* ---- fault injection ---------------------------------------------------- */

static struct {
    pthread_mutex_t mu;
    int fail_fdatasync; /* errno to return, or 0 */
    int fail_pwritev;
    unsigned emfile_opens; /* this many opens fail with EMFILE */
    unsigned open_calls;
    size_t short_write; /* if > 0: write at most this many bytes per call */
    unsigned fdatasync_calls;
    unsigned pwritev_calls;
    uint64_t pwritev_bytes; /* bytes the pwritev calls wrote */
} F = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Sets one field of F under its lock. */
#define FAULT_SET(field, value)                                                          \
    do {                                                                                 \
        pthread_mutex_lock(&F.mu);                                                       \
        F.field = (value);                                                               \
        pthread_mutex_unlock(&F.mu);                                                     \
    } while (0)

static int f_fdatasync(int fd)
{
    pthread_mutex_lock(&F.mu);
    F.fdatasync_calls++;
    int e = F.fail_fdatasync;
    pthread_mutex_unlock(&F.mu);
    if (e != 0) {
        errno = e;
        return -1;
    }
    return store_fileops_default()->fdatasync(fd);
}

static ssize_t f_pwritev(int fd, const struct iovec *iov, int n, off_t off)
{
    pthread_mutex_lock(&F.mu);
    F.pwritev_calls++;
    int e = F.fail_pwritev;
    size_t sw = F.short_write;
    pthread_mutex_unlock(&F.mu);
    if (e != 0) {
        errno = e;
        return -1;
    }
    ssize_t w;
    if (sw > 0 && n > 0) {
        size_t len = iov[0].iov_len < sw ? iov[0].iov_len : sw;
        w = pwrite(fd, iov[0].iov_base, len, off);
    } else {
        w = store_fileops_default()->pwritev(fd, iov, n, off);
    }
    if (w > 0) {
        pthread_mutex_lock(&F.mu);
        F.pwritev_bytes += (uint64_t)w;
        pthread_mutex_unlock(&F.mu);
    }
    return w;
}

static int f_open(const char *path, int flags, mode_t mode)
{
    pthread_mutex_lock(&F.mu);
    F.open_calls++;
    bool fail = F.emfile_opens > 0;
    if (fail)
        F.emfile_opens--;
    pthread_mutex_unlock(&F.mu);
    if (fail) {
        errno = EMFILE;
        return -1;
    }
    return store_fileops_default()->open(path, flags, mode);
}

static struct store_fileops faulty;

static void never_called(void *data, uint64_t seq, uint64_t last_index,
                         uint64_t last_term, int status)
{
    (void)data;
    (void)seq;
    (void)last_index;
    (void)last_term;
    (void)status;
    ck_abort_msg("a refused async append must not complete");
}

static void faults_reset(void)
{
    pthread_mutex_lock(&F.mu);
    F.fail_fdatasync = 0;
    F.fail_pwritev = 0;
    F.short_write = 0;
    F.fdatasync_calls = 0;
    F.pwritev_calls = 0;
    F.pwritev_bytes = 0;
    pthread_mutex_unlock(&F.mu);
    faulty = *store_fileops_default();
    faulty.fdatasync = f_fdatasync;
    faulty.pwritev = f_pwritev;
    faulty.open = f_open;
    F.emfile_opens = 0;
    F.open_calls = 0;
}

static struct store *open_faulty(const char *dir)
{
    struct store_options o;
    opts_small(&o);
    o.fileops = &faulty;
    return open_ok(dir, &o, NULL);
}

/* A fresh directory (*dir, tl_tmpdir's) opened with the faulty file ops and
 * no fault set. */
static struct store *open_faulty_fresh(const char *tag, char **dir)
{
    faults_reset();
    *dir = tl_tmpdir(tag);
    return open_faulty(*dir);
}

static void append_ok(struct store *s, uint64_t lo, size_t n)
{
    struct raft_entry *v = tl_batch(lo, n, 1);
    int rc = store_append(s, v, n);
    ck_assert_msg(rc == 0, "append: %s: %s", tk_errname(rc), store_errmsg(s));
    tl_free(v, n);
}

START_TEST(test_eio_on_fdatasync_fails_the_store_without_retry)
{
    char *dir;
    struct store *s = open_faulty_fresh("eio", &dir);
    append_ok(s, 1, 20);
    FAULT_SET(fail_fdatasync, EIO);
    struct raft_entry *v = tl_batch(21, 5, 1);
    ck_assert_int_eq(store_append(s, v, 5), TK_EIO);
    ck_assert_int_eq(store_failed(s), TK_EIO);
    ck_assert_ptr_nonnull(strstr(store_errmsg(s), "fdatasync"));
    unsigned calls = F.fdatasync_calls;
    /* Healing the disk changes nothing: the store stays failed. */
    FAULT_SET(fail_fdatasync, 0);
    ck_assert_int_eq(store_append(s, v, 5), TK_EIO);
    ck_assert_int_eq(store_append_async(s, v, 5, 1, NULL, never_called), TK_EIO);
    struct raft_hard_state hs = {.term = 3, .vote = 1};
    ck_assert_int_eq(store_save_hard_state(s, &hs), TK_EIO);
    ck_assert_int_eq(tl_truncate(s, 10), TK_EIO);
    ck_assert_uint_eq(F.fdatasync_calls, calls); /* never retried */
    tl_free(v, 5);
    store_close(s);
    /* What was acknowledged before the failure is intact. */
    struct store_boot boot;
    s = open_small(dir, &boot);
    ck_assert_uint_ge(boot.last_index, 20);
    ck_assert_uint_eq(boot.hard_state.term, 0);
    struct raft_entry *e;
    size_t n;
    ck_assert_int_eq(store_read(s, 1, 21, 0, &e, &n), 0);
    for (size_t i = 0; i < n; i++)
        ck_assert(tl_check(&e[i], i + 1));
    store_entries_free(e, n);
    store_close(s);
    tl_tmpdir_drop(dir);
}
END_TEST

struct async_result {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    int status[64];
};

static void on_done(void *data, uint64_t seq, uint64_t last_index, uint64_t last_term,
                    int status)
{
    struct async_result *r = data;
    (void)last_index;
    (void)last_term;
    pthread_mutex_lock(&r->mu);
    r->status[seq] = status;
    r->done++;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

START_TEST(test_eio_in_async_group_fails_every_pending_append)
{
    char *dir;
    struct store *s = open_faulty_fresh("eio-async", &dir);
    append_ok(s, 1, 3);
    FAULT_SET(fail_fdatasync, EIO);
    struct async_result r = {.mu = PTHREAD_MUTEX_INITIALIZER,
                             .cv = PTHREAD_COND_INITIALIZER};
    int submitted = 0;
    for (int i = 0; i < 10; i++) {
        struct raft_entry *v = tl_batch(4 + (uint64_t)i * 2, 2, 1);
        int rc = store_append_async(s, v, 2, (uint64_t)i, &r, on_done);
        tl_free(v, 2);
        if (rc != 0) {
            ck_assert_int_eq(rc, TK_EIO); /* the store already failed */
            break;
        }
        submitted++;
    }
    pthread_mutex_lock(&r.mu);
    while (r.done < submitted)
        pthread_cond_wait(&r.cv, &r.mu);
    pthread_mutex_unlock(&r.mu);
    for (int i = 0; i < submitted; i++)
        ck_assert_int_eq(r.status[i], TK_EIO);
    ck_assert_int_eq(store_failed(s), TK_EIO);
    store_close(s);
    tl_tmpdir_drop(dir);
}
END_TEST

START_TEST(test_enospc_on_write_fails_the_store)
{
    char *dir;
    struct store *s = open_faulty_fresh("enospc", &dir);
    append_ok(s, 1, 10);
    FAULT_SET(fail_pwritev, ENOSPC);
    struct raft_entry *v = tl_batch(11, 5, 1);
    ck_assert_int_eq(store_append(s, v, 5), TK_ENOSPC);
    ck_assert_int_eq(store_failed(s), TK_ENOSPC);
    FAULT_SET(fail_pwritev, 0);
    ck_assert_int_eq(store_append(s, v, 5), TK_ENOSPC);
    tl_free(v, 5);
    store_close(s);
    struct store_boot boot;
    s = open_small(dir, &boot);
    ck_assert_uint_eq(boot.last_index, 10);
    store_close(s);
    tl_tmpdir_drop(dir);
}
END_TEST

START_TEST(test_short_writes_are_completed)
{
    faults_reset();
    FAULT_SET(short_write, 5);
    char *dir = tl_tmpdir("short");
    struct store *s = open_faulty(dir);
    for (uint64_t lo = 1; lo <= 300; lo += 30)
        append_ok(s, lo, 30);
    ck_assert_uint_gt(F.pwritev_calls, 300); /* the writes really were cut */
    append_ok(s, 250, 10); /* a truncation, zero-filled in short writes too */
    store_close(s);
    faults_reset();
    verify(dir, 259);
    tl_tmpdir_drop(dir);
}
END_TEST

/* Issue 19: running out of descriptors (EMFILE) when a segment is created
 * is a transient shortage, not a disk failure: the writer waits for one and
 * the store never fails. */
START_TEST(test_emfile_at_segment_creation_is_waited_out_not_fatal)
{
    char *dir;
    struct store *s = open_faulty_fresh("emfile", &dir);
    append_ok(s, 1, 10);
    pthread_mutex_lock(&F.mu);
    F.emfile_opens = 8; /* the spare prepared ahead, then the roll's tries */
    F.open_calls = 0;
    pthread_mutex_unlock(&F.mu);
    for (uint64_t lo = 11; lo < 11 + 40 * 10; lo += 10)
        append_ok(s, lo, 10);
    ck_assert_int_eq(store_failed(s), 0);
    ck_assert_uint_ge(F.open_calls, 9); /* it did roll into the shortage */
    ck_assert_uint_eq(F.emfile_opens, 0);
    store_close(s);
    struct store_boot boot;
    s = open_small(dir, &boot);
    ck_assert_uint_eq(boot.last_index, 410);
    store_close(s);
    tl_tmpdir_drop(dir);
}
END_TEST

/* Zero-ahead (fs.c, zero_ahead): a small write also writes zeros up to
 * 256 KiB past its end, in the same pwritev, so that the next small writes
 * land on blocks already written and their syncs change no extent; the
 * writes that follow add no zeros until the zeroed space runs low. A write
 * of 64 KiB or more writes its records only. Counted at the pwritev
 * boundary against the log's own bytes. */
static uint64_t pwritev_bytes(void)
{
    pthread_mutex_lock(&F.mu);
    uint64_t b = F.pwritev_bytes;
    pthread_mutex_unlock(&F.mu);
    return b;
}

static uint64_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* Appends batches of 1000 after `*last` until the directory holds `want`
 * segments. */
static void append_until_segs(struct store *s, const char *dir, uint64_t *last,
                              size_t want, struct layout *L)
{
    for (;;) {
        scan_layout(dir, *last, L);
        if (L->nsegs >= want)
            return;
        ck_assert_uint_lt(*last, 200000);
        append_ok(s, *last + 1, 1000);
        *last += 1000;
    }
}

START_TEST(test_segments_start_small_and_double)
{
    char *dir = tl_tmpdir("grow");
    struct store_options o;
    store_options_default(&o); /* segments of at most 64 MiB */
    struct store *s = open_ok(dir, &o, NULL);
    append_ok(s, 1, 10);
    struct layout L;
    scan_layout(dir, 10, &L);
    ck_assert_uint_eq(L.nsegs, 1);
    ck_assert_uint_eq(file_size(L.path[0]), STORE_SEGMENT_BYTES_FIRST);
    uint64_t last = 10;
    append_until_segs(s, dir, &last, 2, &L);
    for (size_t i = 0; i < 2; i++)
        ck_assert_uint_eq(file_size(L.path[i]), (uint64_t)STORE_SEGMENT_BYTES_FIRST << i);
    store_close(s);
    /* Recovery takes each segment's size from its file, and the next one
     * doubles the last. */
    struct store_boot boot;
    s = open_ok(dir, &o, &boot);
    ck_assert_uint_eq(boot.last_index, last);
    append_until_segs(s, dir, &last, 3, &L);
    ck_assert_uint_eq(file_size(L.path[2]), (uint64_t)STORE_SEGMENT_BYTES_FIRST << 2);
    struct raft_entry *e;
    size_t n;
    ck_assert_int_eq(store_read(s, 1, last + 1, 0, &e, &n), 0);
    ck_assert_uint_eq(n, last);
    for (size_t i = 0; i < n; i++)
        ck_assert(tl_check(&e[i], i + 1));
    store_entries_free(e, n);
    store_close(s);
    tl_tmpdir_drop(dir);

    /* A record larger than the next size gets a full segment. */
    dir = tl_tmpdir("grow-big");
    s = open_ok(dir, &o, NULL);
    append_ok(s, 1, 1);
    struct raft_entry big;
    memset(&big, 0, sizeof(big));
    big.index = 2;
    big.term = 1;
    big.type = RAFT_ENTRY_NORMAL;
    big.data = tk_blob_new(10u << 20);
    memset(big.data->data, 0x5a, big.data->len);
    ck_assert_int_eq(store_append(s, &big, 1), 0);
    tk_blob_unref(big.data);
    scan_layout(dir, 1, &L);
    ck_assert_uint_eq(L.nsegs, 2);
    ck_assert_uint_eq(file_size(L.path[1]), STORE_SEGMENT_BYTES_DEFAULT);
    store_close(s);
    s = open_ok(dir, &o, &boot);
    ck_assert_uint_eq(boot.last_index, 2);
    ck_assert_int_eq(store_read(s, 2, 3, 0, &e, &n), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(e[0].data->len, 10u << 20);
    ck_assert_uint_eq(e[0].data->data[(10u << 20) - 1], 0x5a);
    store_entries_free(e, n);
    store_close(s);
    tl_tmpdir_drop(dir);
}
END_TEST

START_TEST(test_small_writes_zero_ahead_and_large_writes_do_not)
{
    faults_reset();
    char *dir = tl_tmpdir("zero-ahead");
    struct store_options o;
    store_options_default(&o);
    o.segment_bytes = 4u << 20;
    o.fileops = &faulty;
    struct store *s = open_ok(dir, &o, NULL);
    append_ok(s, 1, 1);
    uint64_t zeros = pwritev_bytes() - store_log_bytes(s);
    ck_assert_uint_ge(zeros, 200u << 10);
    ck_assert_uint_le(zeros, (256u << 10) + 4096);
    uint64_t before = pwritev_bytes(), log_before = store_log_bytes(s);
    for (uint64_t i = 2; i <= 21; i++)
        append_ok(s, i, 1);
    ck_assert_uint_eq(pwritev_bytes() - before, store_log_bytes(s) - log_before);
    store_close(s);
    /* Recovery reads the zeros ahead as the end of the log. */
    struct store_boot boot;
    s = open_ok(dir, &o, &boot);
    ck_assert_uint_eq(boot.last_index, 21);
    store_close(s);
    tl_tmpdir_drop(dir);

    faults_reset();
    dir = tl_tmpdir("zero-ahead-large");
    s = open_ok(dir, &o, NULL);
    append_ok(s, 1, 2000); /* well over 64 KiB of records */
    ck_assert_uint_ge(store_log_bytes(s), 64u << 10);
    ck_assert_uint_eq(pwritev_bytes(), store_log_bytes(s));
    store_close(s);
    s = open_ok(dir, &o, &boot);
    ck_assert_uint_eq(boot.last_index, 2000);
    store_close(s);
    tl_tmpdir_drop(dir);
}
END_TEST

static bool file_exists(const char *dir, const char *name)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    struct stat st;
    return stat(path, &st) == 0;
}

static size_t count_segs(const char *dir)
{
    struct layout L;
    scan_layout(dir, 0, &L);
    return L.nsegs;
}

START_TEST(test_spare_segment_is_prepared_ahead)
{
    char *dir = tl_tmpdir("spare");
    struct store *s = open_small(dir, NULL);
    char path[4200];
    snprintf(path, sizeof(path), "%s/segment.prepare", dir);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(st.st_size, SEG_BYTES);
    append_ok(s, 1, 1); /* takes the spare */
    /* The next one waits until the segment is three quarters full (a
     * compaction may recycle one before), and comes before it is full. */
    ck_assert(!file_exists(dir, "segment.prepare"));
    uint64_t x = 2;
    while (!file_exists(dir, "segment.prepare")) {
        ck_assert_msg(count_segs(dir) == 1, "rolled at %llu before a spare was prepared",
                      (unsigned long long)x);
        append_ok(s, x++, 1);
    }
    ck_assert_uint_ge(store_log_bytes(s), SEG_BYTES / 4 * 3);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(st.st_size, SEG_BYTES);
    store_close(s);
    tl_tmpdir_drop(dir);
}
END_TEST

/* Where and how an append completed (store_append_now_if_idle). */
struct where {
    pthread_mutex_t mu;
    pthread_t thread;
    int calls;
    int status;
};

static void on_where(void *data, uint64_t seq, uint64_t last_index, uint64_t last_term,
                     int status)
{
    struct where *w = data;
    (void)seq;
    (void)last_index;
    (void)last_term;
    pthread_mutex_lock(&w->mu);
    w->thread = pthread_self();
    w->calls++;
    w->status = status;
    pthread_mutex_unlock(&w->mu);
}

/* store_append_now_if_idle on an idle store whose last sync was fast enough:
 * the batch is durable and its callback has run, on the caller's thread, when
 * the call returns; the storage thread still prepares the spare segment
 * ahead. With a bound no sync meets (0), the batch goes to the storage
 * thread. */
START_TEST(test_append_now_if_idle_syncs_on_the_caller)
{
    char *dir = tl_tmpdir("now");
    struct store *s = open_small(dir, NULL);
    struct where w = {.mu = PTHREAD_MUTEX_INITIALIZER};
    uint64_t x = 1;
    while (store_log_bytes(s) < SEG_BYTES / 4 * 3) {
        struct raft_entry *v = tl_batch(x, 1, 1);
        int rc = store_append_now_if_idle(s, v, 1, x, &w, on_where, UINT64_MAX);
        tl_free(v, 1);
        ck_assert_msg(rc == 0, "append %llu: %s", (unsigned long long)x, tk_errname(rc));
        pthread_mutex_lock(&w.mu);
        ck_assert_msg(w.calls == (int)x, "append %llu: %d callbacks at the return",
                      (unsigned long long)x, w.calls);
        ck_assert(pthread_equal(w.thread, pthread_self()));
        ck_assert_int_eq(w.status, 0);
        pthread_mutex_unlock(&w.mu);
        x++;
    }
    for (int t = 0; t < 2000 && !file_exists(dir, "segment.prepare"); t++)
        usleep(5000);
    ck_assert_msg(file_exists(dir, "segment.prepare"),
                  "no spare segment 10 s after %llu appends on the caller",
                  (unsigned long long)(x - 1));
    ck_assert_uint_eq(count_segs(dir), 1);

    struct raft_entry *v = tl_batch(x, 1, 1);
    ck_assert_int_eq(store_append_now_if_idle(s, v, 1, x, &w, on_where, 0), 0);
    tl_free(v, 1);
    int calls = 0;
    for (int t = 0; t < 2000 && calls < (int)x; t++) {
        pthread_mutex_lock(&w.mu);
        calls = w.calls;
        pthread_mutex_unlock(&w.mu);
        if (calls < (int)x)
            usleep(5000);
    }
    ck_assert_int_eq(calls, (int)x);
    ck_assert_msg(!pthread_equal(w.thread, pthread_self()),
                  "bound 0: the append completed on the caller");
    ck_assert_int_eq(w.status, 0);
    store_close(s);
    struct store_boot boot;
    s = open_small(dir, &boot);
    ck_assert_uint_eq(boot.last_index, x);
    store_close(s);
    tl_tmpdir_drop(dir);
}
END_TEST

/* Whether the file system under `dir` zeroes a range in place. */
static bool zero_range_works(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/probe", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    bool ok = ftruncate(fd, 8192) == 0 &&
              fallocate(fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, 0, 8192) == 0;
    close(fd);
    unlink(path);
    return ok;
}

/* A compaction keeps a segment it frees as the spare when there is none (its
 * range zeroed, not its blocks freed: no discard holding every sync on the
 * device); the log then rolls into it, and recovery finds only the new
 * records in it, not the old ones it held. Where the file system cannot zero
 * a range (tmpfs), the segment is deleted as before. */
START_TEST(test_compaction_recycles_a_segment_as_the_spare)
{
    char *dir = tl_tmpdir("recycle");
    bool zr = zero_range_works(dir);
    if (!zr) { /* try the disk the build is on */
        tl_rmrf(dir);
        snprintf(dir, 4096, "./tk-store-recycle-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(dir));
        zr = zero_range_works(dir);
    }
    struct store *s = open_small(dir, NULL);
    /* Three segments, the last just rolled into (no spare yet). */
    uint64_t x = 1;
    while (count_segs(dir) < 3 || file_exists(dir, "segment.prepare"))
        append_ok(s, x++, 1);
    uint64_t last = x - 1;
    struct layout L;
    scan_layout(dir, last, &L);
    struct store_stats st0, st1;
    store_stats(s, &st0);
    ck_assert_int_eq(store_compact(s, L.first[1] - 1), 0); /* the first segment goes */
    store_stats(s, &st1);
    ck_assert_uint_eq(count_segs(dir), 2);
    ck_assert(!file_exists(dir, L.path[0] + strlen(dir) + 1));
    if (!zr) {
        ck_assert_uint_eq(st1.recycled, st0.recycled);
        ck_assert(!file_exists(dir, "segment.prepare"));
    } else {
        ck_assert_uint_eq(st1.recycled, st0.recycled + 1);
        char path[4200];
        snprintf(path, sizeof(path), "%s/segment.prepare", dir);
        int fd = open(path, O_RDONLY);
        ck_assert_int_ge(fd, 0);
        static uint8_t buf[SEG_BYTES];
        ck_assert_int_eq(pread(fd, buf, sizeof(buf), 0), SEG_BYTES);
        close(fd);
        for (size_t i = 0; i < sizeof(buf); i++)
            ck_assert_msg(buf[i] == 0, "the recycled spare holds byte %zu = %u", i,
                          buf[i]);
    }
    /* Roll into it, a few records only, and recover. */
    size_t segs = count_segs(dir);
    while (count_segs(dir) == segs)
        append_ok(s, x++, 1);
    append_ok(s, x, 2);
    last = x + 1;
    store_close(s);
    struct store_boot boot;
    s = open_small(dir, &boot);
    ck_assert_uint_eq(boot.first_index, L.first[1]);
    ck_assert_uint_eq(boot.last_index, last);
    struct raft_entry *e;
    size_t n;
    ck_assert_int_eq(store_read(s, L.first[1], last + 1, 0, &e, &n), 0);
    ck_assert_uint_eq(n, last - L.first[1] + 1);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(tl_check(&e[i], L.first[1] + i), "entry %llu damaged",
                      (unsigned long long)(L.first[1] + i));
    store_entries_free(e, n);
    store_close(s);
    tl_tmpdir_drop(dir);
}
END_TEST

static Suite *fs_suite(void)
{
    Suite *s = suite_create("store-fs");
    TCase *tc = tcase_create("corruption");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, NULL, template_teardown);
    tcase_add_test(tc, test_cut_last_segment_recovers_to_last_whole_record);
    tcase_add_test(tc, test_zero_filled_tail_recovers_to_last_whole_record);
    tcase_add_test(tc, test_garbage_after_tail_is_dropped);
    tcase_add_test(tc, test_flipped_byte_in_sealed_segment_refuses_naming_it);
    tcase_add_test(tc, test_flipped_byte_before_synced_records_in_last_segment_refuses);
    tcase_add_test(tc, test_index_gap_in_sealed_segment_refuses_naming_it);
    tcase_add_test(tc, test_missing_middle_segment_refuses);
    tcase_add_test(tc, test_missing_first_segment_refuses);
    suite_add_tcase(s, tc);
    tc = tcase_create("faults");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_eio_on_fdatasync_fails_the_store_without_retry);
    tcase_add_test(tc, test_eio_in_async_group_fails_every_pending_append);
    tcase_add_test(tc, test_enospc_on_write_fails_the_store);
    tcase_add_test(tc, test_short_writes_are_completed);
    tcase_add_test(tc, test_spare_segment_is_prepared_ahead);
    tcase_add_test(tc, test_append_now_if_idle_syncs_on_the_caller);
    tcase_add_test(tc, test_compaction_recycles_a_segment_as_the_spare);
    tcase_add_test(tc, test_small_writes_zero_ahead_and_large_writes_do_not);
    tcase_add_test(tc, test_segments_start_small_and_double);
    tcase_add_test(tc, test_emfile_at_segment_creation_is_waited_out_not_fatal);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    tk_log_set_level(TK_LOG_ERROR); /* torn-tail warnings are expected */
    return tk_check_run(srunner_create(fs_suite()));
}

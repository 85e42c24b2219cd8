/* The fs backend: the Raft log in segment files, metadata in LMDB (meta.c).
 *
 * Layout of a store directory:
 *   meta/                     the LMDB environment (term, vote, ids, config,
 *                             snapshot descriptor, log start)
 *   <first index, %020>.seg   segment files, each preallocated to its size
 *   segment.prepare           the next segment, created and preallocated
 *                             ahead of need (renamed when the log rolls)
 *
 * Sizes: the first segment of a log is STORE_SEGMENT_BYTES_FIRST (4 MiB, or
 * segment_bytes when that is smaller) and each next one twice the last, up
 * to segment_bytes: a new node's directory holds about 4-8 MiB of log files,
 * not two full segments (128 MiB at the default), and a busy log reaches full
 * segments after 60 MiB. A record too large for the next size gets a full
 * segment. A segment's size is its file's (recovery takes it from fstat).
 *
 * A segment starts with a 32-byte header (magic, first index, version, CRC)
 * and holds records at 8-byte aligned offsets:
 *   [crc32c u32][len u32][index u64][term u64][time_ms u64][synced u64]
 *   [type u8][7 zero bytes][payload, zero-padded to 8]
 * The CRC covers bytes 4..48 of the header and the payload. `synced` is the
 * highest index that was durable when the record was written: recovery uses
 * it to tell a torn, never-acknowledged tail (truncated) from damage to data
 * that had been synced and maybe acknowledged (refused, loudly). The limit
 * of that test: damage confined to the last group written before a crash
 * looks exactly like a torn write of that group and is truncated (with a
 * warning naming file, offset and index), as in every write-ahead log.
 *
 * In memory each segment has a dense array of record offsets, so index ->
 * (segment, offset) is a binary search over segments (few) plus an array
 * lookup; terms are kept as runs (first index, term), so term_at needs no I/O.
 *
 * Writes: the records of a group are staged (copied, CRC computed as they
 * are copied, see STAGE_BYTES) and written with one pwritev per segment
 * touched (more only past STAGE_BYTES of small records, STAGE_RECS records
 * or STAGE_IOV large payloads), then every dirty segment gets one fdatasync (and the
 * directory an fsync if a segment was created, renamed or deleted). A small
 * write also writes zeros ahead of the log's end (zero_ahead()), so that
 * most syncs write data and no metadata. The in-memory index publishes a
 * record only after its pwritev returned.
 * Truncation zero-fills the discarded bytes and syncs before anything new is
 * written, so a discarded record can never come back after a crash.
 *
 * Locking: f->mu guards the segment array, offsets, runs and bounds; readers
 * hold it across their pread, the writer takes it only to publish. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/crc32c.h"
#include "base/dir.h"
#include "base/err.h"
#include "base/log.h"
#include "store/store_internal.h"

#define SEG_HDR 32
#define REC_HDR 48
#define SEG_MAGIC "TKVSEG01"
#define SEG_VERSION 1u
#define SPARE_NAME "segment.prepare"
/* Staging: a group's records are gathered for one pwritev per segment. A
 * record with a payload of up to COPY_MAX bytes is copied whole into the
 * staging buffer (its CRC is computed right after the copy, while the bytes
 * are in L1, and consecutive records share one iovec); a larger payload is
 * written from the caller's blob through its own iovec. A flush comes
 * early only when STAGE_BYTES, STAGE_RECS or STAGE_IOV run out. */
#define STAGE_BYTES (1u << 20)
#define STAGE_RECS 16384
#define STAGE_IOV 1016
#define COPY_MAX 2048
#define ZERO_CHUNK (64u << 10)
/* Zero-ahead: a small write also writes zeros up to ZERO_AHEAD bytes past
 * its end (in the same pwritev), unless it is at least ZERO_AHEAD_SKIP
 * bytes itself. */
#define ZERO_AHEAD (256u << 10)
#define ZERO_AHEAD_IOV (ZERO_AHEAD / ZERO_CHUNK + 1)
#define ZERO_AHEAD_SKIP (64u << 10)

_Static_assert(REC_HDR % 8 == 0, "records stay 8-byte aligned");
_Static_assert(SEG_HDR % 8 == 0, "records stay 8-byte aligned");
_Static_assert(STAGE_IOV + ZERO_AHEAD_IOV <= IOV_MAX, "one pwritev per flush");

static const uint8_t zeros[ZERO_CHUNK];

struct seg {
    uint64_t first; /* index of the first record (from the file name) */
    uint64_t n;     /* records */
    uint32_t *offs; /* offs[k]: offset of record first + k */
    size_t cap;
    uint64_t end;    /* bytes used: next record goes here */
    uint64_t zeroed; /* bytes [end, zeroed) were written as zeros by the
                        store (not just preallocated): see flush() */
    uint64_t size;   /* records fit in [0, size): the file's preallocation */
    int fd;
    bool dirty; /* written since the last sync */
    char name[32];
};

struct term_run {
    uint64_t first;
    uint64_t term;
};

struct fs {
    char *dir;
    int dirfd;
    const struct store_fileops *fo;
    uint64_t seg_bytes;
    struct store_meta *meta;

    pthread_mutex_t mu;
    struct seg *segs;
    size_t nsegs, segs_cap;
    struct term_run *runs;
    size_t nruns, runs_cap;
    uint64_t first, last, prev_term;

    /* Writer only (s->write_mu). */
    uint64_t durable;    /* highest index known durable */
    int spare_fd;        /* the prepared next segment, or -1 */
    uint64_t spare_size; /* its size */
    /* A released segment's offsets array, for the next segment (grown by
     * doubling, it would otherwise be reallocated log2(records) times per
     * segment, on the storage thread). */
    uint32_t *spare_offs;
    size_t spare_offs_cap;
    bool dir_dirty;
    struct iovec iov[STAGE_IOV + ZERO_AHEAD_IOV];
    size_t niov;
    bool iov_in_sbuf; /* iov[niov - 1] ends at sbuf + sbuf_len */
    uint8_t *sbuf;    /* the staging buffer, STAGE_BYTES (allocated lazily) */
    size_t sbuf_len;
    uint64_t *st_term; /* STAGE_RECS each */
    uint64_t *st_off;
    size_t nrec;
    uint64_t stage_bytes;
    bool stage_header; /* the segment header is staged at offset 0 */
};

static struct fs *fsb(struct store *s)
{
    return s->be;
}

static uint64_t pad8(uint64_t n)
{
    return (n + 7) & ~(uint64_t)7;
}

/* ---- default file operations ------------------------------------------- */

static int d_open(const char *p, int fl, mode_t m)
{
    return open(p, fl, m);
}
static ssize_t d_pwritev(int fd, const struct iovec *iov, int n, off_t off)
{
    return pwritev(fd, iov, n, off);
}
static int d_fallocate(int fd, int mode, off_t off, off_t len)
{
    return fallocate(fd, mode, off, len);
}

static const struct store_fileops default_fileops = {
    .open = d_open,
    .close = close,
    .pwritev = d_pwritev,
    .pread = pread,
    .fdatasync = fdatasync,
    .fsync = fsync,
    .fallocate = d_fallocate,
    .ftruncate = ftruncate,
    .rename = rename,
    .unlink = unlink,
};

const struct store_fileops *store_fileops_default(void)
{
    return &default_fileops;
}

static int errno_rc(int e)
{
    return e == ENOSPC || e == EDQUOT ? TK_ENOSPC : TK_EIO;
}

static void path_of(const struct fs *f, const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%s", f->dir, name);
}

/* ---- records ----------------------------------------------------------- */

/* The record header of `e` without its CRC (bytes 4..48). */
static void rec_header(uint8_t *h, const struct raft_entry *e, uint64_t synced)
{
    uint32_t len = e->data != NULL ? (uint32_t)e->data->len : 0;
    tk_put_le32(h + 4, len);
    tk_put_le64(h + 8, e->index);
    tk_put_le64(h + 16, e->term);
    tk_put_le64(h + 24, e->time_ms);
    tk_put_le64(h + 32, synced);
    memset(h + 40, 0, 8);
    h[40] = e->type;
}

struct rec {
    uint32_t len;
    uint64_t index, term, time_ms, synced;
    uint8_t type;
};

/* Decodes and checks the record at p (avail bytes readable). Returns 1 if
 * valid, 0 if the header is all zeros, -1 if invalid. */
static int rec_decode(const uint8_t *p, uint64_t avail, uint64_t max_len, struct rec *r)
{
    if (avail < REC_HDR)
        return -1;
    bool zero = true;
    for (int i = 0; i < REC_HDR; i += 8) {
        if (tk_get_le64(p + i) != 0) {
            zero = false;
            break;
        }
    }
    if (zero)
        return 0;
    r->len = tk_get_le32(p + 4);
    r->index = tk_get_le64(p + 8);
    r->term = tk_get_le64(p + 16);
    r->time_ms = tk_get_le64(p + 24);
    r->synced = tk_get_le64(p + 32);
    r->type = p[40];
    /* The whole record, padding included, must be present. */
    if (r->len > max_len || REC_HDR + pad8(r->len) > avail)
        return -1;
    if (r->type > RAFT_ENTRY_CONFIG || r->index == 0)
        return -1;
    for (int i = 41; i < 48; i++)
        if (p[i] != 0)
            return -1;
    uint32_t crc = tk_crc32c(0, p + 4, REC_HDR - 4);
    crc = tk_crc32c(crc, p + REC_HDR, r->len);
    if (crc != tk_get_le32(p))
        return -1;
    /* Padding is not under the CRC, so it must be zero to count. */
    for (uint64_t i = REC_HDR + r->len; i < REC_HDR + pad8(r->len); i++)
        if (p[i] != 0)
            return -1;
    return 1;
}

static void seghdr_encode(uint8_t *h, uint64_t first)
{
    memcpy(h, SEG_MAGIC, 8);
    tk_put_le64(h + 8, first);
    tk_put_le32(h + 16, SEG_VERSION);
    tk_put_le32(h + 20, tk_crc32c(0, h, 20));
    memset(h + 24, 0, 8);
}

static bool seghdr_ok(const uint8_t *h, uint64_t size, uint64_t first)
{
    return size >= SEG_HDR && memcmp(h, SEG_MAGIC, 8) == 0 &&
           tk_get_le64(h + 8) == first && tk_get_le32(h + 16) == SEG_VERSION &&
           tk_get_le32(h + 20) == tk_crc32c(0, h, 20);
}

/* ---- in-memory index --------------------------------------------------- */

static void seg_push(struct seg *g, uint64_t off)
{
    if (g->n == g->cap) {
        g->cap = g->cap ? g->cap * 2 : 256;
        g->offs = tk_realloc(g->offs, g->cap * sizeof(*g->offs));
    }
    TK_ASSERT(off <= UINT32_MAX);
    g->offs[g->n++] = (uint32_t)off;
}

static void runs_push(struct fs *f, uint64_t index, uint64_t term)
{
    if (f->nruns > 0 && f->runs[f->nruns - 1].term == term)
        return;
    if (f->nruns == f->runs_cap) {
        f->runs_cap = f->runs_cap ? f->runs_cap * 2 : 16;
        f->runs = tk_realloc(f->runs, f->runs_cap * sizeof(*f->runs));
    }
    f->runs[f->nruns].first = index;
    f->runs[f->nruns].term = term;
    f->nruns++;
}

/* Drops runs that start at or after `index`. */
static void runs_cut(struct fs *f, uint64_t index)
{
    while (f->nruns > 0 && f->runs[f->nruns - 1].first >= index)
        f->nruns--;
}

static uint64_t runs_term(const struct fs *f, uint64_t index)
{
    size_t lo = 0, hi = f->nruns;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (f->runs[mid].first <= index)
            lo = mid;
        else
            hi = mid;
    }
    TK_ASSERT(f->nruns > 0);
    TK_ASSERT(f->runs[lo].first <= index);
    return f->runs[lo].term;
}

/* The segment holding `index` (first <= index <= last). mu held. */
static struct seg *seg_find(struct fs *f, uint64_t index)
{
    size_t lo = 0, hi = f->nsegs;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (f->segs[mid].first <= index)
            lo = mid;
        else
            hi = mid;
    }
    struct seg *g = &f->segs[lo];
    TK_ASSERT(g->first <= index);
    TK_ASSERT(index < g->first + g->n);
    return g;
}

/* The size of a log's first segment. */
static uint64_t first_seg_size(const struct fs *f)
{
    return f->seg_bytes < STORE_SEGMENT_BYTES_FIRST ? f->seg_bytes
                                                    : STORE_SEGMENT_BYTES_FIRST;
}

/* The size of the next segment: twice the last one, up to seg_bytes. */
static uint64_t next_seg_size(const struct fs *f)
{
    if (f->nsegs == 0)
        return first_seg_size(f);
    uint64_t last = f->segs[f->nsegs - 1].size;
    return last >= f->seg_bytes / 2   ? f->seg_bytes
           : last < first_seg_size(f) ? first_seg_size(f)
                                      : last * 2;
}

static struct seg *seg_add(struct fs *f, uint64_t first, int fd)
{
    if (f->nsegs == f->segs_cap) {
        f->segs_cap = f->segs_cap ? f->segs_cap * 2 : 16;
        f->segs = tk_realloc(f->segs, f->segs_cap * sizeof(*f->segs));
    }
    struct seg *g = &f->segs[f->nsegs++];
    memset(g, 0, sizeof(*g));
    g->first = first;
    g->fd = fd;
    g->offs = f->spare_offs; /* s->write_mu or single-threaded, as seg_release */
    g->cap = f->spare_offs_cap;
    f->spare_offs = NULL;
    f->spare_offs_cap = 0;
    snprintf(g->name, sizeof(g->name), "%020llu.seg", (unsigned long long)first);
    return g;
}

static void seg_release(struct fs *f, struct seg *g)
{
    if (g->fd >= 0)
        f->fo->close(g->fd);
    if (g->cap > f->spare_offs_cap) {
        tk_free(f->spare_offs);
        f->spare_offs = g->offs;
        f->spare_offs_cap = g->cap;
    } else {
        tk_free(g->offs);
    }
    g->offs = NULL;
    g->cap = 0;
    g->fd = -1;
}

/* Removes segment i from the array (mu held by caller). */
static void seg_remove_at(struct fs *f, size_t i, struct seg *out)
{
    *out = f->segs[i];
    memmove(&f->segs[i], &f->segs[i + 1], (f->nsegs - i - 1) * sizeof(*f->segs));
    f->nsegs--;
}

/* ---- writing ----------------------------------------------------------- */

static int write_all(struct store *s, struct seg *g, struct iovec *iov, int n,
                     uint64_t off)
{
    struct fs *f = fsb(s);
    while (n > 0) {
        ssize_t w = f->fo->pwritev(g->fd, iov, n, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            return store__err(s, errno_rc(e), "%s/%s: write at offset %llu: %s", f->dir,
                              g->name, (unsigned long long)off, strerror(e));
        }
        /* A short write is legal: continue with the rest. */
        off += (uint64_t)w;
        size_t left = (size_t)w;
        while (n > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0 && left > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return 0;
}

/* Zero-ahead. A segment is preallocated with fallocate, which leaves
 * unwritten extents: the first write into each block converts its extent, a
 * metadata change that the next fdatasync must write (on ext4 without a
 * journal, a synchronous inode write: a second I/O in series on every sync
 * of a small group). So a small write also writes zeros from its end up to
 * ZERO_AHEAD bytes further, in the same pwritev: the extents ahead are
 * converted about once per ZERO_AHEAD bytes of log (it is refilled when
 * less than ZERO_AHEAD / 8 is left), and the syncs in between write data
 * only. Large writes skip it (their one conversion is amortised). The
 * zeros are what recovery expects after the last record. Adds iovecs to
 * f->iov for [end, ...); returns the new zeroed watermark. */
static uint64_t zero_ahead(struct fs *f, const struct seg *g, uint64_t end)
{
    if (f->stage_bytes >= ZERO_AHEAD_SKIP || end + ZERO_AHEAD / 8 <= g->zeroed)
        return g->zeroed > end ? g->zeroed : end;
    uint64_t to = (end + ZERO_AHEAD + 4095) & ~(uint64_t)4095;
    if (to > g->size)
        to = g->size;
    for (uint64_t at = end; at < to;) {
        uint64_t l = to - at < ZERO_CHUNK ? to - at : ZERO_CHUNK;
        f->iov[f->niov].iov_base = (void *)zeros;
        f->iov[f->niov++].iov_len = l;
        at += l;
    }
    return to > end ? to : end;
}

/* Writes the staged records to the active segment and publishes them. */
static int flush(struct store *s)
{
    struct fs *f = fsb(s);
    if (f->niov == 0)
        return 0;
    struct seg *g = &f->segs[f->nsegs - 1];
    uint64_t off = f->stage_header ? 0 : g->end;
    uint64_t zeroed = zero_ahead(f, g, off + f->stage_bytes);
    int rc = write_all(s, g, f->iov, (int)f->niov, off);
    f->niov = 0;
    f->iov_in_sbuf = false;
    f->sbuf_len = 0;
    if (rc != 0) {
        f->nrec = 0;
        f->stage_bytes = 0;
        return rc;
    }
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; i < f->nrec; i++) {
        seg_push(g, f->st_off[i]);
        runs_push(f, g->first + g->n - 1, f->st_term[i]);
    }
    g->end = off + f->stage_bytes;
    f->last += f->nrec;
    pthread_mutex_unlock(&f->mu);
    g->zeroed = zeroed;
    g->dirty = true;
    f->nrec = 0;
    f->stage_bytes = 0;
    f->stage_header = false;
    return 0;
}

/* How long the writer waits for a descriptor when the process (EMFILE) or
 * the system (ENFILE) has none left: a transient shortage (a burst of client
 * connections), not a disk that lost data, so it must not fail the store. */
#define FD_WAIT_MS 60000u

/* open() that, with `wait`, retries EMFILE/ENFILE with a backoff (up to
 * 100 ms a try, FD_WAIT_MS in all) on the storage thread, which the node's
 * loop never waits for. */
static int open_waiting(struct fs *f, const char *path, int flags, bool wait)
{
    uint32_t waited_ms = 0, step_ms = 1, warned_ms = 0;
    for (;;) {
        int fd = f->fo->open(path, flags, 0644);
        if (fd >= 0 || (errno != EMFILE && errno != ENFILE) || !wait ||
            waited_ms >= FD_WAIT_MS)
            return fd;
        int e = errno;
        if (waited_ms >= warned_ms) {
            TK_LOG(TK_LOG_WARN, 0, 0, "%s: create: %s; waiting for a descriptor", path,
                   strerror(e));
            warned_ms = waited_ms + 5000;
        }
        usleep(step_ms * 1000);
        waited_ms += step_ms;
        step_ms = step_ms < 100 ? step_ms * 2 : 100;
        errno = e;
    }
}

/* Creates and preallocates the spare segment file, `size` bytes. Writer
 * only. Without `wait` (ahead of need) a descriptor shortage fails at once;
 * with it (the log must roll now) the writer waits for one (open_waiting). */
static int prepare_spare(struct store *s, bool wait, uint64_t size)
{
    struct fs *f = fsb(s);
    char path[PATH_MAX];
    path_of(f, SPARE_NAME, path, sizeof(path));
    int fd = open_waiting(f, path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, wait);
    if (fd < 0)
        return store__err(s, errno_rc(errno), "%s: create: %s", path, strerror(errno));
    /* Reserve the blocks now so that appends need no allocation, then make
     * that durable once, here, off the append path. */
    if (f->fo->fallocate(fd, 0, 0, (off_t)size) != 0 && errno != EOPNOTSUPP &&
        errno != ENOSYS) {
        int e = errno;
        f->fo->close(fd);
        return store__err(s, errno_rc(e), "%s: fallocate %llu bytes: %s", path,
                          (unsigned long long)size, strerror(e));
    }
    if (f->fo->fsync(fd) != 0) {
        int e = errno;
        f->fo->close(fd);
        return store__err(s, TK_EIO, "%s: fsync: %s", path, strerror(e));
    }
    f->spare_fd = fd;
    f->spare_size = size;
    return 0;
}

/* Reserves `len` bytes at the end of the staging buffer and covers them with
 * an iovec (the last one, when it ends there). The caller has checked that
 * they fit (stage_room). */
static uint8_t *stage_reserve(struct fs *f, size_t len)
{
    TK_ASSERT(f->sbuf_len + len <= STAGE_BYTES);
    uint8_t *p = f->sbuf + f->sbuf_len;
    if (f->iov_in_sbuf) {
        f->iov[f->niov - 1].iov_len += len;
    } else {
        TK_ASSERT(f->niov < STAGE_IOV);
        f->iov[f->niov].iov_base = p;
        f->iov[f->niov++].iov_len = len;
        f->iov_in_sbuf = true;
    }
    f->sbuf_len += len;
    return p;
}

/* Whether a record with a payload of `len` bytes can be staged now. */
static bool stage_room(const struct fs *f, uint64_t len)
{
    uint64_t bytes = len <= COPY_MAX ? REC_HDR + pad8(len) : REC_HDR + 8;
    return f->nrec < STAGE_RECS && f->niov + 3 <= STAGE_IOV &&
           f->sbuf_len + bytes <= STAGE_BYTES;
}

/* Stages the record of `e` (see STAGE_BYTES) with its CRC. */
static void stage_record(struct fs *f, const struct raft_entry *e, uint64_t len)
{
    if (len <= COPY_MAX) {
        uint8_t *h = stage_reserve(f, REC_HDR + pad8(len));
        rec_header(h, e, f->durable);
        if (len > 0)
            memcpy(h + REC_HDR, e->data->data, len);
        memset(h + REC_HDR + len, 0, pad8(len) - len);
        /* Header and payload are contiguous and were just written. */
        tk_put_le32(h, tk_crc32c(0, h + 4, REC_HDR - 4 + len));
        return;
    }
    uint8_t *h = stage_reserve(f, REC_HDR);
    rec_header(h, e, f->durable);
    tk_put_le32(h, tk_crc32c(tk_crc32c(0, h + 4, REC_HDR - 4), e->data->data, len));
    f->iov[f->niov].iov_base = e->data->data;
    f->iov[f->niov++].iov_len = len;
    f->iov_in_sbuf = false;
    if (pad8(len) != len)
        memset(stage_reserve(f, pad8(len) - len), 0, pad8(len) - len);
}

/* Starts a new segment whose first record is `first` and whose header and
 * first record take `need` bytes. */
static int roll(struct store *s, uint64_t first, uint64_t need)
{
    struct fs *f = fsb(s);
    if (f->spare_fd >= 0 && f->spare_size < need) {
        /* A small spare and a large record: a full segment instead. */
        char path[PATH_MAX];
        path_of(f, SPARE_NAME, path, sizeof(path));
        f->fo->close(f->spare_fd);
        f->spare_fd = -1;
        if (f->fo->unlink(path) != 0)
            return store__err(s, TK_EIO, "unlink %s: %s", path, strerror(errno));
        f->dir_dirty = true;
    }
    if (f->spare_fd < 0) {
        uint64_t size = next_seg_size(f);
        int rc = prepare_spare(s, true, size < need ? f->seg_bytes : size);
        if (rc != 0)
            return rc;
    }
    char from[PATH_MAX], to[PATH_MAX], name[32];
    snprintf(name, sizeof(name), "%020llu.seg", (unsigned long long)first);
    path_of(f, SPARE_NAME, from, sizeof(from));
    path_of(f, name, to, sizeof(to));
    if (f->fo->rename(from, to) != 0)
        return store__err(s, errno_rc(errno), "rename %s -> %s: %s", from, to,
                          strerror(errno));
    f->dir_dirty = true;
    pthread_mutex_lock(&f->mu);
    /* its end 0 under f->mu: readers sum it */
    struct seg *g = seg_add(f, first, f->spare_fd);
    g->size = f->spare_size;
    if (f->nsegs >= 2) {
        /* Offsets for as many records as the last segment held, scaled to
         * the new size, in one allocation: while segments grow, doubling
         * from 256 would reallocate log2(records) times per roll. */
        const struct seg *prev = &f->segs[f->nsegs - 2];
        uint64_t want = prev->size > 0 ? prev->n * (g->size / prev->size) : 0;
        want += want / 8;
        if (want > g->cap && want <= UINT32_MAX) {
            g->offs = tk_realloc(g->offs, want * sizeof(*g->offs));
            g->cap = want;
        }
    }
    pthread_mutex_unlock(&f->mu);
    f->spare_fd = -1;
    TK_ASSERT(f->niov == 0);
    seghdr_encode(stage_reserve(f, SEG_HDR), first);
    f->stage_header = true;
    f->stage_bytes = SEG_HDR;
    return 0;
}

static int zero_range(struct store *s, struct seg *g, uint64_t off, uint64_t len)
{
    struct iovec iov[16];
    while (len > 0) {
        int n = 0;
        uint64_t chunk = 0;
        while (n < 16 && chunk < len) {
            uint64_t l = len - chunk < ZERO_CHUNK ? len - chunk : ZERO_CHUNK;
            iov[n].iov_base = (void *)zeros;
            iov[n].iov_len = l;
            chunk += l;
            n++;
        }
        int rc = write_all(s, g, iov, n, off);
        if (rc != 0)
            return rc;
        off += chunk;
        len -= chunk;
    }
    return 0;
}

static int sync_fd(struct store *s, int fd, const char *name, bool dir)
{
    struct fs *f = fsb(s);
    int r = dir ? f->fo->fsync(fd) : f->fo->fdatasync(fd);
    if (r != 0)
        return store__err(s, TK_EIO, "%s/%s: %s: %s", f->dir, name,
                          dir ? "fsync" : "fdatasync", strerror(errno));
    return 0;
}

static int sync_dir(struct store *s)
{
    struct fs *f = fsb(s);
    if (!f->dir_dirty)
        return 0;
    int rc = sync_fd(s, f->dirfd, ".", true);
    if (rc == 0)
        f->dir_dirty = false;
    return rc;
}

static int unlink_seg(struct store *s, struct seg *g)
{
    struct fs *f = fsb(s);
    char path[PATH_MAX];
    path_of(f, g->name, path, sizeof(path));
    seg_release(f, g);
    if (f->fo->unlink(path) != 0)
        return store__err(s, TK_EIO, "unlink %s: %s", path, strerror(errno));
    f->dir_dirty = true;
    return 0;
}

/* Makes the compacted segment g the spare, when there is none, instead of
 * deleting it: deleting a preallocated segment and syncing the directory
 * sends the discard of its blocks (45-60 ms for 64 MiB on a VM's disk
 * mounted with `discard`), during which every fdatasync on the device, the
 * other nodes' logs included, waited; renaming it and zeroing its range (its extents
 * become unwritten again, its blocks stay allocated) took 5-7 ms and held
 * no one. Returns 0 when g became the spare, 1 when it is to be deleted as
 * before (a spare is there, its size is not the segments', or the file
 * system cannot zero a range), or an error. */
static int recycle_seg(struct store *s, struct seg *g)
{
    struct fs *f = fsb(s);
    struct stat st;
    if (f->spare_fd >= 0 || fstat(g->fd, &st) != 0 ||
        (uint64_t)st.st_size != next_seg_size(f))
        return 1;
    char from[PATH_MAX], to[PATH_MAX];
    path_of(f, g->name, from, sizeof(from));
    path_of(f, SPARE_NAME, to, sizeof(to));
    if (f->fo->rename(from, to) != 0)
        return 1;
    f->dir_dirty = true;
    int rc = 0;
    /* A crash before the zeros are durable leaves segment.prepare, which
     * recovery removes: only a spare we synced is ever rolled into. */
    if (f->fo->fallocate(g->fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, 0,
                         (off_t)st.st_size) != 0) {
        if (f->fo->unlink(to) != 0)
            rc = store__err(s, TK_EIO, "unlink %s: %s", to, strerror(errno));
    } else if (f->fo->fsync(g->fd) != 0) {
        rc = store__err(s, TK_EIO, "%s: fsync: %s", to, strerror(errno));
    } else {
        f->spare_fd = g->fd;
        f->spare_size = (uint64_t)st.st_size;
        g->fd = -1;
        atomic_fetch_add(&s->st_recycled, 1);
    }
    seg_release(f, g);
    return rc;
}

/* Takes segment i out of the array (under mu, for readers) and deletes its
 * file, or (`recycle`) makes it the spare if it can (recycle_seg). The caller
 * syncs the directory (sync_dir) once it is done. Writer or recovery only. */
static int remove_seg(struct store *s, size_t i, bool recycle)
{
    struct fs *f = fsb(s);
    struct seg g;
    pthread_mutex_lock(&f->mu);
    seg_remove_at(f, i, &g);
    pthread_mutex_unlock(&f->mu);
    int rc = recycle ? recycle_seg(s, &g) : 1;
    return rc == 1 ? unlink_seg(s, &g) : rc;
}

/* Removes segments from the end until `keep` remain. */
static int remove_last_segs(struct store *s, size_t keep)
{
    struct fs *f = fsb(s);
    int rc = 0;
    while (rc == 0 && f->nsegs > keep)
        rc = remove_seg(s, f->nsegs - 1, false);
    return rc;
}

/* Removes leading segments whose records all have index < `first`, always
 * keeping the last segment (the one being written). */
static int remove_first_segs(struct store *s, uint64_t first)
{
    struct fs *f = fsb(s);
    int rc = 0;
    while (rc == 0 && f->nsegs >= 2 && f->segs[0].first + f->segs[0].n <= first)
        rc = remove_seg(s, 0, true);
    return rc;
}

/* Discards every record with index >= `index` durably. Writer only. */
static int fs_truncate(struct store *s, uint64_t index)
{
    struct fs *f = fsb(s);
    TK_ASSERT(f->niov == 0);
    size_t keep = f->nsegs;
    while (keep > 0 && f->segs[keep - 1].first >= index)
        keep--;
    int rc = remove_last_segs(s, keep);
    if (rc == 0)
        rc = sync_dir(s);
    if (rc != 0)
        return rc;
    if (f->nsegs > 0) {
        struct seg *g = &f->segs[f->nsegs - 1];
        if (index < g->first + g->n) {
            uint64_t off = g->offs[index - g->first];
            rc = zero_range(s, g, off, g->end - off);
            if (rc == 0)
                rc = sync_fd(s, g->fd, g->name, false);
            if (rc != 0)
                return rc;
            pthread_mutex_lock(&f->mu);
            g->n = index - g->first;
            g->end = off;
            pthread_mutex_unlock(&f->mu);
        }
    }
    pthread_mutex_lock(&f->mu);
    f->last = index - 1;
    runs_cut(f, index);
    pthread_mutex_unlock(&f->mu);
    if (f->durable > index - 1)
        f->durable = index - 1;
    return 0;
}

static int fs_write(struct store *s, const struct store__span *spans, size_t nspans)
{
    struct fs *f = fsb(s);
    uint64_t lo = spans[0].e[0].index;
    int rc = 0;
    if (lo <= f->last) {
        rc = fs_truncate(s, lo);
        if (rc != 0)
            return rc;
    }
    TK_ASSERT(lo == f->last + 1);
    if (f->sbuf == NULL) {
        f->sbuf = tk_malloc(STAGE_BYTES);
        f->st_term = tk_malloc(STAGE_RECS * sizeof(*f->st_term));
        f->st_off = tk_malloc(STAGE_RECS * sizeof(*f->st_off));
    }
    for (size_t i = 0; i < nspans; i++) {
        for (size_t j = 0; j < spans[i].n; j++) {
            const struct raft_entry *e = &spans[i].e[j];
            uint64_t len = e->data != NULL ? e->data->len : 0;
            uint64_t rl = REC_HDR + pad8(len);
            struct seg *g = f->nsegs > 0 ? &f->segs[f->nsegs - 1] : NULL;
            uint64_t at = g == NULL         ? 0
                          : f->stage_header ? f->stage_bytes
                                            : g->end + f->stage_bytes;
            /* A segment holds records only if they fit; an empty segment
             * always fits one (entry_bytes_max guarantees it). The first
             * segment after a reset or a truncation to an empty log is
             * named by its first record. */
            if (g == NULL || at + rl > g->size || g->first + g->n + f->nrec != e->index) {
                if ((rc = flush(s)) != 0)
                    return rc;
                if ((rc = roll(s, e->index, SEG_HDR + rl)) != 0)
                    return rc;
                g = &f->segs[f->nsegs - 1];
                at = SEG_HDR;
            }
            if (!stage_room(f, len)) {
                if ((rc = flush(s)) != 0)
                    return rc;
                at = g->end;
            }
            stage_record(f, e, len);
            f->st_off[f->nrec] = at;
            f->st_term[f->nrec] = e->term;
            f->nrec++;
            f->stage_bytes += rl;
        }
    }
    return flush(s);
}

static int fs_sync(struct store *s)
{
    struct fs *f = fsb(s);
    for (size_t i = 0; i < f->nsegs; i++) {
        struct seg *g = &f->segs[i];
        if (!g->dirty)
            continue;
        int rc = sync_fd(s, g->fd, g->name, false);
        if (rc != 0)
            return rc;
        g->dirty = false;
    }
    int rc = sync_dir(s);
    if (rc != 0)
        return rc;
    f->durable = f->last;
    return 0;
}

/* The spare is prepared ahead of need, once the last segment is three
 * quarters full: until then a compaction may yet recycle a segment into it
 * (recycle_seg), which a spare made earlier would have it delete. */
static bool fs_idle_due(struct store *s)
{
    struct fs *f = fsb(s);
    return f->spare_fd < 0 && (f->nsegs == 0 || f->segs[f->nsegs - 1].end >=
                                                    f->segs[f->nsegs - 1].size / 4 * 3);
}

static void fs_idle(struct store *s)
{
    if (!fs_idle_due(s))
        return;
    /* Failure here is not fatal: roll() retries and reports. */
    (void)prepare_spare(s, false, next_seg_size(fsb(s)));
}

static int save_log_start(struct store *s, uint64_t first, uint64_t prev_term)
{
    struct fs *f = fsb(s);
    struct store_meta_state st;
    memset(&st, 0, sizeof(st));
    st.has_log_start = true;
    st.log_first = first;
    st.log_prev_term = prev_term;
    char err[STORE_ERRMSG_MAX];
    int rc = store_meta_save(f->meta, &st, STORE_META_LOG_START, err, sizeof(err));
    if (rc != 0)
        store__err(s, rc, "%s", err);
    return rc;
}

static int fs_compact(struct store *s, uint64_t index, uint64_t term)
{
    struct fs *f = fsb(s);
    /* The new start is durable before any segment goes: a crash in between
     * leaves segments that recovery knows to be behind the start. */
    int rc = save_log_start(s, index + 1, term);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&f->mu);
    f->first = index + 1;
    f->prev_term = term;
    while (f->nruns >= 2 && f->runs[1].first <= f->first)
        memmove(&f->runs[0], &f->runs[1], --f->nruns * sizeof(*f->runs));
    pthread_mutex_unlock(&f->mu);
    rc = remove_first_segs(s, index + 1);
    if (rc == 0)
        rc = sync_dir(s);
    return rc;
}

static int fs_reset(struct store *s, uint64_t index, uint64_t term)
{
    struct fs *f = fsb(s);
    /* Segments go first, then the new start: a crash in between leaves an
     * empty log, never old entries after the new start. */
    int rc = remove_last_segs(s, 0);
    if (rc == 0)
        rc = sync_dir(s);
    if (rc == 0)
        rc = save_log_start(s, index + 1, term);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&f->mu);
    f->first = index + 1;
    f->last = index;
    f->prev_term = term;
    f->nruns = 0;
    pthread_mutex_unlock(&f->mu);
    f->durable = index;
    return 0;
}

/* ---- reading ----------------------------------------------------------- */

static void fs_bounds(struct store *s, uint64_t *first, uint64_t *last)
{
    struct fs *f = fsb(s);
    pthread_mutex_lock(&f->mu);
    *first = f->first;
    *last = f->last;
    pthread_mutex_unlock(&f->mu);
}

static uint64_t fs_log_bytes(struct store *s)
{
    struct fs *f = fsb(s);
    uint64_t b = 0;
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; i < f->nsegs; i++)
        b += f->segs[i].end;
    pthread_mutex_unlock(&f->mu);
    return b;
}

static int fs_term_at(struct store *s, uint64_t index, uint64_t *term)
{
    struct fs *f = fsb(s);
    int rc = 0;
    *term = 0;
    pthread_mutex_lock(&f->mu);
    if (index + 1 < f->first)
        rc = TK_ECOMPACTED;
    else if (index > f->last)
        rc = TK_EUNAVAIL;
    else if (index + 1 == f->first)
        *term = f->prev_term;
    else
        *term = runs_term(f, index);
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int pread_all(struct store *s, struct seg *g, uint8_t *buf, uint64_t len,
                     uint64_t off)
{
    struct fs *f = fsb(s);
    while (len > 0) {
        ssize_t r = f->fo->pread(g->fd, buf, len, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return store__err(s, r < 0 ? TK_EIO : TK_ECORRUPT,
                              "%s/%s: read at offset %llu: %s", f->dir, g->name,
                              (unsigned long long)off,
                              r < 0 ? strerror(errno) : "end of file");
        buf += r;
        off += (uint64_t)r;
        len -= (uint64_t)r;
    }
    return 0;
}

#define READ_CHUNK (1u << 20)

static int fs_read(struct store *s, uint64_t lo, uint64_t hi, uint64_t max_bytes,
                   struct raft_entry **out, size_t *n)
{
    struct fs *f = fsb(s);
    int rc = 0;
    struct raft_entry *r = NULL;
    uint8_t *buf = NULL;
    size_t k = 0;
    pthread_mutex_lock(&f->mu);
    if (lo < f->first) {
        rc = store__err(s, TK_ECOMPACTED, "read from %llu: log starts at %llu",
                        (unsigned long long)lo, (unsigned long long)f->first);
        goto out;
    }
    if (hi > f->last + 1) {
        rc = store__err(s, TK_EUNAVAIL, "read to %llu: log ends at %llu",
                        (unsigned long long)hi, (unsigned long long)f->last);
        goto out;
    }
    if (lo == hi)
        goto out;
    r = tk_malloc((size_t)(hi - lo) * sizeof(*r));
    uint64_t bytes = 0;
    uint64_t idx = lo;
    bool done = false;
    while (idx < hi && !done) {
        struct seg *g = seg_find(f, idx);
        uint64_t a = idx - g->first;
        uint64_t b = (hi < g->first + g->n ? hi : g->first + g->n) - g->first;
        uint64_t start = g->offs[a];
        /* Read whole records, about READ_CHUNK at a time (at least one). */
        uint64_t c = a + 1;
        while (c < b && g->offs[c] - start < READ_CHUNK)
            c++;
        uint64_t stop = c < g->n ? g->offs[c] : g->end;
        uint64_t len = stop - start;
        buf = tk_realloc(buf, len);
        if ((rc = pread_all(s, g, buf, len, start)) != 0)
            goto out;
        uint64_t pos = 0;
        for (uint64_t j = a; j < c; j++) {
            struct rec rh;
            uint64_t off = start + pos;
            if (rec_decode(buf + pos, len - pos, s->entry_bytes_max, &rh) != 1 ||
                rh.index != g->first + j) {
                rc = store__err(s, TK_ECORRUPT,
                                "%s/%s: record at offset %llu (index %llu) "
                                "fails its check on read",
                                f->dir, g->name, (unsigned long long)off,
                                (unsigned long long)(g->first + j));
                goto out;
            }
            struct raft_entry *e = &r[k++];
            e->index = rh.index;
            e->term = rh.term;
            e->time_ms = rh.time_ms;
            e->type = rh.type;
            e->data = rh.len > 0 ? tk_blob_copy(buf + pos + REC_HDR, rh.len) : NULL;
            bytes += rh.len;
            pos += REC_HDR + pad8(rh.len);
            idx++;
            if (max_bytes != 0 && bytes >= max_bytes) {
                done = true;
                break;
            }
        }
    }
out:
    pthread_mutex_unlock(&f->mu);
    tk_free(buf);
    if (rc != 0) {
        store_entries_free(r, k);
        return rc;
    }
    *out = r;
    *n = k;
    return 0;
}

static int fs_save_meta(struct store *s, const struct store_meta_state *st, unsigned mask)
{
    struct fs *f = fsb(s);
    char err[STORE_ERRMSG_MAX];
    int rc = store_meta_save(f->meta, st, mask, err, sizeof(err));
    if (rc != 0)
        store__err(s, rc, "%s", err);
    return rc;
}

static void fs_free(struct fs *f)
{
    for (size_t i = 0; i < f->nsegs; i++)
        seg_release(f, &f->segs[i]);
    tk_free(f->spare_offs);
    if (f->spare_fd >= 0)
        f->fo->close(f->spare_fd);
    if (f->dirfd >= 0)
        close(f->dirfd);
    store_meta_close(f->meta);
    pthread_mutex_destroy(&f->mu);
    tk_free(f->segs);
    tk_free(f->runs);
    tk_free(f->sbuf);
    tk_free(f->st_term);
    tk_free(f->st_off);
    tk_free(f->dir);
    tk_free(f);
}

static void fs_close(struct store *s)
{
    fs_free(fsb(s));
}

static const struct store__ops fs_ops = {
    .write = fs_write,
    .sync = fs_sync,
    .truncate = fs_truncate,
    .compact = fs_compact,
    .reset = fs_reset,
    .idle = fs_idle,
    .idle_due = fs_idle_due,
    .bounds = fs_bounds,
    .log_bytes = fs_log_bytes,
    .term_at = fs_term_at,
    .read = fs_read,
    .save_meta = fs_save_meta,
    .close = fs_close,
};

/* ---- recovery ---------------------------------------------------------- */

struct recover {
    struct store *s;
    struct fs *f;
    char *err;
    size_t err_len;
    const uint8_t *buf; /* the segment being scanned, mapped read-only */
    uint64_t size;
};

static void unload_file(struct recover *r)
{
    if (r->buf != NULL)
        munmap((void *)r->buf, r->size);
    r->buf = NULL;
    r->size = 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Lists NNNN.seg files (sorted) and removes a leftover spare. */
static int list_segments(struct recover *rc_, uint64_t **out, size_t *n)
{
    struct fs *f = rc_->f;
    DIR *d = tk_opendir(f->dir);
    if (d == NULL)
        return store__errbuf(rc_->err, rc_->err_len, TK_EIO, "opendir %s: %s", f->dir,
                             strerror(errno));
    uint64_t *v = NULL;
    size_t cnt = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *nm = de->d_name;
        if (strcmp(nm, SPARE_NAME) == 0) {
            char path[PATH_MAX];
            path_of(f, nm, path, sizeof(path));
            f->fo->unlink(path);
            continue;
        }
        size_t l = strlen(nm);
        if (l != 24 || strcmp(nm + 20, ".seg") != 0)
            continue;
        bool digits = true;
        for (int i = 0; i < 20; i++)
            digits = digits && nm[i] >= '0' && nm[i] <= '9';
        if (!digits)
            continue;
        uint64_t first = strtoull(nm, NULL, 10);
        if (first == 0) {
            closedir(d);
            tk_free(v);
            return store__errbuf(rc_->err, rc_->err_len, TK_ECORRUPT,
                                 "%s/%s: segment named index 0", f->dir, nm);
        }
        if (cnt == cap) {
            cap = cap ? cap * 2 : 16;
            v = tk_realloc(v, cap * sizeof(*v));
        }
        v[cnt++] = first;
    }
    closedir(d);
    if (cnt > 0)
        qsort(v, cnt, sizeof(*v), cmp_u64);
    *out = v;
    *n = cnt;
    return 0;
}

static int load_file(struct recover *r, struct seg *g)
{
    struct fs *f = r->f;
    struct stat st;
    if (fstat(g->fd, &st) != 0)
        return store__errbuf(r->err, r->err_len, TK_EIO, "%s/%s: fstat: %s", f->dir,
                             g->name, strerror(errno));
    unload_file(r);
    /* Its preallocation (smaller only where the file system has no
     * fallocate: then the next roll comes sooner). */
    g->size = (uint64_t)st.st_size > first_seg_size(f) ? (uint64_t)st.st_size
                                                       : first_seg_size(f);
    if ((uint64_t)st.st_size > UINT32_MAX)
        return store__errbuf(r->err, r->err_len, TK_ECORRUPT,
                             "%s/%s: %llu bytes, above 4 GiB", f->dir, g->name,
                             (unsigned long long)st.st_size);
    if (st.st_size == 0)
        return 0;
    /* A private read-only mapping: no copy, and the zero tail of a
     * preallocated segment costs no I/O. Recovery has the directory to
     * itself, so the file cannot shrink under the mapping. */
    void *m =
        mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, g->fd, 0);
    if (m == MAP_FAILED)
        return store__errbuf(r->err, r->err_len, TK_EIO, "%s/%s: mmap: %s", f->dir,
                             g->name, strerror(errno));
    madvise(m, (size_t)st.st_size, MADV_SEQUENTIAL);
    r->buf = m;
    r->size = (uint64_t)st.st_size;
    return 0;
}

/* Highest offset + 1 of a nonzero byte at or after `from`, or `from`. */
static uint64_t nonzero_end(const uint8_t *b, uint64_t from, uint64_t size)
{
    uint64_t e = size;
    /* Word at a time over the (usually long) zero tail of a segment. */
    while (e > from && e % 8 != 0 && b[e - 1] == 0)
        e--;
    while (e >= from + 8 && e % 8 == 0) {
        uint64_t w;
        memcpy(&w, b + e - 8, 8);
        if (w != 0)
            break;
        e -= 8;
    }
    while (e > from && b[e - 1] == 0)
        e--;
    return e;
}

/* Looks, in the loaded segment from `from` on, for a valid record with index
 * >= x that says x had been synced. Returns its offset or UINT64_MAX. */
static uint64_t find_synced_after(struct recover *r, uint64_t from, uint64_t x,
                                  struct rec *out)
{
    uint64_t end = nonzero_end(r->buf, from, r->size);
    for (uint64_t p = pad8(from); p + REC_HDR <= end; p += 8) {
        const uint8_t *h = r->buf + p;
        uint64_t idx = tk_get_le64(h + 8);
        if (idx < x || tk_get_le64(h + 32) < x)
            continue;
        struct rec rh;
        if (rec_decode(h, r->size - p, r->s->entry_bytes_max, &rh) == 1) {
            *out = rh;
            return p;
        }
    }
    return UINT64_MAX;
}

/* Scans segment g (loaded in r->buf) from its header on, expecting `*expect`
 * next. Returns the offset where valid records stop and sets *kind: 0 normal
 * end (zero header or end of file), -1 an invalid record or header. */
static uint64_t scan_segment(struct recover *r, struct seg *g, uint64_t *expect,
                             uint64_t *term, int *kind)
{
    struct fs *f = r->f;
    if (!seghdr_ok(r->buf, r->size, g->first)) {
        *kind = -1;
        return 0;
    }
    uint64_t off = SEG_HDR;
    for (;;) {
        if (off + REC_HDR > r->size) {
            /* No room for another record: a normal end unless bytes of a
             * partial one are left. */
            *kind = nonzero_end(r->buf, off, r->size) > off ? -1 : 0;
            return off;
        }
        struct rec rh;
        int v = rec_decode(r->buf + off, r->size - off, r->s->entry_bytes_max, &rh);
        if (v == 0) {
            *kind = 0;
            return off;
        }
        if (v < 0 || rh.index != *expect || rh.term < *term) {
            *kind = -1;
            return off;
        }
        seg_push(g, off);
        runs_push(f, rh.index, rh.term);
        *term = rh.term;
        (*expect)++;
        off += REC_HDR + pad8(rh.len);
    }
}

static int open_seg_fd(struct recover *r, const char *name)
{
    char path[PATH_MAX];
    path_of(r->f, name, path, sizeof(path));
    int fd = r->f->fo->open(path, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        store__errbuf(r->err, r->err_len, TK_EIO, "open %s: %s", path, strerror(errno));
    return fd;
}

/* Where the valid log stops: the first anomaly recovery met. */
struct cut {
    bool found;
    size_t seg;     /* the segment it is in (index into f->segs) */
    uint64_t off;   /* its offset there; 0: the segment header is bad */
    uint64_t index; /* the index expected at that offset */
    const char *why;
};

static void cut_set(struct cut *c, size_t seg, uint64_t off, uint64_t index,
                    const char *why)
{
    *c = (struct cut){.found = true, .seg = seg, .off = off, .index = index, .why = why};
}

/* Opens every segment in `names` (those past a cut too: they are searched and
 * removed later) and scans them in order for records *expect, *expect + 1, ...
 * up to the first anomaly, which it records in *cut. On return *expect is the
 * index after the last valid record. Returns 0 or TK_EIO. */
static int scan_segments(struct recover *r, const uint64_t *names, size_t nnames,
                         uint64_t *expect, struct cut *cut)
{
    struct fs *f = r->f;
    uint64_t term = 0;
    for (size_t i = 0; i < nnames; i++) {
        char name[32];
        snprintf(name, sizeof(name), "%020llu.seg", (unsigned long long)names[i]);
        int fd = open_seg_fd(r, name);
        if (fd < 0)
            return TK_EIO;
        struct seg *g = seg_add(f, names[i], fd);
        if (cut->found)
            continue;
        if (names[i] != *expect) {
            /* i > 0: names[0] == expect */
            cut_set(cut, i - 1, f->segs[i - 1].end, *expect,
                    "entries are missing before the next segment");
            continue;
        }
        int rc = load_file(r, g);
        if (rc != 0)
            return rc;
        int kind;
        uint64_t off = scan_segment(r, g, expect, &term, &kind);
        g->end = off;
        bool last = i + 1 == nnames;
        if (kind < 0 || (last && nonzero_end(r->buf, off, r->size) > off))
            cut_set(cut, i, off, *expect, off == 0 ? "bad segment header" : "bad record");
    }
    return 0;
}

/* Tells a torn tail (never acknowledged: safe to cut off) from damage to
 * synced data: was anything at or after the cut written after the cut's
 * index had been synced? Returns 0 for a torn tail, TK_ECORRUPT (naming both
 * places) when acknowledged entries would be dropped, or TK_EIO. */
static int cut_is_torn(struct recover *r, const struct cut *c)
{
    struct fs *f = r->f;
    for (size_t i = c->seg; i < f->nsegs; i++) {
        struct seg *g = &f->segs[i];
        int rc = load_file(r, g);
        if (rc != 0)
            return rc;
        struct rec rh;
        uint64_t from = i == c->seg ? c->off + 8 : SEG_HDR;
        uint64_t p = find_synced_after(r, from, c->index, &rh);
        if (p != UINT64_MAX)
            return store__errbuf(
                r->err, r->err_len, TK_ECORRUPT,
                "%s/%s: %s at offset %llu (index %llu), but the record "
                "at offset %llu of %s (index %llu) was written after "
                "index %llu was synced: refusing to drop acknowledged "
                "entries",
                f->dir, f->segs[c->seg].name, c->why, (unsigned long long)c->off,
                (unsigned long long)c->index, (unsigned long long)p, g->name,
                (unsigned long long)rh.index, (unsigned long long)rh.synced);
    }
    return 0;
}

/* Cuts a torn tail off durably: the segments after the cut go, and the cut's
 * own segment goes too (bad header) or is zero-filled from the cut on. */
static int truncate_at(struct recover *r, const struct cut *c)
{
    struct fs *f = r->f;
    struct store *s = r->s;
    TK_LOG(TK_LOG_WARN, 0, 0,
           "store: torn tail in %s/%s at offset %llu (index %llu, %s): "
           "truncating",
           f->dir, f->segs[c->seg].name, (unsigned long long)c->off,
           (unsigned long long)c->index, c->why);
    int rc = remove_last_segs(s, c->seg + 1);
    if (rc == 0 && c->off == 0) {
        rc = remove_last_segs(s, c->seg);
    } else if (rc == 0) {
        struct seg *g = &f->segs[c->seg];
        if ((rc = load_file(r, g)) != 0)
            return rc;
        uint64_t e = nonzero_end(r->buf, c->off, r->size);
        if (e > c->off && (rc = zero_range(s, g, c->off, e - c->off)) == 0)
            rc = sync_fd(s, g->fd, g->name, false);
    }
    if (rc == 0)
        rc = sync_dir(s);
    if (rc == 0)
        runs_cut(f, c->index);
    return rc;
}

/* Segments wholly behind the log's start are leftovers of a compaction that a
 * crash cut short (the start is saved before segments go). */
static int drop_compacted(struct recover *r, uint64_t log_first)
{
    int rc = remove_first_segs(r->s, log_first);
    return rc == 0 ? sync_dir(r->s) : rc;
}

/* Recovers the log from the segments and the saved log start: scan, tell a
 * torn tail from corruption at the first anomaly, cut a torn tail off, drop
 * leftovers of a compaction, and set the bounds. */
static int recover_log(struct recover *r, const struct store_meta_state *ms)
{
    struct fs *f = r->f;
    uint64_t *names = NULL;
    size_t nnames = 0;
    int rc = list_segments(r, &names, &nnames);
    if (rc != 0)
        return rc;
    uint64_t log_first = ms->has_log_start ? ms->log_first : 1;
    uint64_t expect = nnames > 0 ? names[0] : log_first;
    struct cut cut = {.found = false};
    if (nnames > 0 && names[0] > log_first) {
        rc = store__errbuf(r->err, r->err_len, TK_ECORRUPT,
                           "%s: missing segment: the log starts at index "
                           "%llu but the first segment %020llu.seg starts at "
                           "%llu",
                           f->dir, (unsigned long long)log_first,
                           (unsigned long long)names[0], (unsigned long long)names[0]);
        goto out;
    }
    if ((rc = scan_segments(r, names, nnames, &expect, &cut)) != 0)
        goto out;
    if (cut.found) {
        if ((rc = cut_is_torn(r, &cut)) != 0 || (rc = truncate_at(r, &cut)) != 0)
            goto out;
        expect = cut.index;
    }
    if (f->nsegs > 0 && ms->has_log_start && log_first > expect) {
        rc = store__errbuf(r->err, r->err_len, TK_ECORRUPT,
                           "%s: the log should start at index %llu but the "
                           "segments end at index %llu",
                           f->dir, (unsigned long long)log_first,
                           (unsigned long long)(expect - 1));
        goto out;
    }
    if ((rc = drop_compacted(r, log_first)) != 0)
        goto out;
    f->first = log_first;
    f->last = f->nsegs > 0 ? expect - 1 : log_first - 1;
    if (f->last < f->first - 1)
        f->last = f->first - 1;
    f->prev_term = ms->has_log_start ? ms->log_prev_term : 0;
    f->durable = f->last;
out:
    tk_free(names);
    if (rc != 0 && r->err != NULL && r->err[0] == '\0')
        store__errbuf(r->err, r->err_len, rc, "%s", r->s->errmsg);
    return rc;
}

int store_open_fs(const char *dir, const struct store_options *o, struct store **out,
                  struct store_boot *boot, char *errmsg, size_t errmsg_len)
{
    if (errmsg != NULL && errmsg_len > 0)
        errmsg[0] = '\0';
    struct store *s = store__alloc(o);
    if (s->opts.segment_bytes < STORE_SEGMENT_BYTES_MIN ||
        s->opts.segment_bytes > (1ull << 31)) {
        store__free(s);
        return store__errbuf(errmsg, errmsg_len, TK_EINVAL,
                             "segment_bytes %llu out of range",
                             (unsigned long long)(o ? o->segment_bytes : 0));
    }
    uint64_t fit = s->opts.segment_bytes - SEG_HDR - REC_HDR - 8;
    if (fit < s->entry_bytes_max)
        s->entry_bytes_max = fit;
    struct fs *f = tk_calloc(1, sizeof(*f));
    pthread_mutex_init(&f->mu, NULL);
    f->dir = tk_strdup(dir);
    f->dirfd = -1;
    f->spare_fd = -1;
    f->fo = s->opts.fileops != NULL ? s->opts.fileops : &default_fileops;
    f->seg_bytes = s->opts.segment_bytes;
    s->ops = &fs_ops;
    s->be = f;
    int rc;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        rc = store__errbuf(errmsg, errmsg_len, TK_EIO, "mkdir %s: %s", dir,
                           strerror(errno));
        goto err;
    }
    f->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (f->dirfd < 0) {
        rc = store__errbuf(errmsg, errmsg_len, TK_EIO, "open %s: %s", dir,
                           strerror(errno));
        goto err;
    }
    char mpath[PATH_MAX];
    path_of(f, "meta", mpath, sizeof(mpath));
    rc = store_meta_open(mpath, &f->meta, &s->meta, errmsg, errmsg_len);
    if (rc != 0)
        goto err;
    struct recover r = {.s = s, .f = f, .err = errmsg, .err_len = errmsg_len};
    rc = recover_log(&r, &s->meta);
    unload_file(&r);
    if (rc != 0)
        goto err;
    rc = f->spare_fd < 0 ? prepare_spare(s, false, next_seg_size(f))
                         : 0; /* or recovery recycled one */
    if (rc != 0) {
        store__errbuf(errmsg, errmsg_len, rc, "%s", s->errmsg);
        goto err;
    }
    rc = store__start(s);
    if (rc != 0)
        goto err;
    store__fill_boot(s, boot);
    *out = s;
    return 0;
err:
    fs_free(f);
    store__free(s);
    return rc;
}

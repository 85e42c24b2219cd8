/* The backup file: a snapshot stream between a header and a SHA-256 trailer
 * (format in kv/backup.h). Sealing walks a stream that is already in memory;
 * checking follows a file as it is read, so a restore never holds it whole.
 *
 * The snapshot stream's layout is snapshot.c's: a 32-byte header ("TKVSNAP1",
 * index, term, clock, big-endian), records [u8 table][u32 key len][u32 value
 * len][key][value] (big-endian lengths; table 1 is the data), and a 13-byte
 * trailer [0xFF][u64 records][u32 CRC32C of everything before the CRC].
 * Calls only base/ and OpenSSL's libcrypto (its own library: the CLI links it
 * without the state machine). */
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/assert.h"
#include "base/crc32c.h"
#include "base/endian.h"
#include "base/err.h"
#include "kv/backup.h"

#define SNAP_MAGIC "TKVSNAP1"
#define SNAP_HDR 32
#define SNAP_REC_HDR 9
#define SNAP_TRAILER 13
#define SNAP_TABLE_DATA 1
#define SNAP_TABLE_MAX 3
#define SNAP_RESERVED 0x01

static int fail(char *err, size_t cap, uint64_t off, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t cap, uint64_t off, const char *fmt, ...)
{
    if (cap > 0) {
        int n = snprintf(err, cap, "offset %llu: ", (unsigned long long)off);
        va_list ap;
        va_start(ap, fmt);
        if (n >= 0 && (size_t)n < cap)
            vsnprintf(err + n, cap - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return TK_ECORRUPT;
}

/* Walks a whole stream; *keys counts the data table's records. Offsets in
 * errors are the file's (the stream starts after the backup header). */
static int walk_stream(const uint8_t *s, size_t len, uint64_t *keys, char *err,
                       size_t cap)
{
    const uint64_t base = KV_BACKUP_HEADER_BYTES;
    if (len < SNAP_HDR + SNAP_TRAILER || memcmp(s, SNAP_MAGIC, 8) != 0)
        return fail(err, cap, base, "not a snapshot stream (%zu bytes)", len);
    size_t off = SNAP_HDR;
    uint64_t recs = 0;
    *keys = 0;
    while (off < len && s[off] != 0xFF) {
        if (len - off < SNAP_REC_HDR || s[off] == 0 || s[off] > SNAP_TABLE_MAX)
            return fail(err, cap, base + off, "bad record header");
        uint64_t body = (uint64_t)tk_get_be32(s + off + 1) + tk_get_be32(s + off + 5);
        if (body > len - off - SNAP_REC_HDR)
            return fail(err, cap, base + off, "record runs past the stream");
        /* Users' keys: not the node's own records (first byte 0x01,
         * kv.h KV_RESERVED_BYTE), which a restore drops. */
        *keys += s[off] == SNAP_TABLE_DATA && !(tk_get_be32(s + off + 1) > 0 &&
                                                s[off + SNAP_REC_HDR] == SNAP_RESERVED);
        recs++;
        off += SNAP_REC_HDR + (size_t)body;
    }
    if (len - off != SNAP_TRAILER)
        return fail(err, cap, base + off, "stream trailer missing or not at the end");
    if (tk_get_be64(s + off + 1) != recs)
        return fail(
            err, cap, base + off + 1, "trailer counts %llu records, stream has %llu",
            (unsigned long long)tk_get_be64(s + off + 1), (unsigned long long)recs);
    if (tk_crc32c(0, s, len - 4) != tk_get_be32(s + len - 4))
        return fail(err, cap, base + len - 4, "stream CRC32C mismatch");
    return 0;
}

static void put_header(uint8_t *h, const struct kv_backup_info *in)
{
    memcpy(h, KV_BACKUP_MAGIC, 8);
    tk_put_le32(h + 8, in->version);
    tk_put_le32(h + 12, KV_BACKUP_HEADER_BYTES);
    tk_put_le64(h + 16, in->cluster_id);
    tk_put_le64(h + 24, in->revision);
    tk_put_le64(h + 32, in->term);
    tk_put_le64(h + 40, in->keys);
    tk_put_le64(h + 48, in->stream_bytes);
    tk_put_le64(h + 56, in->created_ms);
}

static int get_header(const uint8_t *h, struct kv_backup_info *out, char *err, size_t cap)
{
    if (memcmp(h, KV_BACKUP_MAGIC, 8) != 0)
        return fail(err, cap, 0, "not a tierkv backup (bad magic)");
    out->version = tk_get_le32(h + 8);
    if (out->version != KV_BACKUP_VERSION)
        return fail(err, cap, 8,
                    "format version %u is not supported (this build reads %u)",
                    out->version, KV_BACKUP_VERSION);
    if (tk_get_le32(h + 12) != KV_BACKUP_HEADER_BYTES)
        return fail(err, cap, 12, "header size %u, expected %u", tk_get_le32(h + 12),
                    KV_BACKUP_HEADER_BYTES);
    out->cluster_id = tk_get_le64(h + 16);
    out->revision = tk_get_le64(h + 24);
    out->term = tk_get_le64(h + 32);
    out->keys = tk_get_le64(h + 40);
    out->stream_bytes = tk_get_le64(h + 48);
    out->created_ms = tk_get_le64(h + 56);
    if (out->stream_bytes < SNAP_HDR + SNAP_TRAILER)
        return fail(err, cap, 48, "stream size %llu is too small",
                    (unsigned long long)out->stream_bytes);
    return 0;
}

/* SHA-256 fails only when libcrypto cannot allocate (tk_alloc's rule:
 * abort), never on input. */
static void sha_ok(int ok)
{
    TK_ASSERT(ok == 1);
}

static void sha256(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen,
                   uint8_t *out)
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    TK_ASSERT(md != NULL);
    sha_ok(EVP_DigestInit_ex(md, EVP_sha256(), NULL));
    sha_ok(EVP_DigestUpdate(md, a, alen));
    sha_ok(EVP_DigestUpdate(md, b, blen));
    sha_ok(EVP_DigestFinal_ex(md, out, NULL));
    EVP_MD_CTX_free(md);
}

int kv_backup_seal(const uint8_t *stream, size_t len, uint64_t cluster_id,
                   uint64_t created_ms, uint8_t *hdr, uint8_t *tr,
                   struct kv_backup_info *info, char *err, size_t err_cap)
{
    uint64_t keys = 0;
    int rc = walk_stream(stream, len, &keys, err, err_cap);
    if (rc != 0)
        return rc;
    struct kv_backup_info in = {
        .version = KV_BACKUP_VERSION,
        .cluster_id = cluster_id,
        .revision = tk_get_be64(stream + 8),
        .term = tk_get_be64(stream + 16),
        .keys = keys,
        .stream_bytes = len,
        .created_ms = created_ms,
    };
    put_header(hdr, &in);
    sha256(hdr, KV_BACKUP_HEADER_BYTES, stream, len, tr);
    if (info != NULL)
        *info = in;
    return 0;
}

/* ---- checking a file as it is read ---- */

/* Zero bytes a file may have after its trailer: etcd's Snapshot pads to a
 * size of 32 mod 512 (kv_backup_check_end checks the size). */
#define ETCD_PAD_MAX 511

struct kv_backup_check {
    EVP_MD_CTX *md;
    uint8_t hdr[KV_BACKUP_HEADER_BYTES];
    uint8_t tr[KV_BACKUP_TRAILER_BYTES];
    uint8_t shead[SNAP_HDR]; /* the stream's own header, for its magic */
    struct kv_backup_info info;
    uint64_t off;                /* file bytes consumed */
    uint64_t pad;                /* zero bytes after the trailer (ETCD_PAD_MAX) */
    size_t piece_off, piece_len; /* the stream's part of the last piece */
    int rc;
    char err[160];
};

struct kv_backup_check *kv_backup_check_new(void)
{
    struct kv_backup_check *c = tk_calloc(1, sizeof(*c));
    c->md = EVP_MD_CTX_new();
    TK_ASSERT(c->md != NULL);
    sha_ok(EVP_DigestInit_ex(c->md, EVP_sha256(), NULL));
    return c;
}

void kv_backup_check_free(struct kv_backup_check *c)
{
    if (c == NULL)
        return;
    EVP_MD_CTX_free(c->md);
    tk_free(c);
}

/* Takes up to `len` bytes into the region [lo, lo + size) of the file, whose
 * copy is dst; returns how many it took. */
static size_t take(struct kv_backup_check *c, uint64_t lo, uint64_t size, uint8_t *dst,
                   const uint8_t *buf, size_t len)
{
    if (c->off < lo || c->off >= lo + size)
        return 0;
    uint64_t want = lo + size - c->off;
    size_t n = want < len ? (size_t)want : len;
    if (dst != NULL)
        memcpy(dst + (c->off - lo), buf, n);
    c->off += n;
    return n;
}

static int check_piece(struct kv_backup_check *c, const uint8_t *buf, size_t len)
{
    const uint64_t H = KV_BACKUP_HEADER_BYTES;
    size_t used = take(c, 0, H, c->hdr, buf, len);
    if (used > 0 && c->off == H) {
        int rc = get_header(c->hdr, &c->info, c->err, sizeof(c->err));
        if (rc != 0)
            return rc;
    }
    size_t hashed = used;
    if (c->off >= H) {
        uint64_t S = c->info.stream_bytes, before = c->off;
        size_t n = take(c, H, SNAP_HDR, c->shead, buf + used, len - used);
        n += take(c, H + SNAP_HDR, S - SNAP_HDR, NULL, buf + used + n, len - used - n);
        c->piece_off = used;
        c->piece_len = n;
        if (before < H + SNAP_HDR && c->off >= H + SNAP_HDR &&
            memcmp(c->shead, SNAP_MAGIC, 8) != 0)
            return fail(c->err, sizeof(c->err), H, "the stream is not a snapshot stream");
        used += n;
        hashed = used;
        used += take(c, H + S, KV_BACKUP_TRAILER_BYTES, c->tr, buf + used, len - used);
    }
    sha_ok(EVP_DigestUpdate(c->md, buf, hashed));
    /* etcdctl 3.6's `snapshot save` keeps only files of 32 mod 512 bytes
     * (etcd's bolt pages and hash), so etcd's API sends a backup padded
     * with zeros to that (etcdapi_snapshot.c): such padding is taken. */
    for (; used < len; used++, c->off++, c->pad++)
        if (buf[used] != 0 || c->pad >= ETCD_PAD_MAX)
            return fail(c->err, sizeof(c->err), c->off, "bytes after the trailer");
    return 0;
}

int kv_backup_check_feed(struct kv_backup_check *c, const uint8_t *buf, size_t len,
                         char *err, size_t err_cap)
{
    c->piece_off = c->piece_len = 0;
    if (c->rc == 0)
        c->rc = check_piece(c, buf, len);
    if (c->rc != 0 && err_cap > 0)
        snprintf(err, err_cap, "%s", c->err);
    return c->rc;
}

void kv_backup_check_stream(const struct kv_backup_check *c, size_t *off, size_t *len)
{
    *off = c->piece_off;
    *len = c->piece_len;
}

int kv_backup_check_end(struct kv_backup_check *c, struct kv_backup_info *info, char *err,
                        size_t err_cap)
{
    if (c->rc == 0) {
        uint64_t need =
            c->off < KV_BACKUP_HEADER_BYTES
                ? KV_BACKUP_HEADER_BYTES
                : KV_BACKUP_HEADER_BYTES + c->info.stream_bytes + KV_BACKUP_TRAILER_BYTES;
        uint8_t sum[KV_BACKUP_TRAILER_BYTES];
        if (c->off < need) {
            c->rc = fail(c->err, sizeof(c->err), c->off,
                         "the file ends early (truncated): %llu bytes expected",
                         (unsigned long long)need);
        } else if (c->pad > 0 && c->off % 512 != 32) {
            c->rc = fail(c->err, sizeof(c->err), need, "bytes after the trailer");
        } else {
            sha_ok(EVP_DigestFinal_ex(c->md, sum, NULL));
            if (memcmp(sum, c->tr, sizeof(sum)) != 0)
                c->rc = fail(c->err, sizeof(c->err), need - KV_BACKUP_TRAILER_BYTES,
                             "SHA-256 mismatch: the file is damaged");
        }
    }
    if (c->rc != 0 && err_cap > 0)
        snprintf(err, err_cap, "%s", c->err);
    if (c->rc == 0 && info != NULL)
        *info = c->info;
    return c->rc;
}

int kv_backup_check_file(const char *path, struct kv_backup_info *info, char *err,
                         size_t err_cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, err_cap, "%s: %s", path, strerror(errno));
        return TK_EIO;
    }
    struct kv_backup_check *c = kv_backup_check_new();
    uint8_t *buf = tk_malloc((size_t)1 << 16);
    int rc = 0;
    for (;;) {
        ssize_t got = read(fd, buf, (size_t)1 << 16);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            snprintf(err, err_cap, "%s: read: %s", path, strerror(errno));
            rc = TK_EIO;
            break;
        }
        if (got == 0) {
            rc = kv_backup_check_end(c, info, err, err_cap);
            break;
        }
        rc = kv_backup_check_feed(c, buf, (size_t)got, err, err_cap);
        if (rc != 0)
            break;
    }
    tk_free(buf);
    kv_backup_check_free(c);
    close(fd);
    return rc;
}

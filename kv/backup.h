/* The backup file (kv/backup.c): a KV snapshot stream (kv.h, "Snapshots")
 * wrapped for keeping outside the cluster.
 *
 *   header  64 bytes, little-endian:
 *             "TKVBACK1"  magic
 *             u32 version (KV_BACKUP_VERSION), u32 header bytes (64)
 *             u64 cluster id of the cluster it was taken from
 *             u64 revision (the applied index the snapshot holds)
 *             u64 term of that index
 *             u64 keys (records of the data table, expired ones not yet
 *                 removed included, the node's own 0x01 records not)
 *             u64 stream bytes (what follows the header)
 *             u64 created, milliseconds since the Unix epoch
 *   stream  the snapshot stream, exactly as a node installs it
 *   trailer 32 bytes: SHA-256 of the header and the stream
 *
 * Built as its own small library (kv_backup_dep: base and libcrypto only), so
 * the CLI can check a file without linking the state machine. */
#ifndef TK_KV_BACKUP_H
#define TK_KV_BACKUP_H

#include <stddef.h>
#include <stdint.h>

#define KV_BACKUP_MAGIC "TKVBACK1"
#define KV_BACKUP_VERSION 1u
#define KV_BACKUP_HEADER_BYTES 64
#define KV_BACKUP_TRAILER_BYTES 32

struct kv_backup_info {
    uint32_t version;
    uint64_t cluster_id;
    uint64_t revision;
    uint64_t term;
    uint64_t keys;
    uint64_t stream_bytes;
    uint64_t created_ms;
};

/* Wraps a complete snapshot stream: walks it (its header, every record, its
 * trailer and CRC), counts the data table's records, and fills the backup
 * header hdr[KV_BACKUP_HEADER_BYTES] and trailer tr[KV_BACKUP_TRAILER_BYTES]
 * (SHA-256 of the header and the stream). O(len) CPU: run it off the loop.
 * Returns 0, or TK_ECORRUPT with a reason in err[0..err_cap). */
int kv_backup_seal(const uint8_t *stream, size_t len, uint64_t cluster_id,
                   uint64_t created_ms, uint8_t *hdr, uint8_t *tr,
                   struct kv_backup_info *info, char *err, size_t err_cap);

/* Checking a file as it is read, in pieces of any size: new, feed each
 * piece in order, then end. feed and end return 0 or TK_ECORRUPT with the
 * byte offset in the file and the reason in err (the first error sticks).
 * end needs every byte: a short file fails there. On success of end, *info
 * is the header. kv_backup_check_stream tells, after each feed, where the
 * stream's bytes of that piece begin and how many there are (so a restore
 * can install them as they pass). */
struct kv_backup_check;
struct kv_backup_check *kv_backup_check_new(void);
int kv_backup_check_feed(struct kv_backup_check *c, const uint8_t *buf, size_t len,
                         char *err, size_t err_cap);
void kv_backup_check_stream(const struct kv_backup_check *c, size_t *off, size_t *len);
int kv_backup_check_end(struct kv_backup_check *c, struct kv_backup_info *info, char *err,
                        size_t err_cap);
void kv_backup_check_free(struct kv_backup_check *c);

/* Checks a whole file at `path` (pass 1 of a restore, `tierkv snapshot
 * status`). Returns 0, TK_ECORRUPT (err: offset and reason) or TK_EIO (err:
 * the system's reason). */
int kv_backup_check_file(const char *path, struct kv_backup_info *info, char *err,
                         size_t err_cap);

#endif

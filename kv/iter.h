/* The read iterator: an LMDB-cursor-like walk over the live keys of a range,
 * in key byte order, merging the hot view with the cold tier.
 *
 *     struct kv_iter it;
 *     struct kv_item item;
 *     int rc;
 *     for (rc = kv__iter_first(&it, sm, &range, limit, &item); rc == 0;
 *          rc = kv__iter_next(&it, &item))
 *         use(&item);
 *     kv__iter_close(&it);
 *     if (rc != TK_ENOTFOUND)
 *         fail(rc); // TK_EIO
 *
 * Like mdb_cursor_get with MDB_FIRST then MDB_NEXT: each call returns 0 with
 * the next live item, or TK_ENOTFOUND past the range's end, the limit or both
 * sources, TK_EBUSY when the skip budget ran out (see skip_max), or TK_EIO.
 * The item's pointers are borrowed until the next call or
 * kv__iter_close (the iterator moves its cursors only when asked for the next
 * item). For each key the hot view holds, the index's newest record decides
 * (a tombstone or an expired record hides the cold copy; a record failing its
 * check gives way to the cold copy); a key only the cold tier holds comes from
 * its cursor. While an iterator is open the sm must not change (no apply, no
 * tier-down): it holds a position in the view and guesses at index entries
 * ahead of it. kv__iter_close must follow kv__iter_first, whatever it
 * returned. Owner thread only.
 *
 * Used by kv_sm_scan and kv_sm_digest (iter.c) and delete range (cmd.c). It is
 * internal: a public iterator would need the struct to be opaque, and so an
 * allocation per scan, where this one lives on the caller's stack. */
#ifndef TK_KV_ITER_H
#define TK_KV_ITER_H

#include "kv/sm_internal.h"

/* The hot side reads ahead: the index bucket of the key KV_ITER_AHEAD
 * positions on and the ring record of the key KV_ITER_AHEAD_REC positions on
 * are loaded while this key is merged, so the cache misses overlap instead of
 * following one another. The look-ahead stops at the limit, so short scans
 * load nothing they do not use. */
#define KV_ITER_AHEAD 16
#define KV_ITER_AHEAD_REC 8
#define KV_ITER_RING 32 /* > KV_ITER_AHEAD */

struct kv_iter {
    struct kv_sm *sm;
    const struct kv_range *r; /* borrowed */
    size_t limit, emitted;    /* limit 0: none */
    /* The hot side: the view's keys in order. */
    struct kv_view_it hot;   /* the current key, at position pos */
    struct kv_view_it ahead; /* the key at position ahead_pos */
    size_t pos, ahead_pos;
    uint64_t hash[KV_ITER_RING]; /* of the key at position p: hash[p % RING] */
    uint64_t cand[KV_ITER_RING]; /* kv__index_peek's guess at its entry */
    /* The cold side: a cursor (NULL when the cold tier is empty). */
    struct kv_cold_cur *cur;
    bool cvalid;
    bool hot_owed, cold_owed; /* moves owed past the item last returned */
    /* The skip budget (issue 19): records read that give no item (tombstones,
     * expired records, cold copies a hot one hides) cost work too. With
     * skip_max nonzero the walk stops with TK_EBUSY once that many were read
     * in all; `seen` is then the in-order key read last (borrowed,
     * valid until the next call or kv__iter_close): resume after it. */
    size_t skip_max, skipped;
    const uint8_t *seen;
    size_t seen_len;
};

int kv__iter_first(struct kv_iter *it, struct kv_sm *sm, const struct kv_range *r,
                   size_t limit, struct kv_item *out);
/* kv__iter_first with a skip budget (0: none). */
int kv__iter_first_skip(struct kv_iter *it, struct kv_sm *sm, const struct kv_range *r,
                        size_t limit, size_t skip_max, struct kv_item *out);
int kv__iter_next(struct kv_iter *it, struct kv_item *out);
void kv__iter_close(struct kv_iter *it);

#endif

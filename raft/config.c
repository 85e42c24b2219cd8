/* Membership configuration: voters and learners, and their encoding as the
 * payload of a RAFT_ENTRY_CONFIG entry. Two formats: the original one (u32
 * count, then count u64 voter ids), still written when there is no learner so
 * that old logs, snapshots and builds agree, and the learner-carrying one (u32
 * RAFT_CONFIG_V2_TAG, u32 n_voters, u32 n_learners, the voter ids, the learner
 * ids); all little-endian. The tag cannot be an old count (those are at most
 * RAFT_VOTERS_MAX). Decoding checks everything: the bytes may come from a peer.
 * Callers: raft.c (config entries, snapshots), the store and transport codecs
 * (through raft.h), tests. */
#include <string.h>

#include "base/endian.h"
#include "base/err.h"
#include "raft/raft_internal.h"

struct tk_blob *raft_config_encode(const struct raft_config *c)
{
    if (c->n_learners == 0) {
        struct tk_blob *b = tk_blob_new(4 + 8 * (size_t)c->n_voters);
        tk_put_le32(b->data, c->n_voters);
        for (uint32_t i = 0; i < c->n_voters; i++)
            tk_put_le64(b->data + 4 + 8 * i, c->voters[i]);
        return b;
    }
    size_t n = (size_t)c->n_voters + c->n_learners;
    struct tk_blob *b = tk_blob_new(12 + 8 * n);
    tk_put_le32(b->data, RAFT_CONFIG_V2_TAG);
    tk_put_le32(b->data + 4, c->n_voters);
    tk_put_le32(b->data + 8, c->n_learners);
    uint8_t *p = b->data + 12;
    for (uint32_t i = 0; i < c->n_voters; i++, p += 8)
        tk_put_le64(p, c->voters[i]);
    for (uint32_t i = 0; i < c->n_learners; i++, p += 8)
        tk_put_le64(p, c->learners[i]);
    return b;
}

/* Reads `nv` voter ids then `nl` learner ids from `p`, refusing zero and
 * duplicate ids. */
static int decode_ids(const uint8_t *p, uint32_t nv, uint32_t nl, struct raft_config *out)
{
    struct raft_config c;
    memset(&c, 0, sizeof(c));
    for (uint32_t i = 0; i < nv + nl; i++) {
        uint64_t id = tk_get_le64(p + 8 * (size_t)i);
        if (id == RAFT_NONE || raft_config_is_member(&c, id))
            return TK_ECORRUPT;
        if (i < nv)
            c.voters[c.n_voters++] = id;
        else
            c.learners[c.n_learners++] = id;
    }
    *out = c;
    return 0;
}

int raft_config_decode(const uint8_t *buf, size_t len, struct raft_config *out)
{
    if (buf == NULL || len < 4)
        return TK_ECORRUPT;
    uint32_t n = tk_get_le32(buf);
    if (n != RAFT_CONFIG_V2_TAG) {
        if (n == 0 || n > RAFT_VOTERS_MAX || len != 4 + 8 * (size_t)n)
            return TK_ECORRUPT;
        return decode_ids(buf + 4, n, 0, out);
    }
    if (len < 12)
        return TK_ECORRUPT;
    uint32_t nv = tk_get_le32(buf + 4);
    uint32_t nl = tk_get_le32(buf + 8);
    if (nv == 0 || nv > RAFT_VOTERS_MAX || nl > RAFT_LEARNERS_MAX ||
        len != 12 + 8 * ((size_t)nv + nl))
        return TK_ECORRUPT;
    return decode_ids(buf + 12, nv, nl, out);
}

bool raft_config_has(const struct raft_config *c, uint64_t id)
{
    for (uint32_t i = 0; i < c->n_voters; i++)
        if (c->voters[i] == id)
            return true;
    return false;
}

bool raft_config_has_learner(const struct raft_config *c, uint64_t id)
{
    for (uint32_t i = 0; i < c->n_learners; i++)
        if (c->learners[i] == id)
            return true;
    return false;
}

bool raft_config_is_member(const struct raft_config *c, uint64_t id)
{
    return raft_config_has(c, id) || raft_config_has_learner(c, id);
}

bool raft_config_equal(const struct raft_config *a, const struct raft_config *b)
{
    if (a->n_voters != b->n_voters || a->n_learners != b->n_learners)
        return false;
    for (uint32_t i = 0; i < a->n_voters; i++)
        if (!raft_config_has(b, a->voters[i]))
            return false;
    for (uint32_t i = 0; i < a->n_learners; i++)
        if (!raft_config_has_learner(b, a->learners[i]))
            return false;
    return true;
}

bool raft__config_valid(const struct raft_config *c)
{
    if (c->n_voters == 0 || c->n_voters > RAFT_VOTERS_MAX ||
        c->n_learners > RAFT_LEARNERS_MAX)
        return false;
    struct raft_config seen;
    memset(&seen, 0, sizeof(seen));
    for (uint32_t i = 0; i < c->n_voters + c->n_learners; i++) {
        uint64_t id = i < c->n_voters ? c->voters[i] : c->learners[i - c->n_voters];
        if (id == RAFT_NONE || raft_config_is_member(&seen, id))
            return false;
        seen.voters[seen.n_voters++] = id; /* membership is all that is asked */
    }
    return true;
}

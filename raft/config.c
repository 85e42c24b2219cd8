/* Membership configuration: the voters, and their encoding as the payload of a
 * RAFT_ENTRY_CONFIG entry (u32 count, then count u64 ids, little-endian).
 * Decoding checks everything: the bytes may come from a peer. */
#include <string.h>

#include "base/endian.h"
#include "base/err.h"
#include "raft/raft.h"

struct tk_blob *raft_config_encode(const struct raft_config *c)
{
    struct tk_blob *b = tk_blob_new(4 + 8 * (size_t)c->n_voters);
    tk_put_le32(b->data, c->n_voters);
    for (uint32_t i = 0; i < c->n_voters; i++)
        tk_put_le64(b->data + 4 + 8 * i, c->voters[i]);
    return b;
}

int raft_config_decode(const uint8_t *buf, size_t len, struct raft_config *out)
{
    if (buf == NULL || len < 4)
        return TK_ECORRUPT;
    uint32_t n = tk_get_le32(buf);
    if (n == 0 || n > RAFT_VOTERS_MAX || len != 4 + 8 * (size_t)n)
        return TK_ECORRUPT;
    struct raft_config c;
    memset(&c, 0, sizeof(c));
    for (uint32_t i = 0; i < n; i++) {
        uint64_t id = tk_get_le64(buf + 4 + 8 * i);
        if (id == RAFT_NONE || raft_config_has(&c, id))
            return TK_ECORRUPT;
        c.voters[c.n_voters++] = id;
    }
    *out = c;
    return 0;
}

bool raft_config_has(const struct raft_config *c, uint64_t id)
{
    for (uint32_t i = 0; i < c->n_voters; i++)
        if (c->voters[i] == id)
            return true;
    return false;
}

/* Explicit expiry: the leader proposes the expire commands.
 *
 * A key's TTL running out changes nothing by itself (reads hide it); the
 * leader lists the keys due at its clock (kv_sm_expired) and proposes one
 * kvpb.Expire naming them, which deletes them at one revision on every
 * replica. A leader duty (node_duty.c runs it, one command in flight at a
 * time). Loop thread only; calls no other node file. */
#include <string.h>

#include "base/alloc.h"
#include "base/blob.h"
#include "base/err.h"
#include "kv.pb-c.h"
#include "node/node_internal.h"

#define EXPIRE_KEYS_MAX 64 /* kv_sm_expired passes at most this many a call */

struct collect {
    size_t n, bytes;
    ProtobufCBinaryData keys[EXPIRE_KEYS_MAX];
    uint8_t *copy[EXPIRE_KEYS_MAX];
};

static void collect_cb(const uint8_t *key, size_t len, void *data)
{
    struct collect *c = data;
    if (c->n == EXPIRE_KEYS_MAX)
        return;
    c->copy[c->n] = tk_malloc(len);
    memcpy(c->copy[c->n], key, len);
    c->keys[c->n] = (ProtobufCBinaryData){len, c->copy[c->n]};
    c->n++;
}

static struct tk_blob *encode(struct collect *c)
{
    Kvpb__Expire e = KVPB__EXPIRE__INIT;
    e.n_keys = c->n;
    e.keys = c->keys;
    Kvpb__Command cmd = KVPB__COMMAND__INIT;
    cmd.cmd_case = KVPB__COMMAND__CMD_EXPIRE;
    cmd.expire = &e;
    size_t len = kvpb__command__get_packed_size(&cmd);
    struct tk_blob *b = tk_blob_new(len);
    kvpb__command__pack(&cmd, b->data);
    return b;
}

struct tk_blob *node__expire_build(struct node *n, uint64_t now_ms)
{
    struct collect c;
    c.n = 0;
    long got = kv_sm_expired(n->sm, now_ms, EXPIRE_KEYS_MAX, collect_cb, &c);
    struct tk_blob *cmd = got > 0 && c.n > 0 ? encode(&c) : NULL;
    for (size_t i = 0; i < c.n; i++)
        tk_free(c.copy[i]);
    return cmd;
}

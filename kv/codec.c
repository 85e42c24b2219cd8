/* The codecs: a fast decoder of the common commands (a plain put or delete)
 * and the result codec (proto kvpb.Result).
 *
 * kv__fast_decode reads a kvpb.Command without protobuf-c, pointing into the
 * buffer; whatever it accepts, protobuf-c decodes to the same fields (a unit
 * test checks), and anything else it leaves to protobuf-c. The result codec
 * serves the exactly-once table (sessions.c) and the node's forwarding path.
 * Pure functions: any thread. Called by sm.c (apply, prefetch), sessions.c
 * and the node; calls nothing else in kv/. */
#include <string.h>

#include "base/assert.h"
#include "base/err.h"
#include "kv.pb-c.h"
#include "kv/sm_internal.h"

/* ---- fast decoding of the common commands ---- */

static bool rd_varint_long(const uint8_t **pp, const uint8_t *end, uint64_t *out)
{
    const uint8_t *p = *pp;
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && p < end; shift += 7) {
        uint8_t b = *p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            if (shift == 63 && b > 1)
                return false;
            *pp = p;
            *out = v;
            return true;
        }
    }
    return false;
}

/* A varint: the one-byte ones (every tag and length of a small command)
 * inline, the rest in rd_varint_long. */
static inline bool rd_varint(const uint8_t **pp, const uint8_t *end, uint64_t *out)
{
    if (*pp < end && **pp < 0x80) {
        *out = *(*pp)++;
        return true;
    }
    return rd_varint_long(pp, end, out);
}

static inline bool rd_bytes(const uint8_t **pp, const uint8_t *end,
                            ProtobufCBinaryData *out)
{
    uint64_t len;
    if (!rd_varint(pp, end, &len) || len > (uint64_t)(end - *pp))
        return false;
    out->data = (uint8_t *)(uintptr_t)*pp;
    out->len = (size_t)len;
    *pp += len;
    return true;
}

/* Decodes a plain Put (key, value, ttl) or Delete command, with an optional
 * client id and seq, pointing into buf. Anything else (a compare, a repeated or
 * unknown field, another command) returns false and protobuf-c decodes it, so
 * every accepted input means what protobuf-c would make of it. */
bool kv__fast_decode(const uint8_t *buf, size_t len, Kvpb__Command *c, Kvpb__Put *put,
                     Kvpb__Delete *del)
{
    const uint8_t *p = buf, *end = buf + len;
    unsigned seen = 0;
    kvpb__command__init(c);
    while (p < end) {
        uint64_t tag;
        if (!rd_varint(&p, end, &tag) || tag > 63 || (seen & (1u << (tag >> 3))))
            return false;
        seen |= 1u << (tag >> 3);
        switch (tag) {
        case (1 << 3) | 0:
            if (!rd_varint(&p, end, &c->client_id))
                return false;
            break;
        case (2 << 3) | 0:
            if (!rd_varint(&p, end, &c->seq))
                return false;
            break;
        case (3 << 3) | 2:
        case (4 << 3) | 2: {
            ProtobufCBinaryData sub;
            if (c->cmd_case != KVPB__COMMAND__CMD__NOT_SET || !rd_bytes(&p, end, &sub))
                return false;
            const uint8_t *q = sub.data, *qend = sub.data + sub.len;
            unsigned sseen = 0;
            bool is_put = (tag >> 3) == 3;
            if (is_put)
                kvpb__put__init(put);
            else
                kvpb__delete__init(del);
            while (q < qend) {
                uint64_t st;
                if (!rd_varint(&q, qend, &st) || st > 63 || (sseen & (1u << (st >> 3))))
                    return false;
                sseen |= 1u << (st >> 3);
                if (st == ((1 << 3) | 2)) {
                    if (!rd_bytes(&q, qend, is_put ? &put->key : &del->key))
                        return false;
                } else if (is_put && st == ((2 << 3) | 2)) {
                    if (!rd_bytes(&q, qend, &put->value))
                        return false;
                } else if (is_put && st == ((3 << 3) | 0)) {
                    if (!rd_varint(&q, qend, &put->ttl_ms))
                        return false;
                } else {
                    return false;
                }
            }
            if (is_put) {
                c->cmd_case = KVPB__COMMAND__CMD_PUT;
                c->put = put;
            } else {
                c->cmd_case = KVPB__COMMAND__CMD_DEL;
                c->del = del;
            }
            break;
        }
        default:
            return false;
        }
    }
    return c->cmd_case != KVPB__COMMAND__CMD__NOT_SET;
}

/* ---- results ---- */

static size_t wr_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    for (; v >= 0x80; v >>= 7)
        p[n++] = (uint8_t)(v | 0x80);
    p[n++] = (uint8_t)v;
    return n;
}

/* A result without ops, as protobuf-c packs it (fields in number order,
 * zeros left out; a unit test checks the bytes are the same): every put's
 * result is encoded for the exactly-once table, and a pack through
 * protobuf-c cost about 800 instructions. */
static size_t encode_plain(const struct kv_result *r, uint8_t *buf)
{
    size_t n = 0;
    if (r->code != 0) { /* sint32: zigzag */
        buf[n++] = (1 << 3) | 0;
        n += wr_varint(buf + n, ((uint32_t)r->code << 1) ^ (uint32_t)(r->code >> 31));
    }
    if (r->revision != 0) {
        buf[n++] = (2 << 3) | 0;
        n += wr_varint(buf + n, r->revision);
    }
    if (r->succeeded) {
        buf[n++] = (3 << 3) | 0;
        buf[n++] = 1;
    }
    if (r->value != 0) { /* int64: two's complement, 10 bytes when negative */
        buf[n++] = (4 << 3) | 0;
        n += wr_varint(buf + n, (uint64_t)r->value);
    }
    if (r->deleted != 0) {
        buf[n++] = (5 << 3) | 0;
        n += wr_varint(buf + n, r->deleted);
    }
    if (r->more) {
        buf[n++] = (7 << 3) | 0;
        buf[n++] = 1;
    }
    return n;
}

size_t kv_result_encode(const struct kv_result *r, uint8_t *buf)
{
    if (r->n_ops == 0)
        return encode_plain(r, buf);
    Kvpb__Result m = KVPB__RESULT__INIT;
    Kvpb__OpResult ops[KV_TXN_OPS_MAX];
    Kvpb__OpResult *pops[KV_TXN_OPS_MAX];
    m.code = r->code;
    m.revision = r->revision;
    m.succeeded = r->succeeded;
    m.value = r->value;
    m.deleted = r->deleted;
    m.more = r->more;
    uint32_t n = r->n_ops <= KV_TXN_OPS_MAX ? r->n_ops : KV_TXN_OPS_MAX;
    for (uint32_t i = 0; i < n; i++) {
        kvpb__op_result__init(&ops[i]);
        ops[i].value = r->ops[i].value;
        ops[i].deleted = r->ops[i].deleted;
        pops[i] = &ops[i];
    }
    m.n_ops = n;
    m.ops = pops;
    size_t len = kvpb__result__get_packed_size(&m);
    TK_ASSERT(len <= KV_RESULT_ENCODED_MAX);
    return kvpb__result__pack(&m, buf);
}

/* Room for a result with KV_TXN_OPS_MAX ops as protobuf-c unpacks it (the
 * message, the ops' pointer array and each op, and its scratch: past 16
 * fields it lists the fields it scanned in slabs of 32, 64, 128, ... of 32
 * bytes each), so a decode allocates nothing: a forwarded write's answer is
 * decoded once per write. A result with more ops finds no room, which fails
 * the unpack (TK_EPROTO, as a result past KV_TXN_OPS_MAX is anyway). */
#define RESULT_ARENA_BYTES                                                               \
    (sizeof(Kvpb__Result) +                                                              \
     KV_TXN_OPS_MAX * (sizeof(Kvpb__OpResult *) + sizeof(Kvpb__OpResult) + 16) +         \
     4 * (KV_TXN_OPS_MAX + 16) * 32 + 256)

struct result_arena {
    size_t used;
    _Alignas(16) uint8_t mem[RESULT_ARENA_BYTES];
};

static void *result_arena_alloc(void *data, size_t size)
{
    struct result_arena *a = data;
    size = (size + 15) & ~(size_t)15;
    if (size > sizeof(a->mem) - a->used)
        return NULL;
    void *p = a->mem + a->used;
    a->used += size;
    return p;
}

static void result_arena_free(void *data, void *ptr)
{
    (void)data;
    (void)ptr; /* the arena goes with the stack frame */
}

int kv_result_decode(const void *buf, size_t len, struct kv_result *r)
{
    struct result_arena arena;
    arena.used = 0;
    ProtobufCAllocator alloc = {
        .alloc = result_arena_alloc, .free = result_arena_free, .allocator_data = &arena};
    Kvpb__Result *m = kvpb__result__unpack(&alloc, len, buf);
    if (m == NULL)
        return TK_EPROTO;
    int rc = 0;
    if (m->n_ops > KV_TXN_OPS_MAX) {
        rc = TK_EPROTO;
    } else {
        r->code = m->code;
        r->revision = m->revision;
        r->succeeded = m->succeeded;
        r->duplicate = false;
        r->value = m->value;
        r->deleted = m->deleted;
        r->more = m->more;
        r->n_ops = (uint32_t)m->n_ops;
        for (size_t i = 0; i < m->n_ops; i++) {
            r->ops[i].value = m->ops[i]->value;
            r->ops[i].deleted = m->ops[i]->deleted;
        }
    }
    return rc; /* nothing to free: the arena was the frame's */
}

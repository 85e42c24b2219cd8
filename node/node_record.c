/* Member records: the one decoder of a member record's value, for
 * node_member.c (changes, fences, addresses) and node_status.c (is this node
 * removed?). The formats (NODE_MEMBER_REC_V1 then a kvpb.MemberRecord; the
 * text of older builds, read but never written) are in node_internal.h.
 * Calls no other node file. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/err.h"
#include "kv.pb-c.h"
#include "node/node_internal.h"

void node__hex16(const uint8_t *b, char *out)
{
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

/* Copies the value of `name=` (up to a space) from `v` into out; false when
 * it is longer than cap - 1. */
static bool rec_field(const char *v, const char *name, char *out, size_t cap)
{
    out[0] = '\0';
    size_t nl = strlen(name);
    for (const char *p = v; (p = strstr(p, name)) != NULL; p++) {
        if ((p != v && p[-1] != ' ') || p[nl] != '=')
            continue;
        p += nl + 1;
        size_t len = strcspn(p, " ");
        if (len >= cap)
            return false;
        memcpy(out, p, len);
        out[len] = '\0';
        return true;
    }
    return true;
}

static int rec_fail(struct node_member_rec *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int rec_fail(struct node_member_rec *r, const char *fmt, ...)
{
    r->removed = false;
    r->inc[0] = r->raft[0] = r->http[0] = '\0';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why, sizeof(r->why), fmt, ap);
    va_end(ap);
    return TK_ECORRUPT;
}

/* An address as a record holds it: printable, no space, under NODE_ADDR_MAX. */
static bool rec_addr_ok(const char *a)
{
    size_t len = strlen(a);
    for (size_t i = 0; i < len; i++)
        if (a[i] <= ' ' || a[i] > '~')
            return false;
    return len < NODE_ADDR_MAX;
}

/* The text of builds before NODE_MEMBER_REC_V1 (v is NUL-terminated). */
static int rec_decode_text(const char *v, struct node_member_rec *r)
{
    char removed[8], inc[40];
    if (strncmp(v, "raft=", 5) != 0)
        return rec_fail(r, "neither a MemberRecord nor the text of an older build");
    if (!rec_field(v, "raft", r->raft, sizeof(r->raft)) ||
        !rec_field(v, "http", r->http, sizeof(r->http)) ||
        !rec_field(v, "removed", removed, sizeof(removed)) ||
        !rec_field(v, "inc", inc, sizeof(inc)))
        return rec_fail(r, "a text record with a field too long");
    if (strcmp(removed, "1") != 0 && strcmp(removed, "0") != 0 && removed[0] != '\0')
        return rec_fail(r, "a text record with removed=%s", removed);
    size_t il = strspn(inc, "0123456789abcdef");
    if (strcmp(inc, "-") != 0 && inc[0] != '\0' && (il != 32 || inc[il] != '\0'))
        return rec_fail(r, "a text record with inc=%s", inc);
    r->removed = strcmp(removed, "1") == 0;
    snprintf(r->inc, sizeof(r->inc), "%s", strcmp(inc, "-") == 0 ? "" : inc);
    if (strcmp(r->raft, "-") == 0)
        r->raft[0] = '\0';
    if (strcmp(r->http, "-") == 0)
        r->http[0] = '\0';
    return 0;
}

/* Decodes protobuf-c's allocations into a bounded buffer on the stack: a
 * value of NODE_MEMBER_REC_MAX bytes needs a message and three copies of at most
 * its bytes; more (unknown fields by the hundred) fails the unpack. */
struct rec_arena {
    size_t used;
    _Alignas(16) uint8_t buf[2 * NODE_MEMBER_REC_MAX];
};

static void *rec_arena_alloc(void *data, size_t size)
{
    struct rec_arena *a = data;
    size = (size + 15) & ~(size_t)15;
    if (size > sizeof(a->buf) - a->used)
        return NULL;
    void *p = a->buf + a->used;
    a->used += size;
    return p;
}

static void rec_arena_free(void *data, void *ptr)
{
    (void)data;
    (void)ptr; /* the arena goes with the stack frame */
}

static int rec_decode_pb(const uint8_t *v, size_t len, struct node_member_rec *r)
{
    struct rec_arena a;
    a.used = 0;
    ProtobufCAllocator alloc = {
        .alloc = rec_arena_alloc, .free = rec_arena_free, .allocator_data = &a};
    Kvpb__MemberRecord *m = kvpb__member_record__unpack(&alloc, len, v);
    if (m == NULL)
        return rec_fail(r, "%zu bytes that are no MemberRecord", len);
    if (!rec_addr_ok(m->raft) || !rec_addr_ok(m->http))
        return rec_fail(r, "an address that is no host:port");
    if (m->incarnation.len != 0 && m->incarnation.len != 16)
        return rec_fail(r, "an incarnation of %zu bytes, not 16", m->incarnation.len);
    snprintf(r->raft, sizeof(r->raft), "%s", m->raft);
    snprintf(r->http, sizeof(r->http), "%s", m->http);
    r->removed = m->removed;
    r->inc[0] = '\0';
    if (m->incarnation.len == 16)
        node__hex16(m->incarnation.data, r->inc);
    return 0;
}

int node__member_rec_decode(const uint8_t *v, size_t len, struct node_member_rec *r)
{
    memset(r, 0, sizeof(*r));
    r->found = true;
    int rc;
    if (len == 0 || len > NODE_MEMBER_REC_MAX) {
        rc = rec_fail(r, "a value of %zu bytes", len);
    } else if (v[0] == NODE_MEMBER_REC_V1) {
        rc = rec_decode_pb(v + 1, len - 1, r);
    } else if (memchr(v, '\0', len) != NULL) {
        rc = rec_fail(r, "a text record holding a NUL byte");
    } else {
        char text[NODE_MEMBER_REC_MAX + 1];
        memcpy(text, v, len);
        text[len] = '\0';
        rc = rec_decode_text(text, r);
    }
    r->corrupt = rc != 0;
    return rc;
}

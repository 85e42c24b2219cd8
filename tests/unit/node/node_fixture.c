/* The node tests' shared helpers (node_fixture.h). */
#include "tests/unit/node/node_fixture.h"

#include <check.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "kv.pb-c.h"
#include "kv/kv.h"

void nf_options(struct tk_options *o)
{
    tk_options_default(o);
    o->kv_no_sync = true;
}

struct tk_cluster *nf_cluster_start(uint32_t n, const struct tk_options *o)
{
    struct tk_options def;
    if (o == NULL) {
        nf_options(&def);
        o = &def;
    }
    struct tk_cluster *c = NULL;
    int rc = tk_cluster_start(n, o, &c);
    ck_assert_msg(rc == 0, "cluster of %u: %s", n, tk_strerror(rc));
    return c;
}

struct tk_node *nf_cluster_leader(struct tk_cluster *c)
{
    struct tk_node *l = NULL;
    ck_assert_int_eq(tk_cluster_wait_leader(c, NF_WAIT_MS, &l), 0);
    return l;
}

struct tk_node *nf_cluster_other(struct tk_cluster *c, struct tk_node *n)
{
    return tk_cluster_node(c, 0) != n ? tk_cluster_node(c, 0) : tk_cluster_node(c, 1);
}

struct tk_node *nf_single_start(void)
{
    struct tk_options o;
    nf_options(&o);
    o.id = 1;
    struct tk_node *n = NULL;
    ck_assert_int_eq(tk_node_start(&o, &n), 0);
    uint64_t t0 = tk_mono_ms();
    struct tk_status st = {0};
    for (tk_node_status(n, &st); !st.is_leader; tk_node_status(n, &st)) {
        ck_assert_msg(tk_mono_ms() - t0 < NF_WAIT_MS, "node 1 alone never led");
        usleep(5000);
    }
    return n;
}

void nf_put(struct tk_node *n, const char *k, const char *v, enum tk_mode mode,
            struct tk_write_result *res)
{
    int rc = tk_put(n, k, strlen(k), v, strlen(v), mode, res);
    ck_assert_msg(rc == 0, "put %s: %s", k, tk_strerror(rc));
}

void nf_node_options(struct node_options *o, struct transport_inproc_hub *hub)
{
    node_options_default(o);
    o->id = 1;
    o->members.n_voters = 1;
    o->members.voters[0] = 1;
    o->hub = hub;
    o->kv_no_sync = true;
}

void nf_node_wait_leader(struct node *n, uint64_t leader)
{
    uint64_t t0 = tk_mono_ms();
    struct node_status st = {0};
    for (node_status(n, &st); st.leader != leader; node_status(n, &st)) {
        ck_assert_msg(tk_mono_ms() - t0 < NF_WAIT_MS, "node %llu never seen to lead",
                      (unsigned long long)leader);
        usleep(5000);
    }
}

struct tk_blob *nf_put_cmd(const void *key, size_t key_len, const void *value,
                           size_t value_len)
{
    Kvpb__Put put = KVPB__PUT__INIT;
    put.key.data = (uint8_t *)(uintptr_t)key;
    put.key.len = key_len;
    put.value.data = (uint8_t *)(uintptr_t)value;
    put.value.len = value_len;
    Kvpb__Command c = KVPB__COMMAND__INIT;
    c.cmd_case = KVPB__COMMAND__CMD_PUT;
    c.put = &put;
    struct tk_blob *b = tk_blob_new(kvpb__command__get_packed_size(&c));
    kvpb__command__pack(&c, b->data);
    return b;
}

/* One write of nf_node_write: the request and what its callback saw. */
struct nf_write {
    struct node_req req;
    atomic_int done;
    int status; /* written before done, on the loop thread */
    int code;
};

static void nf_write_done(struct node_req *req, int status, const struct kv_result *res,
                          void *data)
{
    (void)req;
    struct nf_write *w = data;
    w->status = status;
    w->code = res != NULL ? res->code : TK_EIO;
    atomic_store(&w->done, 1);
}

void nf_node_write(struct node *n, struct tk_blob *cmd)
{
    /* On the heap: the node holds the request until its callback, which a
     * failed wait below does not see. */
    struct nf_write *w = tk_calloc(1, sizeof(*w));
    w->req.mode = NODE_MODE_APPLIED;
    w->req.cmd = cmd;
    w->req.write_cb = nf_write_done;
    w->req.data = w;
    ck_assert_int_eq(node_submit(n, &w->req), 0);
    uint64_t t0 = tk_mono_ms();
    while (!atomic_load(&w->done)) {
        ck_assert_msg(tk_mono_ms() - t0 < NF_WAIT_MS, "a write never applied");
        usleep(200);
    }
    ck_assert_msg(w->status == 0, "write: %s", tk_strerror(w->status));
    ck_assert_msg(w->code == 0, "write applied with %s", tk_strerror(w->code));
    tk_free(w);
}

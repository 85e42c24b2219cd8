/* Embedding tierkv: a three-node cluster inside one process.
 *
 * Build it against an installed tierkv (docs/embedding.md):
 *
 *     cc embed.c $(pkg-config --cflags --libs tierkv) -o embed
 *
 * tests/consumer does exactly that against a copy installed in a temporary
 * prefix; tests/unit/node/meson.build also builds it in the tree as
 * `embed_example` and runs it, also under valgrind.
 *
 *     struct tk_cluster *c;
 *     tk_cluster_start(3, &o, &c);          -- three nodes, in-process transport
 *     tk_cluster_wait_leader(c, ...);       -- elect
 *     tk_put / tk_incr / tk_get / tk_scan   -- from any node: followers forward
 *     tk_cluster_stop(c);                   -- everything in flight completes
 *
 * Exit status 0 when every step worked. */
#include <stdio.h>
#include <string.h>

#include <tierkv.h>

static int print_item(const struct tk_item *it, void *data)
{
    (void)data;
    printf("  %.*s = %.*s (version %llu)\n", (int)it->key_len, (const char *)it->key,
           (int)it->value_len, (const char *)it->value, (unsigned long long)it->version);
    return 0;
}

int main(void)
{
    struct tk_options o;
    tk_options_default(&o);
    o.kv_no_sync = true;         /* a throwaway cluster: no fsync for the KV tier */
    o.kv_map_bytes = 256u << 20; /* small enough to run under valgrind */

    struct tk_cluster *c;
    int rc = tk_cluster_start(3, &o, &c);
    if (rc != 0) {
        fprintf(stderr, "start: %s\n", tk_strerror(rc));
        return 1;
    }
    struct tk_node *leader;
    rc = tk_cluster_wait_leader(c, 20000, &leader);
    if (rc != 0)
        goto fail;

    /* Writes through a follower are forwarded to the leader. */
    struct tk_node *any = tk_cluster_node(c, 2);
    struct tk_write_result res;
    rc = tk_put(any, "city/paris", 10, "fr", 2, TK_MODE_APPLIED, &res);
    if (rc == 0)
        rc = tk_put(leader, "city/rome", 9, "it", 2, TK_MODE_COMMITTED, NULL);
    if (rc == 0)
        rc = tk_incr(any, "visits", 6, 3, TK_MODE_APPLIED, &res);
    if (rc != 0)
        goto fail;
    printf("visits = %lld at revision %llu\n", (long long)res.value,
           (unsigned long long)res.revision);

    struct tk_value v;
    rc = tk_get(any, "city/paris", 10, TK_READ_LINEARIZABLE, &v);
    if (rc != 0)
        goto fail;
    printf("city/paris = %.*s\n", (int)v.len, (const char *)v.value);
    int ok = v.len == 2 && memcmp(v.value, "fr", 2) == 0;
    tk_value_free(&v);
    if (!ok) {
        rc = TK_ECORRUPT;
        goto fail;
    }
    printf("scan city/:\n");
    rc = tk_scan(leader, "city/", 5, 0, TK_READ_LINEARIZABLE, print_item, NULL);
    if (rc != 0)
        goto fail;
    tk_cluster_stop(c);
    return 0;
fail:
    fprintf(stderr, "embed example: %s\n", tk_strerror(rc));
    tk_cluster_stop(c);
    return 1;
}

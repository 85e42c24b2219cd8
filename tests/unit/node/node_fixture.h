/* What the node tests (tests/unit/node/) share: starting an in-process
 * cluster or a single node, through the embedding API (include/tierkv.h) or
 * the runtime's own (node/node.h), waiting for its leader, and writes that
 * must succeed.
 *
 * Every failure is a Check assertion, so the fixture is for Check tests only.
 * Every wait is a bounded poll of NF_WAIT_MS at most; nothing sleeps a fixed
 * time. Call it from the test's thread, never from a node's loop. */
#ifndef TK_TESTS_NODE_FIXTURE_H
#define TK_TESTS_NODE_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "base/blob.h"
#include "include/tierkv.h"
#include "node/node.h"
#include "transport/transport.h"

/* How long any wait of the fixture lasts before it fails the test. */
#define NF_WAIT_MS 10000

/* --- The embedding API --- */

/* tk_options_default, the log unsynced (kv_no_sync): a test's starting point. */
void nf_options(struct tk_options *o);

/* Starts an in-process cluster of `n` nodes with `o` (borrowed; NULL: as
 * nf_options gives) and returns it; the caller stops it (tk_cluster_stop). */
struct tk_cluster *nf_cluster_start(uint32_t n, const struct tk_options *o);

/* The cluster's leader, waited for (tk_cluster_wait_leader, NF_WAIT_MS). */
struct tk_node *nf_cluster_leader(struct tk_cluster *c);

/* A node of `c` other than `n`: node 0, or node 1 when `n` is node 0. */
struct tk_node *nf_cluster_other(struct tk_cluster *c, struct tk_node *n);

/* Starts node 1 alone (nf_options) and returns it once it leads; the caller
 * stops it (tk_node_stop). */
struct tk_node *nf_single_start(void);

/* tk_put of the strings `k` and `v`; any error fails the test, naming the key
 * and the error. `res` may be NULL. */
void nf_put(struct tk_node *n, const char *k, const char *v, enum tk_mode mode,
            struct tk_write_result *res);

/* --- The runtime (node/node.h) --- */

/* node_options_default for node 1, the one voter, on `hub` (NULL: none), the
 * log unsynced. */
void nf_node_options(struct node_options *o, struct transport_inproc_hub *hub);

/* Waits (node_status) until `n` knows `leader` as the leader, or fails. */
void nf_node_wait_leader(struct node *n, uint64_t leader);

/* An encoded kvpb.Command putting `value` at `key` (both borrowed). The caller
 * owns the blob (node_submit takes it). */
struct tk_blob *nf_put_cmd(const void *key, size_t key_len, const void *value,
                           size_t value_len);

/* Submits the write `cmd` (taken) in applied mode and waits until it has
 * applied; fails the test unless its status and its result's code are 0. */
void nf_node_write(struct node *n, struct tk_blob *cmd);

#endif

/* tierkvd: one tierkv node with its HTTP/JSON gateway.
 *
 * Reads its configuration from flags and TIERKV_* environment variables (a
 * flag wins over the environment; options.c's table), checks it and says
 * precisely what is wrong when it is not usable (setup.c, secure.c), then
 * starts the node with the gateway on the node's loop. The main thread only
 * waits for SIGINT/SIGTERM (sigwait; the signals are blocked in every thread)
 * and then stops the node: the gateway stops accepting, in-flight requests
 * are answered (503 shutting_down, or 500 for a write whose outcome is
 * unknown) and the store and the state machine are closed. docs/tierkvd.md
 * is the manual. */
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>

#include "base/err.h"
#include "base/log.h"
#include "cmd/tierkvd/tierkvd.h"
#include "tls/tls.h"
#include "transport/transport.h"

/* glibc grows a thread's malloc arena (a 64 MiB heap reserved PROT_NONE)
 * one mprotect at a time, as far as each allocation needs: the node loop's
 * arena grows with the data, so the loop called mprotect page by page, and
 * mprotect waits for the process's mmap lock. Other threads hold that lock
 * (mapping and unmapping LMDB environments, snapshot buffers, mincore): the
 * stall probe caught the loop in mprotect, in D state, for up to 330 ms at
 * 10M keys (docs/history/benchmarks-scale.md). With a top pad of a whole heap, each
 * new heap is made read-write at once: one mprotect per 64 MiB. Setting it
 * also fixes the mmap threshold (no dynamic raising), here at glibc's
 * default 128 KiB: a bigger block stays a mapping of its own, so growing a
 * big array is an mremap, not a copy (with a 32 MiB threshold each node had
 * a turn of 3,900 page faults at about 2.4M entries, most likely such a
 * copy). Untouched pages cost no memory;
 * an arena keeps up to 64 MiB of freed top. Called before any thread starts. */
static void malloc_policy(void)
{
    (void)mallopt(M_TOP_PAD, 64 << 20);
    (void)mallopt(M_MMAP_THRESHOLD, 128 << 10);
}

/* Signals go to the main thread's sigwait only: block them before any
 * thread starts, so every thread inherits the mask. */
static void block_signals(sigset_t *set)
{
    signal(SIGPIPE, SIG_IGN);
    /* A shell without job control starts background commands with SIGINT
     * ignored; sigwait would then never see it. This daemon wants both. */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, set, NULL);
}

/* Frees what setup made beside the node (stopped or never started). */
static void release(struct tierkvd *t)
{
    gateway_free(t->gw);
    etcdapi_free(t->etcd);
    tk_tls_ctx_free(t->etcd_tls);
    tk_tls_ctx_free(t->https);
    gateway_auth_free(t->auth);
    tk_tls_ctx_free(t->no.peer_tls_server);
    tk_tls_ctx_free(t->no.peer_tls_client);
    if (t->hub)
        transport_inproc_hub_free(t->hub);
}

/* Starts the node, the gateway listening on its loop. Returns 0, or 1 after
 * saying why it did not start (2 through tierkvd_die for a refusal that is
 * the configuration's). */
static int start(struct tierkvd *t, struct node **out)
{
    int rc = node_start(&t->no, out);
    if (rc == TK_ECOMPARE && t->no.force_new_cluster) /* a second forced recovery */
        tierkvd_die("--force-new-cluster was refused: see the line above for why");
    if (rc == TK_EBUSY && t->no.data_dir != NULL) /* its LOCK is held: base/dirlock.h */
        tierkvd_die("--data-dir: \"%s\" is in use by another process (see the line "
                    "above)",
                    t->no.data_dir);
    if (rc != 0) {
        fprintf(stderr, "tierkvd: the node did not start: %s (%s)%s\n", tk_strerror(rc),
                tk_errname(rc),
                rc == TK_EINVAL ? "; check --id, --members and the tick settings"
                                : "; see the log above (raft address in use? data "
                                  "directory damaged?)");
        return 1;
    }
    if (gateway_listen_status(t->gw) != 0) {
        fprintf(stderr, "tierkvd: %s (--listen-http)\n", gateway_listen_error(t->gw));
        node_stop(*out);
        return 1;
    }
    if (t->etcd != NULL && etcdapi_listen_status(t->etcd) != 0) {
        fprintf(stderr, "tierkvd: %s (--listen-client)\n", etcdapi_listen_error(t->etcd));
        node_stop(*out);
        return 1;
    }
    if (t->etcd != NULL) {
        char ckv[GATEWAY_ADDR_MAX + 32];
        snprintf(ckv, sizeof(ckv), "etcd=%s:%u", t->client_host, etcdapi_port(t->etcd));
        tk_logf(TK_LOG_INFO, t->no.id, 0, ckv, "etcd v3 API listening");
    }
    char kvs[512], raft_addr[GATEWAY_ADDR_MAX + 8] = "inproc";
    if (t->no.listen_host != NULL)
        snprintf(raft_addr, sizeof(raft_addr), "%s:%u", t->no.listen_host,
                 t->no.listen_port);
    snprintf(kvs, sizeof(kvs), "%s=%s:%u raft=%s store=%s data_dir=%s",
             t->https != NULL ? "https" : "http", t->http_host, gateway_port(t->gw),
             raft_addr, t->cfg->store, t->no.data_dir ? t->no.data_dir : "-");
    tk_logf(TK_LOG_INFO, t->no.id, 0, kvs, "tierkvd listening");
    snprintf(kvs, sizeof(kvs), "nofile=%llu max_connections=%u reserve=%llu",
             (unsigned long long)t->nofile, t->gc.conns_max,
             (unsigned long long)t->fd_reserve);
    tk_logf(TK_LOG_INFO, t->no.id, 0, kvs, "descriptors");
    return 0;
}

/* Waits for SIGINT or SIGTERM; with open peers, says so every minute. */
static int wait_signal(const struct tierkvd *t, const sigset_t *set)
{
    int sig = 0;
    if (t->open_peers) {
        struct timespec minute = {.tv_sec = 60};
        do
            tk_logf(TK_LOG_WARN, t->no.id, 0, NULL,
                    "--insecure-peers: the raft port takes any peer; use "
                    "--peer-token-file or peer TLS");
        while ((sig = sigtimedwait(set, NULL, &minute)) < 0);
    } else {
        while (sigwait(set, &sig) != 0) {
        }
    }
    return sig;
}

int main(int argc, char **argv)
{
    malloc_policy();
    static struct tierkvd_config cfg;
    if (tierkvd_options_read(argc, argv, &cfg) != 0)
        return 0; /* --help, --help-markdown, --version */
    static struct tierkvd t;
    tierkvd_setup(&t, &cfg);
    sigset_t set;
    block_signals(&set);
    struct node *node;
    if (start(&t, &node) != 0) {
        release(&t);
        return 1;
    }
    int sig = wait_signal(&t, &set);
    char why[64];
    snprintf(why, sizeof(why), "signal=%s", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    tk_logf(TK_LOG_INFO, t.no.id, 0, why, "shutting down");
    node_stop(node);
    release(&t);
    tk_logf(TK_LOG_INFO, t.no.id, 0, NULL, "stopped");
    return 0;
}

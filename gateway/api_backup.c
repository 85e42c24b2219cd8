/* GET /v1/snapshot: a backup of the state machine (kv/backup.h), streamed
 * while writes go on.
 *
 * The node hands over a snapshot stream at or past the index applied when
 * the request came (node_backup_start: the Raft snapshot path, its LMDB work
 * on the thread pool). Sealing it (walking the records to count the keys,
 * and the SHA-256 of the file) runs on the thread pool too; the answer then
 * goes out as header, the stream by reference, trailer (http_respond_blob),
 * so the loop never copies or hashes the data. The leader answers by
 * default (a follower answers 503 not_leader with the leader's address, which
 * clients follow); ?local takes this node's state.
 *
 * Called by api.c's route table; on the gateway's loop (but seal_run, on
 * the pool, and backup_ready, on the node's loop, which hands the stream
 * back by api__bounce). Calls api_reply.c, http.c and kv/backup.c. */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include "base/alloc.h"
#include "base/blob.h"
#include "base/err.h"
#include "gateway/gateway_internal.h"
#include "kv/backup.h"

struct backup_job {
    uv_work_t work;
    struct api_req *req;
    struct tk_blob *stream;
    uint64_t cluster_id, created_ms;
    uint8_t hdr[KV_BACKUP_HEADER_BYTES];
    uint8_t tr[KV_BACKUP_TRAILER_BYTES];
    struct kv_backup_info info;
    int rc;
    char err[160];
    int ready_status; /* node_backup_start's answer, on the node's loop */
    struct tk_blob *ready_stream;
};

static void job_free(struct backup_job *j)
{
    tk_blob_unref(j->stream);
    tk_free(j);
}

static void seal_run(uv_work_t *w)
{
    struct backup_job *j = w->data;
    j->rc = kv_backup_seal(j->stream->data, j->stream->len, j->cluster_id, j->created_ms,
                           j->hdr, j->tr, &j->info, j->err, sizeof(j->err));
}

static void seal_after(uv_work_t *w, int status)
{
    struct backup_job *j = w->data;
    struct api_req *req = j->req;
    if (status != 0 || j->rc != 0) {
        /* A stream the node made that does not walk is a bug or bad memory. */
        http_respond_error(req->http, 500, "internal", NULL,
                           "the snapshot stream did not check out: %s",
                           status != 0 ? "cancelled" : j->err);
        job_free(j);
        return;
    }
    char extra[256];
    snprintf(extra, sizeof(extra),
             "X-Tierkv-Revision: %llu\r\nX-Tierkv-Keys: %llu\r\n"
             "Content-Disposition: attachment; filename=\"tierkv-%llu.backup\"\r\n",
             (unsigned long long)j->info.revision, (unsigned long long)j->info.keys,
             (unsigned long long)j->info.revision);
    http_respond_blob(req->http, 200, "application/octet-stream", extra, j->hdr,
                      sizeof(j->hdr), j->stream, j->tr, sizeof(j->tr));
    job_free(j);
}

static void backup_go(struct backup_job *j, int status, struct tk_blob *stream)
{
    if (status != 0) {
        api__respond_rc(j->req, status);
        job_free(j);
        return;
    }
    j->stream = stream;
    j->work.data = j;
    if (uv_queue_work(j->req->gw->loop, &j->work, seal_run, seal_after) != 0) {
        api__respond_rc(j->req, TK_EIO);
        job_free(j);
    }
}

static void backup_bounced(void *arg)
{
    struct backup_job *j = arg;
    backup_go(j, j->ready_status, j->ready_stream);
}

/* On the node's loop: the rest on the gateway's. */
static void backup_ready(int status, struct tk_blob *stream, uint64_t index,
                         uint64_t term, void *data)
{
    struct backup_job *j = data;
    (void)index;
    (void)term;
    j->ready_status = status;
    j->ready_stream = stream;
    api__bounce(j->req->gw, backup_bounced, j);
}

void api__snapshot(struct api_req *req, const struct query *q)
{
    struct gateway *gw = req->gw;
    bool local = false;
    if (api__parse_flag(req, q, QI_LOCAL, &local) != 0)
        return;
    struct node_status st;
    node_status(gw->node, &st);
    if (!local && st.role != RAFT_LEADER) {
        api__respond_rc(req, st.leader != 0 ? TK_ENOTLEADER : TK_ENOLEADER);
        return;
    }
    struct backup_job *j = tk_calloc(1, sizeof(*j));
    j->req = req;
    j->cluster_id = node_cluster_id(gw->node);
    j->created_ms = (uint64_t)time(NULL) * 1000;
    struct node_backup *h;
    int rc = TK_ESHUTDOWN;
    if (api__state_enter(gw)) {
        rc = node_backup_start(gw->node, backup_ready, j, &h);
        api__state_leave(gw, rc == 0);
    }
    if (rc == TK_EBUSY) {
        char retry[64];
        api__retry_after(gw, retry, sizeof(retry));
        http_respond_error(req->http, 503, "busy", retry,
                           "%d backups are being taken on this node; retry later",
                           NODE_BACKUPS_MAX);
    } else if (rc != 0) {
        api__respond_rc(req, rc);
    }
    if (rc != 0)
        tk_free(j);
}

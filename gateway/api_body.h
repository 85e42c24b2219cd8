/* api_body.c's contract with api_kv.c: JSON request bodies into kvpb
 * messages. Internal to the gateway; on the gateway's loop thread.
 *
 * A struct bctx carries one request's parse: its scratch allocations (the
 * kvpb messages point into them and into the parsed JSON, so both live
 * until the command is packed: api__body_free) and, on failure, the status
 * (400 or 413) and message that api__body_respond answers with. Functions
 * return 0 or TK_EINVAL (the failure recorded in the bctx). */
#ifndef TK_GATEWAY_API_BODY_H
#define TK_GATEWAY_API_BODY_H

#include <jansson.h>

#include "gateway/gateway_internal.h"
#include "kv.pb-c.h"

/* The kind of each op of a batch or txn, for its result (api_req.op_kinds). */
enum op_kind { OPK_PUT, OPK_DEL, OPK_INCR };

/* Temporary allocations of one request's command, freed after packing. */
struct scratch {
    void *p[8];
    size_t n;
    void **more;
    size_t n_more, cap_more;
};

/* A long string value the parse took from the body itself: its bytes,
 * between the quotes, at body[off, off + len). */
struct body_span {
    uint32_t off, len;
};

struct bctx {
    struct api_req *req;
    struct scratch sc;
    /* The "value" strings of API_BODY_SPAN_MIN bytes or more that jansson
     * saw as placeholders (api__body_parse), in body order; n_spans 0 when
     * jansson parsed the body itself. */
    struct body_span *spans;
    size_t n_spans, cap_spans;
    size_t spans_taken; /* values the command took from spans (a counter's) */
    char err[256];
    int status; /* 400 or 413 on error */
};

/* From this many bytes, a "value" string without escapes is checked (UTF-8,
 * no control character) and passed by reference, not parsed by jansson,
 * which takes 15-20 ns a byte (a 4 MB batch: 60-90 ms of CPU). */
#define API_BODY_SPAN_MIN 1024

/* The largest ttl_ms (100 years): more is a 400, not an overflow in the state
 * machine (which would answer 409 not_a_number). */
#define API_TTL_MS_MAX 3153600000000ull

/* A PUT's options: the query's, then the JSON body's added to them. */
struct put_args {
    uint64_t ttl, ifv, ifm;
    bool has_ttl, has_ifv, has_ifm, if_absent, has_lease;
};

/* Records a failure in c; returns TK_EINVAL. */
int api__body_fail(struct bctx *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Answers the failure recorded in c (400 bad_request or 413 too_large). */
void api__body_respond(struct bctx *c);
/* Frees c's scratch and the JSON `j` (NULL allowed). */
void api__body_free(struct bctx *c, json_t *j);

/* The request's body as a JSON object, or NULL (failure recorded). */
json_t *api__body_parse(struct api_req *req, struct bctx *c);
/* Only the NULL-terminated `names` may appear in `o`. */
int api__body_check_members(struct bctx *c, json_t *o, const char *what,
                            const char *const *names);
/* An optional integer member. */
int api__body_get_i64(struct bctx *c, json_t *o, const char *name, bool *present,
                      int64_t *out);

/* A PUT body {"value", "ttl_ms", "if_version", "if_mod_revision",
 * "if_absent"}: the value (pointing into j or c's scratch) and the options,
 * added to a's. */
int api__body_put(struct bctx *c, json_t *j, struct put_args *a,
                  ProtobufCBinaryData *value);
/* {"ops": [...]}: puts and deletes; sets req->op_kinds and n_ops. */
int api__body_batch(struct bctx *c, json_t *j, Kvpb__Batch *batch);
/* {"compare": [...], "then": [...], "else": [...]}; sets req->op_kinds,
 * n_ops and n_then. */
int api__body_txn(struct bctx *c, json_t *j, Kvpb__Txn *t);

/* ---- api_offload.c: large bodies decoded on the thread pool ---- */

/* Bodies from this size are decoded off the loop; at most this many at a
 * time per gateway. */
#define API_OFFLOAD_BYTES (32u << 10)
#define API_OFFLOAD_JOBS 2

/* What a write's builder needs beside the request (parsed on the loop). */
struct api_build_args {
    struct put_args put; /* PUT: the query's options */
    uint64_t lease;      /* PUT: ?lease */
    bool txn;            /* POST: a txn, else a batch */
};

/* Builds a write's command from the request (any thread: reads the request
 * and the gateway's config, writes only the request's op kinds): 0 with *cmd
 * packed (or NULL with *verdict saying why the user may not), or TK_EINVAL
 * with the failure in c. */
typedef int api_build_fn(struct api_req *req, const struct api_build_args *a,
                         struct bctx *c, struct tk_blob **cmd, int *verdict);

/* Whether req's body is one to decode off the loop. */
bool api__offload_wanted(const struct api_req *req);
/* Runs build for req on the thread pool (req held meanwhile), then
 * api__write_built on the loop. */
void api__offload(struct api_req *req, int mode, api_build_fn *build,
                  const struct api_build_args *args, node_write_cb *done_cb);
/* At the gateway's stop: the waiting ones answered 503 (not applied). */
void api__offload_stop(struct gateway *gw);
/* A builder's outcome, on the loop: the failure answered (400/413, or the
 * verdict's 400/403), else the command submitted with done_cb. */
void api__write_built(struct api_req *req, int mode, int rc, struct bctx *c,
                      struct tk_blob *cmd, int verdict, node_write_cb *done_cb);

#endif

/* tierkv's error codes: the one list, shared by the tree (base/err.h) and the
 * public embedding header (tierkv.h), and installed with it. Functions return 0
 * or a negative TK_E* code; tk_strerror() and tk_errname() (declared by both
 * headers) name them. Values never change meaning. */
#ifndef TIERKV_ERRORS_H
#define TIERKV_ERRORS_H

/* Marks the exported functions: visible even when the library (or an embedder
 * compiling its sources) builds with -fvisibility=hidden. Here rather than in
 * tierkv.h so that base/err.h's tk_strerror and tk_errname carry it too. */
#ifndef TK_API
#if defined(__GNUC__) || defined(__clang__)
#define TK_API __attribute__((visibility("default")))
#else
#define TK_API
#endif
#endif

/* X(name, value, message) */
#define TK_ERRORS(X)                                                                     \
    X(TK_OK, 0, "success")                                                               \
    X(TK_ENOMEM, -1, "out of memory")                                                    \
    X(TK_EINVAL, -2, "invalid argument")                                                 \
    X(TK_EBUSY, -3, "busy: a queue or window is full, try again")                        \
    X(TK_ENOLEADER, -4, "no leader is known")                                            \
    X(TK_ENOTLEADER, -5, "this node is not the leader")                                  \
    X(TK_EIO, -6, "input/output error")                                                  \
    X(TK_ENOSPC, -7, "no space left on the volume")                                      \
    X(TK_ECORRUPT, -8, "data is corrupt")                                                \
    X(TK_ETIMEDOUT, -9, "timed out")                                                     \
    X(TK_ECLOSED, -10, "closed")                                                         \
    X(TK_ETOOBIG, -11, "too large")                                                      \
    X(TK_ENOTFOUND, -12, "not found")                                                    \
    X(TK_ECOMPARE, -13, "compare failed")                                                \
    X(TK_EPROTO, -14, "protocol error")                                                  \
    X(TK_ESHUTDOWN, -15, "shutting down")                                                \
    X(TK_ECOMPACTED, -16, "log index is compacted")                                      \
    X(TK_EUNAVAIL, -17, "log index is not available")                                    \
    X(TK_ELOST, -18, "proposal lost: leadership changed before commit")                  \
    X(TK_ERANGE, -19, "value out of range")

enum tk_err {
#define TK__ERR_ENUM(name, value, msg) name = (value),
    TK_ERRORS(TK__ERR_ENUM)
#undef TK__ERR_ENUM
};

#endif

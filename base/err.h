/* Error codes for all of tierkv.
 *
 * Functions return 0 or a negative TK_E* code. The list is defined once, in
 * TK_ERRORS, which also gives tk_strerror(). libuv and LMDB codes are translated
 * at the module boundary and never leak upward. */
#ifndef TK_BASE_ERR_H
#define TK_BASE_ERR_H

#include "include/tierkv_errors.h"

/* A static, human-readable message for `rc`; "unknown error" for codes that are
 * not in TK_ERRORS. Thread-safe. Exported by libtierkv.so (TK_API), as tierkv.h
 * declares it too. */
TK_API const char *tk_strerror(int rc);

/* The symbolic name ("TK_EBUSY") of `rc`, or "TK_E?" if unknown. Thread-safe. */
TK_API const char *tk_errname(int rc);

#endif

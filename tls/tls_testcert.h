/* Test certificates (tls_testcert.c), for tests and benchmarks only: built
 * as its own static library (tk_tls_testcert, tls/meson.build), which
 * libtierkv does not contain. Any thread; no state. */
#ifndef TK_TLS_TESTCERT_H
#define TK_TLS_TESTCERT_H

#include <stddef.h>

/* Writes a new P-256 key and a self-signed certificate (its own CA) naming
 * names[0..n_names) (DNS SANs; the first is also the CN), valid from a minute
 * ago for `days` days (a negative count: expired two days before it was
 * made), as PEM files at cert_path and key_path (borrowed). Returns 0,
 * TK_EINVAL (no name) or TK_EIO. */
int tk_tls_testcert_write(const char *cert_path, const char *key_path,
                          const char *const *names, size_t n_names, int days);

#endif

/* Self-signed certificates made in memory (libcrypto), for the tests and the
 * benchmarks that need TLS without an openssl command (tls_testcert.h,
 * tk_tls_testcert_write). Not for production: no CA, one key per call. Built
 * as the test-only library tk_tls_testcert, never into libtierkv. */
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <string.h>

#include "base/err.h"
#include "tls/tls_testcert.h"

static int add_ext(X509 *x, int nid, const char *value)
{
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, x, x, NULL, NULL, 0);
    X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
    if (e == NULL)
        return TK_EIO;
    int ok = X509_add_ext(x, e, -1);
    X509_EXTENSION_free(e);
    return ok == 1 ? 0 : TK_EIO;
}

static X509 *make_cert(EVP_PKEY *key, const char *const *names, size_t n, int days)
{
    X509 *x = X509_new();
    char san[1024] = "";
    size_t len = 0;
    for (size_t i = 0; i < n && len < sizeof(san); i++)
        len += (size_t)snprintf(san + len, sizeof(san) - len, "%sDNS:%s", i ? "," : "",
                                names[i]);
    X509_NAME *name = x != NULL ? X509_get_subject_name(x) : NULL;
    if (x == NULL || len >= sizeof(san) || X509_set_version(x, 2) != 1 ||
        ASN1_INTEGER_set(X509_get_serialNumber(x), 1) != 1 ||
        X509_gmtime_adj(X509_getm_notBefore(x), days < 0 ? -2L * 86400 : -60) == NULL ||
        X509_gmtime_adj(X509_getm_notAfter(x), (long)days * 86400) == NULL ||
        X509_set_pubkey(x, key) != 1 ||
        X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                   (const unsigned char *)names[0], -1, -1, 0) != 1 ||
        X509_set_issuer_name(x, name) != 1 ||
        add_ext(x, NID_basic_constraints, "critical,CA:TRUE") != 0 ||
        add_ext(x, NID_subject_alt_name, san) != 0 ||
        X509_sign(x, key, EVP_sha256()) == 0) {
        X509_free(x);
        return NULL;
    }
    return x;
}

int tk_tls_testcert_write(const char *cert_path, const char *key_path,
                          const char *const *names, size_t n_names, int days)
{
    if (n_names == 0)
        return TK_EINVAL;
    EVP_PKEY *key = EVP_EC_gen("P-256");
    X509 *x = key != NULL ? make_cert(key, names, n_names, days) : NULL;
    FILE *cf = x != NULL ? fopen(cert_path, "w") : NULL;
    FILE *kf = cf != NULL ? fopen(key_path, "w") : NULL;
    int rc = kf != NULL && PEM_write_X509(cf, x) == 1 &&
                     PEM_write_PrivateKey(kf, key, NULL, NULL, 0, NULL, NULL) == 1
                 ? 0
                 : TK_EIO;
    if (cf != NULL && fclose(cf) != 0)
        rc = TK_EIO;
    if (kf != NULL && fclose(kf) != 0)
        rc = TK_EIO;
    X509_free(x);
    EVP_PKEY_free(key);
    return rc;
}

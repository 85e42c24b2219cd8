/* A truncate for the store tests: the library has none (store_append applies
 * Raft's rule, discarding a conflicting suffix itself), but the contract
 * suite checks each backend's cut (ops->truncate) on its own, and the fault
 * tests check that a failed store refuses it. Built from the store's
 * internals the way store.c's synchronous mutators are: under write_mu, a
 * failed store stays failed, a failed cut fails the store. Header-only
 * (static) so each test binary stays one file plus its helpers. */
#ifndef TK_TESTS_STORE_TRUNCATE_H
#define TK_TESTS_STORE_TRUNCATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "base/err.h"
#include "store/store_internal.h"

/* Discards every entry with index >= `index` (first_index..last_index + 1;
 * last_index + 1 is a no-op), durably. Blocks. Returns 0, TK_EINVAL (out of
 * range, see store_errmsg), or the store's failure (the cut's, or an earlier
 * one). */
static inline int tl_truncate(struct store *s, uint64_t index)
{
    pthread_mutex_lock(&s->write_mu);
    int rc = atomic_load(&s->failed);
    if (rc != 0)
        goto out;
    uint64_t first, last;
    s->ops->bounds(s, &first, &last);
    if (index < first || index > last + 1) {
        rc = store__err(s, TK_EINVAL, "truncate at index %llu: the log holds %llu..%llu",
                        (unsigned long long)index, (unsigned long long)first,
                        (unsigned long long)last);
        goto out;
    }
    if (index == last + 1)
        goto out;
    rc = s->ops->truncate(s, index);
    if (rc != 0)
        rc = store__fail(s, rc);
out:
    pthread_mutex_unlock(&s->write_mu);
    return rc;
}

#endif

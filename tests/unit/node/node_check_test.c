/* The node's invariant check (node/node_check.c): each invariant broken on a
 * state of the test's own must be named; the same state intact passes; and a
 * running node passes it after every turn (node.c checks unless NDEBUG, so the
 * node tests exercise it). */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "node/node_internal.h"
#include "tests/check_run.h"

static struct node_req reqs[8];

static void lists(struct node_requests *q, struct req_list *fwd)
{
    memset(q, 0, sizeof(*q));
    memset(fwd, 0, sizeof(*fwd));
    memset(reqs, 0, sizeof(reqs));
    for (int i = 0; i < 3; i++) {
        reqs[i].index = 10 + (uint64_t)i;
        node__list_push(&q->applied_wait, &reqs[i]);
    }
    reqs[3].is_read = 1;
    node__list_push(&q->read_wait, &reqs[3]);
    node__list_push(fwd, &reqs[4]);
}

START_TEST(test_lists)
{
    struct node_requests q;
    struct req_list fwd, gate = {0};
    lists(&q, &fwd);
    ck_assert_ptr_null(node__check_lists(&q, &fwd, &gate));

    q.applied_wait.n = 4; /* a count the walk does not reach */
    ck_assert_ptr_nonnull(node__check_lists(&q, &fwd, &gate));
    lists(&q, &fwd);
    q.applied_wait.n = 2; /* more on the list than its count */
    ck_assert_ptr_nonnull(node__check_lists(&q, &fwd, &gate));
    lists(&q, &fwd);
    q.applied_wait.tail = &reqs[1]; /* a tail that is not the last */
    ck_assert_ptr_nonnull(node__check_lists(&q, &fwd, &gate));
    lists(&q, &fwd);
    q.committed_wait.n = 1; /* empty, with a count */
    ck_assert_ptr_nonnull(node__check_lists(&q, &fwd, &gate));
    lists(&q, &fwd);
    reqs[1].is_read = 1; /* a read among the writes */
    ck_assert_ptr_nonnull(node__check_lists(&q, &fwd, &gate));
    lists(&q, &fwd);
    reqs[3].is_read = 0; /* a write among the reads */
    ck_assert_ptr_nonnull(node__check_lists(&q, &fwd, &gate));
    lists(&q, &fwd);
    reqs[2].index = 0; /* a proposed write without its index */
    ck_assert_ptr_nonnull(node__check_lists(&q, &fwd, &gate));
    lists(&q, &fwd);
    reqs[0].cmd = tk_blob_new(1); /* one that kept its command */
    ck_assert_ptr_nonnull(node__check_lists(&q, &fwd, &gate));
    tk_blob_unref(reqs[0].cmd);
    lists(&q, &fwd);
    reqs[4].is_read = 1; /* a read among the forwarded writes */
    ck_assert_ptr_nonnull(node__check_lists(&q, &fwd, &gate));
    lists(&q, &fwd);
    gate.n = 1; /* the gate's held writes: empty, with a count */
    ck_assert_ptr_nonnull(node__check_lists(&q, &fwd, &gate));
}
END_TEST

START_TEST(test_persist)
{
    uint64_t seq[4] = {7, 8, 5, 6}; /* a ring of 4 from head 2: 5 6 7 8 */
    bool async[4] = {true, true, true, true};
    uint64_t ns[4] = {0};
    struct node_persist p;
    memset(&p, 0, sizeof(p));
    ck_assert_ptr_null(node__check_persist(&p)); /* never used */
    p.seq = seq;
    p.async = async;
    p.ns = ns;
    p.cap = 4;
    p.head = 2;
    p.n = 4;
    ck_assert_ptr_null(node__check_persist(&p));
    seq[0] = 6; /* 5 6 6 8 */
    ck_assert_ptr_nonnull(node__check_persist(&p));
    seq[0] = 7;
    p.head = 4; /* past the capacity */
    ck_assert_ptr_nonnull(node__check_persist(&p));
    p.head = 2;
    p.n = 5;
    ck_assert_ptr_nonnull(node__check_persist(&p));
    p.n = 3;
    ck_assert_ptr_null(node__check_persist(&p));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("node_check");
    TCase *tc = tcase_create("check");
    tcase_add_test(tc, test_lists);
    tcase_add_test(tc, test_persist);
    suite_add_tcase(s, tc);
    return tk_check_run(srunner_create(s));
}

/* The loop's CPU per turn (issue 48): node_metrics.loop_turn_max_cpu_ns,
 * loop_turns_held and loop_turn_held_max_ns. A single-voter node on its own
 * loop thread with a 40 ms election timeout (half: 20 ms); its on_applied
 * hook, run inside a loop turn, spins on the CPU or sleeps for as long as a
 * case asks, so that the turn holds the CPU or only takes time. */
#include <check.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#include "node/node.h"
#include "tests/check_run.h"
#include "tests/unit/node/node_fixture.h"
#include "transport/transport.h"

#define MS 1000000ull

static atomic_uint spin_ms;  /* the next applied step spins this long on the CPU */
static atomic_uint sleep_ms; /* ... or sleeps this long */

static uint64_t clock_ns(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void on_applied(struct node *n, struct uv_loop_s *loop, void *data)
{
    (void)n;
    (void)loop;
    (void)data;
    unsigned spin = atomic_exchange(&spin_ms, 0), nap = atomic_exchange(&sleep_ms, 0);
    uint64_t t0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    while (clock_ns(CLOCK_THREAD_CPUTIME_ID) - t0 < spin * MS)
        ;
    if (nap != 0) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)(nap * MS)};
        nanosleep(&ts, NULL);
    }
}

static struct node *start(struct transport_inproc_hub **hub)
{
    *hub = transport_inproc_hub_new(7);
    struct node_options o;
    nf_node_options(&o, *hub);
    o.tick_ms = 10;
    o.election_ticks = 4; /* 40 ms: half is 20 ms */
    o.on_applied = on_applied;
    struct node *n = NULL;
    ck_assert_int_eq(node_start(&o, &n), 0);
    nf_node_wait_leader(n, 1); /* it elects itself */
    return n;
}

/* One put through the loop; returns once applied. */
static void put(struct node *n)
{
    nf_node_write(n, nf_put_cmd("k", 1, "v", 1));
}

/* The metrics once the loop published the turn that ran the hook (turns
 * publish at their end: the next write's turn has). */
static void metrics(struct node *n, struct node_metrics *m)
{
    put(n);
    node_metrics(n, m);
}

START_TEST(test_turn_holding_the_cpu_past_half_the_timeout_counts_as_held)
{
    struct transport_inproc_hub *hub;
    struct node *n = start(&hub);
    struct node_metrics m0, m;
    metrics(n, &m0);
    printf("before: held %llu, longest turn %.1f ms of CPU\n",
           (unsigned long long)m0.loop_turns_held, m0.loop_turn_max_cpu_ns / 1e6);

    /* 30 ms on the CPU in one turn: wall over 20 ms and CPU over 20 ms. */
    atomic_store(&spin_ms, 30);
    put(n);
    metrics(n, &m);
    printf("spin 30 ms: held %llu, held max %.1f ms, longest turn %.1f ms of CPU\n",
           (unsigned long long)m.loop_turns_held, m.loop_turn_held_max_ns / 1e6,
           m.loop_turn_max_cpu_ns / 1e6);
    ck_assert_uint_eq(m.loop_turns_held, m0.loop_turns_held + 1);
    ck_assert_uint_ge(m.loop_turn_held_max_ns, 30 * MS);
    ck_assert_uint_ge(m.loop_turn_max_cpu_ns, 29 * MS); /* the longest turn yet */
    ck_assert_uint_le(m.loop_turn_max_cpu_ns, m.loop_turn_held_max_ns);

    /* 10 ms of CPU: not held (and shorter than half the timeout). */
    uint64_t held = m.loop_turns_held;
    atomic_store(&spin_ms, 10);
    put(n);
    metrics(n, &m);
    ck_assert_uint_eq(m.loop_turns_held, held);

    /* A turn that sleeps 150 ms: the longest now, with little CPU, not held;
     * the held maximum stays the spinning turn's. */
    uint64_t held_max = m.loop_turn_held_max_ns;
    atomic_store(&sleep_ms, 150);
    put(n);
    metrics(n, &m);
    printf("sleep 150 ms: held %llu, held max %.1f ms, longest turn %.1f ms of CPU\n",
           (unsigned long long)m.loop_turns_held, m.loop_turn_held_max_ns / 1e6,
           m.loop_turn_max_cpu_ns / 1e6);
    ck_assert_uint_eq(m.loop_turns_held, held);
    ck_assert_uint_eq(m.loop_turn_held_max_ns, held_max);
    ck_assert_uint_lt(m.loop_turn_max_cpu_ns, NODE_HELD_CPU_NS);
    node_stop(n);
    transport_inproc_hub_free(hub);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("node_turn");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_turn_holding_the_cpu_past_half_the_timeout_counts_as_held);
    suite_add_tcase(s, tc);
    return tk_check_run(srunner_create(s));
}

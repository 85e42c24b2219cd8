/* Clock readers: the monotonic clock (for timeouts, latencies and rates), the
 * wall clock (for times that leave the process: lease and record times, log
 * lines) and the calling thread's CPU time.
 *
 * The only copy: the structure test fails on a second clock_gettime wrapper
 * outside base/. Header-only, static inline, any thread. raft/ never includes
 * this: its time comes from its caller. */
#ifndef TK_BASE_CLOCK_H
#define TK_BASE_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t tk__clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* CLOCK_MONOTONIC in nanoseconds and milliseconds. */
static inline uint64_t tk_mono_ns(void)
{
    return tk__clock_ns(CLOCK_MONOTONIC);
}

static inline uint64_t tk_mono_ms(void)
{
    return tk_mono_ns() / 1000000u;
}

/* CLOCK_REALTIME in milliseconds since the epoch. */
static inline uint64_t tk_wall_ms(void)
{
    return tk__clock_ns(CLOCK_REALTIME) / 1000000u;
}

/* The calling thread's CPU time in nanoseconds (a syscall: not for every
 * turn's hot path). */
static inline uint64_t tk_thread_cpu_ns(void)
{
    return tk__clock_ns(CLOCK_THREAD_CPUTIME_ID);
}

#endif

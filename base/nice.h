/* A thread's nice value, lowered for background work and given back.
 *
 * Linux keeps a nice value per thread (setpriority(PRIO_PROCESS, tid)). A
 * thread may always lower its priority (raise its nice value), but raising it
 * again needs CAP_SYS_NICE or an RLIMIT_NICE that allows the old value: a
 * pool thread that could not come back would run every later job at the low
 * priority. So tk_nice_enter goes past `floor` only where the way back is
 * open, and tk_nice_leave gives back what tk_nice_enter took. Any thread;
 * each call acts on the calling thread, except tk_nice_set (any thread's).
 * tk_thread_wait_ns says what the priority costs: the time a thread spent
 * runnable, waiting for a core. */
#ifndef TK_BASE_NICE_H
#define TK_BASE_NICE_H

#include <stdbool.h>
#include <stdint.h>

/* No change to give back (what tk_nice_enter returns when it changed nothing). */
#define TK_NICE_UNCHANGED (-1000)

/* Whether this thread may set its nice value back to `was` once it has gone
 * above it (root, or RLIMIT_NICE allows `was`). */
bool tk_nice_restorable(int was);

/* Raises the calling thread's nice value to `nice`, or to `floor` instead
 * when `nice` > `floor` and the current value could not be restored from
 * there (tk_nice_restorable). Never lowers it. Returns the value to give back
 * with tk_nice_leave, or TK_NICE_UNCHANGED. */
int tk_nice_enter(int nice, int floor);

/* Gives the calling thread back the value tk_nice_enter returned (a no-op
 * for TK_NICE_UNCHANGED, or where the process may not). */
void tk_nice_leave(int was);

/* The calling thread's id, for tk_nice_set from another thread. */
int tk_nice_tid(void);

/* Sets thread `tid`'s nice value (0, or -errno). */
int tk_nice_set(int tid, int nice);

/* Thread `tid`'s nice value into *out (0, or -errno). */
int tk_nice_get(int tid, int *out);

/* The calling thread's time runnable on a run queue, waiting for a core
 * (from /proc: three system calls), or 0 where the kernel does not say. */
uint64_t tk_thread_wait_ns(void);

#endif

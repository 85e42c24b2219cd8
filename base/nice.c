/* Per-thread nice values (base/nice.h). */
#include "base/nice.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

bool tk_nice_restorable(int was)
{
    struct rlimit rl;
    if (geteuid() == 0)
        return true;
    if (getrlimit(RLIMIT_NICE, &rl) != 0)
        return false;
    /* RLIMIT_NICE r allows nice values down to 20 - r. */
    return rl.rlim_cur == RLIM_INFINITY || 20 - (long)rl.rlim_cur <= was;
}

int tk_nice_tid(void)
{
    return (int)syscall(SYS_gettid);
}

int tk_nice_get(int tid, int *out)
{
    errno = 0;
    int v = getpriority(PRIO_PROCESS, (id_t)tid);
    if (errno != 0)
        return -errno;
    *out = v;
    return 0;
}

int tk_nice_set(int tid, int nice)
{
    return setpriority(PRIO_PROCESS, (id_t)tid, nice) == 0 ? 0 : -errno;
}

int tk_nice_enter(int nice, int floor)
{
    int tid = tk_nice_tid();
    int was;
    if (tk_nice_get(tid, &was) != 0)
        return TK_NICE_UNCHANGED;
    if (nice > floor && !tk_nice_restorable(was))
        nice = floor;
    if (was < nice && tk_nice_set(tid, nice) == 0)
        return was;
    return TK_NICE_UNCHANGED;
}

void tk_nice_leave(int was)
{
    if (was != TK_NICE_UNCHANGED)
        (void)tk_nice_set(tk_nice_tid(), was);
}

/* The second field of /proc/thread-self/schedstat. Raw system calls:
 * ThreadSanitizer tracks descriptors by number, and libuv (not
 * instrumented) closes its own with syscall(SYS_close), which it does not
 * see; a number libuv freed and this open reused then looked like a race
 * with libuv's epoll_create1 on another node's thread (a false report). */
uint64_t tk_thread_wait_ns(void)
{
    long fd = syscall(SYS_openat, AT_FDCWD, "/proc/thread-self/schedstat",
                      O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    char buf[96];
    long got = syscall(SYS_read, fd, buf, sizeof(buf) - 1);
    syscall(SYS_close, fd);
    if (got <= 0)
        return 0;
    buf[got] = 0;
    char *end;
    strtoull(buf, &end, 10); /* time on the CPU */
    return strtoull(end, NULL, 10);
}

/* The stall probe (node_options.stall_probe_ms): a thread that looks at the
 * loop thread from outside while a turn runs long, to tell what held it.
 *
 * The slow-turn warning (node.c) comes at a turn's end, with the turn's CPU,
 * faults and context switches: it says that the loop waited, not on what. A
 * turn that took 60 ms with 0 ms of CPU and one voluntary switch was blocked
 * once, on a lock, a page, the disk or a system call, and only the kernel's
 * view of the thread while it waits names which. So every period (a quarter
 * of stall_probe_ms) this thread reads the loop thread's
 * /proc/self/task/TID/syscall; a turn is running when the loop is not in
 * epoll_wait (or poll, with a client loop) and has not ended a turn (n->loop.turns,
 * bumped by on_prepare) since the last look. Once a turn has run stall_probe_ms, and
 * again at each further stall_probe_ms (at most STALL_REPORTS times), it logs the
 * thread's state, system call and arguments, wait channel and kernel stack (the stack
 * only where /proc allows it: root). The loop itself does nothing more than
 * bump a counter per turn; each look costs the probe one open and read.
 *
 * A turn that is on the CPU shows only "running" there; for those the first
 * report of a turn also logs the loop thread's own stack: the probe sends it
 * STACK_SIGNAL (a real-time signal, handled process-wide once a probe runs),
 * whose handler writes backtrace() into one shared slot. Frames are named as
 * backtrace_symbols names them: "tierkvd(+0x4a3b1)" for the executable's own
 * functions (addr2line -f -e tierkvd 0x4a3b1 names them), library functions
 * by name. The signal may cut a system call of the loop short (libuv retries
 * what EINTR interrupts). Not under ThreadSanitizer, which defers signals.
 *
 * Only for a node with its own loop thread (not a shared loop). Called by
 * node.c (start, stop); reads n->loop.turns and n->stall. */
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "node/node_internal.h"

#define STALL_REPORTS 4 /* reports per long turn */
#define STACK_SIGNAL (SIGRTMIN + 4)
#define STACK_FRAMES 24
#define STACK_WAIT_US 20000 /* for the handler to have run */

#if defined(__SANITIZE_THREAD__)
#define STACK_GRAB 0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define STACK_GRAB 0
#endif
#endif
#ifndef STACK_GRAB
#define STACK_GRAB 1
#endif

/* The one slot the handler writes (probes of several nodes in a process
 * take turns: state goes idle -> asked (a probe) -> filled (the handler) ->
 * idle (that probe)). */
static struct {
    atomic_int state;
    int n;
    void *frames[STACK_FRAMES];
} grab;
enum { GRAB_IDLE, GRAB_ASKED, GRAB_FILLED };
static pthread_once_t grab_once = PTHREAD_ONCE_INIT;
static bool grab_ok;

static void grab_handler(int sig)
{
    (void)sig;
    int saved = errno;
    if (atomic_load(&grab.state) == GRAB_ASKED) {
        grab.n = backtrace(grab.frames, STACK_FRAMES);
        atomic_store(&grab.state, GRAB_FILLED);
    }
    errno = saved;
}

static void grab_init(void)
{
    void *warm[2];
    (void)backtrace(warm, 2); /* loads the unwinder here, not in the handler */
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = grab_handler;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    grab_ok = STACK_GRAB && sigaction(STACK_SIGNAL, &sa, NULL) == 0;
}

/* "dir/file(sym+0x1) [0xaddr]" -> "file(sym+0x1)", appended to out. */
static size_t frame_name(const char *sym, char *out, size_t o, size_t cap, bool first)
{
    const char *end = strchr(sym, ' ');
    size_t len = end != NULL ? (size_t)(end - sym) : strlen(sym);
    const char *base = sym;
    for (const char *c = sym; c < sym + len && *c != '('; c++)
        if (*c == '/')
            base = c + 1;
    len -= (size_t)(base - sym);
    int w = snprintf(out + o, cap - o, "%s%.*s", first ? "" : " < ", (int)len, base);
    return w < 0 || (size_t)w >= cap - o ? o : o + (size_t)w;
}

/* The loop thread's user-space stack, innermost first, into out. */
static void user_stack(pid_t tid, char *out, size_t cap)
{
    snprintf(out, cap, "unavailable");
    pthread_once(&grab_once, grab_init);
    int idle = GRAB_IDLE;
    if (!grab_ok || !atomic_compare_exchange_strong(&grab.state, &idle, GRAB_ASKED))
        return;
    if (syscall(SYS_tgkill, getpid(), tid, STACK_SIGNAL) == 0) {
        for (int waited = 0;
             waited < STACK_WAIT_US && atomic_load(&grab.state) != GRAB_FILLED;
             waited += 100)
            usleep(100);
    }
    int asked = GRAB_ASKED;
    if (atomic_compare_exchange_strong(&grab.state, &asked, GRAB_IDLE))
        return; /* no answer in time: a late handler finds the slot idle */
    char **syms = backtrace_symbols(grab.frames, grab.n);
    if (syms != NULL) {
        size_t o = 0;
        /* frames[0] is the handler, frames[1] the signal's return trampoline */
        for (int i = 2; i < grab.n; i++)
            o = frame_name(syms[i], out, o, cap, i == 2);
        free(syms);
    }
    atomic_store(&grab.state, GRAB_IDLE);
}

/* Reads /proc/self/task/TID/<what> into buf (at most cap - 1 bytes, NUL
 * terminated, newlines turned into spaces). Returns the length, 0 if
 * unreadable. */
static size_t read_task(pid_t tid, const char *what, char *buf, size_t cap)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/task/%d/%s", (int)tid, what);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t len = read(fd, buf, cap - 1);
    close(fd);
    if (len <= 0)
        return 0;
    size_t n = (size_t)len;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        n--;
    buf[n] = 0;
    for (size_t i = 0; i < n; i++)
        if (buf[i] == '\n')
            buf[i] = ' ';
    return n;
}

/* Whether the syscall file says the thread waits for events (the loop is
 * between turns). */
static bool waiting_for_events(const char *sc)
{
    long nr = -1;
    if (sscanf(sc, "%ld", &nr) != 1)
        return false; /* "running" */
#ifdef SYS_epoll_wait
    if (nr == SYS_epoll_wait)
        return true;
#endif
#ifdef SYS_epoll_pwait
    if (nr == SYS_epoll_pwait)
        return true;
#endif
#ifdef SYS_epoll_pwait2
    if (nr == SYS_epoll_pwait2)
        return true;
#endif
        /* With a client loop the loop waits in poll() on its epoll fd
         * (node_client.c). */
#ifdef SYS_poll
    if (nr == SYS_poll)
        return true;
#endif
#ifdef SYS_ppoll
    if (nr == SYS_ppoll)
        return true;
#endif
    return false;
}

/* The state letter of /proc/.../stat (after the parenthesised name). */
static char task_state(pid_t tid)
{
    char st[512];
    if (read_task(tid, "stat", st, sizeof(st)) == 0)
        return '?';
    const char *p = strrchr(st, ')');
    return p != NULL && p[1] == ' ' && p[2] != 0 ? p[2] : '?';
}

/* Keeps the first `frames` lines of a kernel stack ("[<0>] fn+0x1/0x2"),
 * function names only, joined by " < ". */
static void stack_names(char *s, int frames)
{
    char out[512];
    size_t o = 0;
    int kept = 0;
    for (char *tok = strtok(s, " "); tok != NULL && kept < frames;
         tok = strtok(NULL, " ")) {
        if (tok[0] == '[')
            continue; /* the "[<0>]" address */
        char *plus = strchr(tok, '+');
        if (plus != NULL)
            *plus = 0;
        int w = snprintf(out + o, sizeof(out) - o, "%s%s", kept ? " < " : "", tok);
        if (w < 0 || (size_t)w >= sizeof(out) - o)
            break;
        o += (size_t)w;
        kept++;
    }
    out[o] = 0;
    memcpy(s, out, o + 1);
}

static void report(struct node *n, pid_t tid, uint64_t ms, const char *sc, bool first)
{
    char wchan[128], stack[2048];
    if (read_task(tid, "wchan", wchan, sizeof(wchan)) == 0 || strcmp(wchan, "0") == 0)
        snprintf(wchan, sizeof(wchan), "-");
    if (read_task(tid, "stack", stack, sizeof(stack)) == 0)
        snprintf(stack, sizeof(stack), "unreadable");
    else
        stack_names(stack, 8);
    TK_LOG(TK_LOG_WARN, n->o.id, 0,
           "stall probe: the loop has been in one turn for %" PRIu64
           " ms; thread state %c, syscall: %s; wait channel: %s; kernel stack: %s",
           ms, task_state(tid), sc, wchan, stack);
    if (!first)
        return;
    user_stack(tid, stack, sizeof(stack));
    TK_LOG(TK_LOG_WARN, n->o.id, 0, "stall probe: the loop's stack at %" PRIu64 " ms: %s",
           ms, stack);
}

/* One look: the turn in progress (if any) and whether it is time to report. */
static void look(struct node *n, uint64_t now, uint64_t *seen_turns, uint64_t *since,
                 int *reported)
{
    char sc[256];
    pid_t tid = atomic_load(&n->stall.tid);
    if (tid == 0 || read_task(tid, "syscall", sc, sizeof(sc)) == 0)
        return;
    uint64_t turns = atomic_load_explicit(&n->loop.turns, memory_order_relaxed);
    if (waiting_for_events(sc)) {
        *since = 0;
    } else if (turns != *seen_turns || *since == 0) {
        *since = now; /* a turn began since the last look */
        *reported = 0;
    } else if (*reported < STALL_REPORTS &&
               now - *since >= (uint64_t)(*reported + 1) * n->o.stall_probe_ms) {
        (*reported)++;
        report(n, tid, now - *since, sc, *reported == 1);
    }
    *seen_turns = turns;
}

static void *probe_thread(void *arg)
{
    struct node *n = arg;
    pthread_setname_np(pthread_self(), "tk-stall");
    uint32_t period = n->o.stall_probe_ms / 4 > 0 ? n->o.stall_probe_ms / 4 : 1;
    uint64_t seen_turns = 0, since = 0;
    int reported = 0;
    pthread_mutex_lock(&n->stall.mu);
    while (!n->stall.stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += (long)(period % 1000) * 1000000L;
        until.tv_sec += period / 1000 + until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        int rc = 0;
        while (!n->stall.stop && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&n->stall.cv, &n->stall.mu, &until);
        if (n->stall.stop)
            break;
        pthread_mutex_unlock(&n->stall.mu);
        look(n, tk_mono_ms(), &seen_turns, &since, &reported);
        pthread_mutex_lock(&n->stall.mu);
    }
    pthread_mutex_unlock(&n->stall.mu);
    return NULL;
}

void node__stall_mark_loop_thread(struct node *n)
{
    atomic_store(&n->stall.tid, (pid_t)syscall(SYS_gettid));
}

void node__stall_start(struct node *n)
{
    if (n->o.stall_probe_ms == 0 || n->loop.shared)
        return;
    pthread_mutex_init(&n->stall.mu, NULL);
    pthread_cond_init(&n->stall.cv, NULL);
    n->stall.stop = false;
    if (pthread_create(&n->stall.thread, NULL, probe_thread, n) != 0) {
        TK_LOG(TK_LOG_WARN, n->o.id, 0, "stall probe: no thread (%s); running without it",
               strerror(errno));
        pthread_cond_destroy(&n->stall.cv);
        pthread_mutex_destroy(&n->stall.mu);
        return;
    }
    n->stall.running = true;
}

void node__stall_stop(struct node *n)
{
    if (!n->stall.running)
        return;
    pthread_mutex_lock(&n->stall.mu);
    n->stall.stop = true;
    pthread_cond_signal(&n->stall.cv);
    pthread_mutex_unlock(&n->stall.mu);
    pthread_join(n->stall.thread, NULL);
    pthread_cond_destroy(&n->stall.cv);
    pthread_mutex_destroy(&n->stall.mu);
    n->stall.running = false;
}

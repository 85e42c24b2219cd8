/* The data directory's lock: see base/dirlock.h. */
#include "base/dirlock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/err.h"

/* Tries before giving up on a LOCK that keeps being replaced under us. */
#define DIRLOCK_TRIES 8

/* The pid written in LOCK by its holder, or 0 when it holds none yet (the
 * holder is between its flock and its write) or something else. */
static long holder_pid(int fd)
{
    char buf[32];
    ssize_t got;
    while ((got = pread(fd, buf, sizeof(buf) - 1, 0)) < 0 && errno == EINTR) {
    }
    if (got <= 0)
        return 0;
    long pid = 0;
    for (ssize_t i = 0; i < got && buf[i] != '\n'; i++) {
        if (buf[i] < '0' || buf[i] > '9' || pid > 100000000)
            return 0;
        pid = pid * 10 + (buf[i] - '0');
    }
    return pid;
}

static int refuse_busy(const char *dir, const char *path, int fd, char *err, size_t cap)
{
    long pid = holder_pid(fd);
    if (pid == 0)
        snprintf(err, cap,
                 "the data directory %s is in use by another process (it holds the "
                 "lock on %s, and has not written its pid yet): one process per data "
                 "directory",
                 dir, path);
    else
        snprintf(err, cap,
                 "the data directory %s is in use by process %ld%s (it holds the lock "
                 "on %s): one process per data directory; stop that one first, or "
                 "give another directory",
                 dir, pid, pid == (long)getpid() ? ", this one" : "", path);
    return TK_EBUSY;
}

/* Writes this process's pid into the locked LOCK. The new text goes over the
 * old before the file is cut to it, so that a loser reading meanwhile finds a
 * whole pid (the new one, or the old one's digits up to a newline). */
static int write_pid(int fd)
{
    char buf[32];
    int len = snprintf(buf, sizeof(buf), "%ld\n", (long)getpid());
    ssize_t put;
    while ((put = pwrite(fd, buf, (size_t)len, 0)) < 0 && errno == EINTR) {
    }
    if (put != len)
        return -1;
    return ftruncate(fd, len);
}

int tk_dirlock_take(const char *dir, int *fd_out, char *err, size_t cap)
{
    char path[4096];
    err[0] = 0;
    *fd_out = -1;
    int n = snprintf(path, sizeof(path), "%s/" TK_DIRLOCK_FILE, dir);
    if (n < 0 || (size_t)n >= sizeof(path)) {
        snprintf(err, cap, "the data directory's path is too long (%zu bytes)",
                 strlen(dir));
        return TK_EINVAL;
    }
    for (int tries = 0; tries < DIRLOCK_TRIES; tries++) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY, 0600);
        if (fd < 0) {
            snprintf(err, cap, "cannot open the lock file %s: %s", path, strerror(errno));
            return TK_EIO;
        }
        int rc;
        while ((rc = flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
        }
        if (rc != 0) {
            int e = errno;
            rc = e == EWOULDBLOCK ? refuse_busy(dir, path, fd, err, cap) : TK_EIO;
            if (rc == TK_EIO)
                snprintf(err, cap, "cannot lock %s: %s", path, strerror(e));
            close(fd);
            return rc;
        }
        /* A holder that removed LOCK before releasing it (a failed restore
         * cleaning up) leaves us holding a file the directory no longer
         * names, which the next taker would not see: take the new one. */
        struct stat held, named;
        if (fstat(fd, &held) != 0) {
            snprintf(err, cap, "cannot stat %s: %s", path, strerror(errno));
            close(fd);
            return TK_EIO;
        }
        if (stat(path, &named) != 0 || named.st_dev != held.st_dev ||
            named.st_ino != held.st_ino) {
            close(fd);
            continue;
        }
        if (write_pid(fd) != 0) {
            snprintf(err, cap, "cannot write the pid into %s: %s", path, strerror(errno));
            close(fd);
            return TK_EIO;
        }
        *fd_out = fd;
        return 0;
    }
    snprintf(err, cap, "cannot lock %s: it was replaced %d times while being locked",
             path, DIRLOCK_TRIES);
    return TK_EIO;
}

void tk_dirlock_release(int fd)
{
    if (fd < 0)
        return;
    /* Cut while still held, so no taker reads a half-cut pid. If the cut
     * fails, the stale pid only misleads a reader: the lock goes anyway. */
    if (ftruncate(fd, 0) != 0) {
    }
    close(fd);
}

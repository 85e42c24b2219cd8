/* Secret files checked as ssh checks a private key, and the boolean parser
 * of flags: see base/secret_file.h. */
#include "base/secret_file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/err.h"

/* " (a symlink to "TARGET")" when path is a symlink, else "". Only for the
 * message: the mode judged is always the opened file's. */
static void symlink_note(const char *path, char *note, size_t cap)
{
    struct stat lst;
    char target[PATH_MAX];
    note[0] = 0;
    if (lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode) && realpath(path, target) != NULL)
        snprintf(note, cap, " (a symlink to \"%s\")", target);
}

int tk_secret_file_open(const char *path, bool allow_loose, int *fd, char *msg,
                        size_t msg_cap)
{
    msg[0] = 0;
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (f < 0) {
        snprintf(msg, msg_cap, "cannot open \"%s\": %s", path, strerror(errno));
        return TK_EIO;
    }
    struct stat st;
    if (fstat(f, &st) != 0) {
        snprintf(msg, msg_cap, "cannot stat \"%s\": %s", path, strerror(errno));
        close(f);
        return TK_EIO;
    }
    unsigned mode = (unsigned)st.st_mode & 07777u;
    if ((mode & 077u) != 0) {
        char note[PATH_MAX + 32];
        symlink_note(path, note, sizeof(note));
        if (!allow_loose) {
            snprintf(msg, msg_cap,
                     "\"%s\"%s has mode %04o: group or others may read or write it, and "
                     "a secret file must not allow that (0600 or stricter). Fix it with "
                     "\"chmod 600 %s\", or start with " TK_SECRET_ALLOW_LOOSE_FLAG
                     " where secrets are mounted with other modes",
                     path, note, mode, path);
            close(f);
            return TK_EINVAL;
        }
        snprintf(msg, msg_cap,
                 "\"%s\"%s has mode %04o: group or others may read or write it "
                 "(accepted because of " TK_SECRET_ALLOW_LOOSE_FLAG
                 "; chmod 600 fixes it)",
                 path, note, mode);
    }
    *fd = f;
    return 0;
}

int tk_secret_file_read(const char *path, bool allow_loose, void *buf, size_t cap,
                        size_t *len, char *msg, size_t msg_cap)
{
    int fd;
    int rc = tk_secret_file_open(path, allow_loose, &fd, msg, msg_cap);
    if (rc != 0)
        return rc;
    unsigned char *p = buf;
    size_t n = 0;
    char extra;
    for (;;) {
        /* One byte past cap tells a file that is too long. */
        ssize_t r = n < cap ? read(fd, p + n, cap - n) : read(fd, &extra, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            snprintf(msg, msg_cap, "cannot read \"%s\": %s", path, strerror(errno));
            close(fd);
            return TK_EIO;
        }
        if (r == 0)
            break;
        if (n == cap) {
            snprintf(msg, msg_cap, "\"%s\" is longer than %zu bytes", path, cap);
            close(fd);
            return TK_ETOOBIG;
        }
        n += (size_t)r;
    }
    close(fd);
    while (n > 0 &&
           (p[n - 1] == '\n' || p[n - 1] == '\r' || p[n - 1] == ' ' || p[n - 1] == '\t'))
        n--;
    *len = n;
    return 0;
}

void tk_secret_file_fd_path(int fd, char *buf, size_t cap)
{
    snprintf(buf, cap, "/proc/self/fd/%d", fd);
}

int tk_parse_bool(const char *s, bool *out)
{
    static const struct {
        const char *word;
        bool value;
    } words[] = {{"true", true}, {"false", false}, {"1", true},
                 {"0", false},   {"yes", true},    {"no", false}};
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
        if (strcasecmp(s, words[i].word) == 0) {
            *out = words[i].value;
            return 0;
        }
    return TK_EINVAL;
}

/* Secret files: tokens, private keys and the auth file, opened the way ssh
 * opens a private key.
 *
 * A secret file that group or others may read or write (mode & 077) is
 * refused with a message naming the file, its mode and the fix (chmod 600).
 * The mode checked is that of the file actually opened: fstat on the
 * descriptor that is then read, so a symlink is judged by its target and a
 * file swapped between the check and the read cannot slip through. The
 * escape for containers that mount secrets with other modes is
 * --allow-loose-permissions (tierkvd and tierkv alike): the caller passes
 * allow_loose and logs the warning it gets back.
 *
 * Also the boolean parser of both programs' flags (tk_parse_bool).
 *
 * Threads: any; nothing is shared. Errors: TK_EINVAL for a loose file,
 * TK_ETOOBIG for one over the caller's size, TK_EIO when the file cannot be
 * opened, read or stat'ed; the message says which, naming the path. */
#ifndef TK_BASE_SECRET_FILE_H
#define TK_BASE_SECRET_FILE_H

#include <stdbool.h>
#include <stddef.h>

/* Enough for every message below with a path of a few hundred bytes. */
#define TK_SECRET_MSG_MAX 1024

/* The name of the flag that accepts loose secret files, for messages. */
#define TK_SECRET_ALLOW_LOOSE_FLAG "--allow-loose-permissions"

/* Opens `path` read-only (close-on-exec, following a symlink) and checks the
 * mode of what was opened. Returns 0 with the descriptor in *fd (the caller
 * closes it) and msg empty, or, when the file is loose but allow_loose is
 * set, 0 with a one-line warning in msg for the caller to log. Otherwise a
 * negative error with the reason in msg and no descriptor left open. */
int tk_secret_file_open(const char *path, bool allow_loose, int *fd, char *msg,
                        size_t msg_cap);

/* tk_secret_file_open, then reads the whole file into buf (at most cap
 * bytes) and drops trailing whitespace (spaces, tabs, CR and LF: the newline
 * echo or openssl rand leaves). Returns 0 with the length in *len and msg as
 * tk_secret_file_open leaves it; TK_ETOOBIG with a message when the file is
 * longer than cap; TK_EIO when the read fails; or tk_secret_file_open's
 * errors. */
int tk_secret_file_read(const char *path, bool allow_loose, void *buf, size_t cap,
                        size_t *len, char *msg, size_t msg_cap);

/* A path naming the open descriptor fd ("/proc/self/fd/N"), for a loader that
 * only takes a path (OpenSSL's key loading, the auth file): opening it opens
 * the very file tk_secret_file_open checked. */
#define TK_SECRET_FD_PATH_MAX 32
void tk_secret_file_fd_path(int fd, char *buf, size_t cap);

/* The one parser of boolean flags and TIERKV_* variables in tierkvd and
 * tierkv. It lives here because both read the boolean that governs this
 * module (--allow-loose-permissions, TIERKV_ALLOW_LOOSE_PERMISSIONS).
 * Accepts exactly TK_BOOL_ACCEPTED, in any case. Returns 0 with *out set, or
 * TK_EINVAL for anything else (the empty string included): a value that
 * means neither must never be read as on. */
#define TK_BOOL_ACCEPTED "true, false, 1, 0, yes or no"
int tk_parse_bool(const char *s, bool *out);

#endif

/* Splitting "host:port" and "[v6addr]:port" addresses.
 *
 * The only copy of the split (the structure test fails on a second one
 * outside base/). Pure, any thread. The CLI's endpoint parser
 * (cmd/tierkv/args.c, cli_parse_hostport) is a different thing and stays
 * apart: it also takes http[s]:// and a path, and keeps the port as text. */
#ifndef TK_BASE_HOSTPORT_H
#define TK_BASE_HOSTPORT_H

#include <stddef.h>
#include <stdint.h>

/* Splits `s` into `host` (room for `cap` bytes, NUL included; an IPv6
 * address without its brackets) and `port`. The port is decimal, 0..65535:
 * 0 (kernel-chosen) is valid for a listen address, so a caller that dials
 * refuses it itself. Returns 0 or TK_EINVAL (no colon, an empty or too long
 * host, an unclosed bracket, an empty, non-decimal or too large port). */
int tk_hostport_split(const char *s, char *host, size_t cap, uint16_t *port);

#endif

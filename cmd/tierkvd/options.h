/* tierkvd's options: one table (options.c) holds every option's name,
 * placeholder, --help section, parser, destination in struct tierkvd_config,
 * default and texts. Parsing, --help and the manual's OPTIONS section
 * (--help-markdown, kept equal to docs/tierkvd.md by the tierkvd-config test)
 * all walk that table, as redis's config.c walks its standardConfig table.
 *
 * An option is set by its flag (--name VALUE, --name=VALUE) or else by its
 * variable (TIERKV_ and the name upper-cased, '-' as '_'; an empty variable
 * is unset), or else takes its default. Every value is parsed and checked by
 * its row's parser before anything uses it; what an invalid value gets is
 * tierkvd_die (exit 2, a message naming the flag or variable). Rules between
 * options (--heartbeat-ticks below --election-ticks...) are checked where
 * the values are used (setup.c). Main thread only. */
#ifndef TIERKVD_OPTIONS_H
#define TIERKVD_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/log.h"

/* Rows the table may have (a static_assert in options.c holds it to it). */
#define TIERKVD_OPTIONS_MAX 64

/* What the options say, each parsed by its row: numbers and sizes as
 * uint64_t (sizes in bytes), booleans as bool, strings borrowed from argv, the
 * environment or the table (NULL: unset, no default). A field of an option
 * that is unset and has no default is 0 or NULL: tierkvd_option_given() tells
 * a given value from a default. */
struct tierkvd_config {
    /* Cluster */
    uint64_t id, cluster_id;
    const char *members, *members_http, *listen_raft;
    bool join;
    /* Storage */
    const char *data_dir, *store;
    uint64_t snapshot_entries, snapshot_bytes, trailing_entries;
    uint64_t kv_ring_bytes, kv_writeback_pace, snapshot_read_pace;
    bool kv_no_sync;
    /* HTTP */
    const char *listen_http, *listen_client;
    uint64_t request_timeout_ms, header_timeout_ms, body_timeout_ms;
    uint64_t idle_timeout_ms, write_timeout_ms;
    bool gateway_on_node_loop;
    /* Security */
    const char *peer_token_file, *peer_cert_file, *peer_key_file;
    const char *peer_trusted_ca_file, *cert_file, *key_file, *client_ca_file;
    const char *auth_file;
    bool insecure_peers, allow_loose_permissions;
    /* Limits */
    uint64_t max_key_bytes, max_value_bytes, max_body_bytes, max_header_bytes;
    uint64_t max_connections, max_pipeline, memory_budget, max_memory_bytes;
    uint64_t tls_handshakes_max, tls_handshakes_per_addr;
    uint64_t scan_limit_max, max_watchers;
    /* Watches */
    uint64_t watch_events, watch_events_bytes, watch_buffer_bytes;
    uint64_t watch_stall_ms, watch_total_bytes;
    /* Tuning */
    uint64_t tick_ms, election_ticks, heartbeat_ticks, spin_us;
    uint64_t follower_inline_sync_us, lease_checkpoint_ms;
    /* Operations */
    uint64_t stall_probe_ms;
    const char *restore;
    bool force_new_cluster;
    enum tk_log_level log_level;
    const char *log_format;
    /* By table row: set by a flag or a variable (not a default). */
    bool given[TIERKVD_OPTIONS_MAX];
};

/* Fills `cfg` from argv and the environment, every value checked. Returns 0,
 * or 1 after printing what --help, --help-markdown or --version asks for (the
 * caller then exits 0). An unknown flag, a missing value or an invalid one
 * exits 2 (tierkvd_die). */
int tierkvd_options_read(int argc, char **argv, struct tierkvd_config *cfg);

/* Whether option `flag` (without "--"; a name in the table) was set by its
 * flag or its variable rather than left at its default. */
bool tierkvd_option_given(const struct tierkvd_config *cfg, const char *flag);

/* Prints "tierkvd: " and the message, with a pointer to --help, on stderr
 * and exits 2: the one exit for a configuration that cannot start. */
void tierkvd_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#endif

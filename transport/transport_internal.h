/* Internals shared by the transport files: the implementation table behind
 * struct transport, the frame format (frame.c) and the protobuf-c codec
 * (codec.c). Nothing outside transport/ and its tests includes this.
 *
 * Wire format. A frame is [u32 length][u32 crc32c][payload], both integers
 * little-endian, `length` counting the payload only and the CRC covering the
 * payload only. The payload's first byte is the frame kind:
 *   FRAME_KIND_HELLO   the handshake: a fixed 104-byte body (frame__hello_*),
 *   FRAME_KIND_AUTH    the dialer's proof, 32 bytes,
 *   FRAME_KIND_WELCOME the acceptor's verdict "you are in", a 32-byte proof,
 *   FRAME_KIND_REFUSE  its verdict "your data directory is refused" (an
 *                      amnesiac), a 32-byte proof; the acceptor then closes,
 *   FRAME_KIND_RAFT    a tierkv.RaftMessage (codec.c),
 *   FRAME_KIND_FORWARD opaque bytes of transport_send_forward (the node
 *                      layer's proposal forwarding); the sender is the
 *                      connection's authenticated node id,
 *   FRAME_KIND_PING    empty: keeps an idle connection under its deadline.
 * Any other kind is a protocol error that closes the connection.
 *
 * Handshake (version 4): dialer -> HELLO(nonce_d); acceptor -> HELLO(nonce_a,
 * proof 'A'); dialer -> AUTH(proof 'D'); acceptor -> WELCOME(proof 'W') or
 * REFUSE(proof 'R') and close. Every proof is auth__proof (auth.c) over both
 * HELLO bodies whole, so it covers both ids, the flags, the cluster id, both
 * incarnations and both nonces. Neither side acts on anything the other said
 * before that side's proof is checked: the acceptor asks its node about the
 * dialer's incarnation only after the AUTH, and the dialer acts on a REFUSE
 * only when its proof checks (or, without a token, when peer TLS carried it).
 * With no cluster token on either side (flag FRAME_HELLO_F_TOKEN clear) the
 * proofs are zero and not checked; a REFUSE that nothing authenticates is
 * then a failed dial, logged and retried. Older HELLOs are refused. */
#ifndef TK_TRANSPORT_INTERNAL_H
#define TK_TRANSPORT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "raft/raft.h"
#include "tierkv.pb-c.h"
#include "transport/transport.h"

/* ---- The implementation table ---- */
struct transport_ops {
    int (*send)(struct transport *t, const struct raft_message *m);
    int (*send_forward)(struct transport *t, uint64_t to, const uint8_t *buf, size_t len);
    void (*close)(struct transport *t, transport_close_cb *cb, void *data);
};

/* The first member of every implementation's struct. */
struct transport {
    const struct transport_ops *ops;
    uint64_t id;
    struct transport_callbacks cbs;
    struct transport_stats stats;
};

/* ---- Frames (frame.c) ---- */
#define FRAME_HEADER_BYTES 8u
#define FRAME_MAX_DEFAULT (4u << 20)

enum frame_kind {
    FRAME_KIND_HELLO = 1,
    FRAME_KIND_RAFT = 2,
    FRAME_KIND_FORWARD = 3, /* opaque node-to-node bytes (forwarding) */
    FRAME_KIND_AUTH = 4,    /* the dialer's handshake proof */
    FRAME_KIND_PING = 5,    /* empty; the dialer sends it on an idle link */
    FRAME_KIND_WELCOME = 6, /* the acceptor's proof: the dialer is in */
    FRAME_KIND_REFUSE = 7,  /* the acceptor's proof: the dialer is refused */
};

#define FRAME_HELLO_MAGIC 0x564b4b54u /* "TKKV" little-endian */
#define FRAME_HELLO_VERSION 4u
#define FRAME_NONCE_BYTES 32u
#define FRAME_PROOF_BYTES 32u
#define FRAME_INC_BYTES 16u
/* magic u32, version u16, flags u16, cluster u64, node u64, nonce, proof,
 * incarnation */
#define FRAME_HELLO_BYTES (24u + FRAME_NONCE_BYTES + FRAME_PROOF_BYTES + FRAME_INC_BYTES)
/* Where the proof sits in a HELLO body (auth__proof zeroes it there). */
#define FRAME_HELLO_PROOF_OFF (24u + FRAME_NONCE_BYTES)
#define FRAME_HELLO_F_TOKEN 0x1u /* the sender proves a cluster token */
#define FRAME_HELLO_F_KNOWN FRAME_HELLO_F_TOKEN

struct frame_hello {
    uint32_t magic;
    uint16_t version;
    uint16_t flags;
    uint64_t cluster_id;
    uint64_t node_id;
    uint8_t nonce[FRAME_NONCE_BYTES];
    uint8_t proof[FRAME_PROOF_BYTES]; /* zero in the dialer's HELLO */
    uint8_t incarnation[FRAME_INC_BYTES];
};

/* Fills the 8-byte header at `hdr` for the `len` payload bytes at `payload`. */
void frame__seal(uint8_t *hdr, const uint8_t *payload, uint32_t len);
/* The same header for a payload of `len` bytes whose CRC32C the caller
 * computed piece by piece (tk_crc32c is incremental). */
void frame__seal_crc(uint8_t *hdr, uint32_t len, uint32_t crc);

/* Looks for one frame at the start of buf[0..len).
 * Returns 1 with *payload, *payload_len (>= 1: the kind byte is included) and
 * *consumed (header + payload) when a whole, valid frame is there; 0 when more
 * bytes are needed (*consumed = the total frame size if the header is known,
 * else FRAME_HEADER_BYTES); TK_ETOOBIG when the length is 0 or above
 * `frame_max`; TK_ECORRUPT when the CRC does not match. Never asserts on the
 * bytes. */
int frame__parse(const uint8_t *buf, size_t len, uint32_t frame_max,
                 const uint8_t **payload, uint32_t *payload_len, size_t *consumed);

/* Writes a whole HELLO frame (header, kind, body) of `h` (magic and version
 * are filled in) to out, which has room for FRAME_HEADER_BYTES + 1 +
 * FRAME_HELLO_BYTES bytes. Returns the bytes written. */
size_t frame__hello_write(uint8_t *out, const struct frame_hello *h);
/* Writes a whole frame of `kind` (AUTH, WELCOME or REFUSE) carrying `proof`;
 * out has room for FRAME_HEADER_BYTES + 1 + FRAME_PROOF_BYTES. Returns the
 * bytes written. */
size_t frame__proof_write(uint8_t *out, uint8_t kind, const uint8_t *proof);
/* Decodes a HELLO body (after the kind byte). Returns 0 or TK_EPROTO (wrong
 * length). The caller checks magic, version and ids. */
int frame__hello_decode(const uint8_t *body, size_t len, struct frame_hello *out);

/* ---- Peer authentication (auth.c) ---- */

/* FRAME_NONCE_BYTES from OpenSSL's CSPRNG. Returns 0 or TK_EIO. */
int auth__nonce(uint8_t *out);
/* A handshake proof (the formula is in auth.c) over the dialer's and the
 * acceptor's HELLO bodies (FRAME_HELLO_BYTES each; their proof fields count as
 * zeros): label 'A' the acceptor's HELLO, 'D' the dialer's AUTH, 'W' the
 * acceptor's WELCOME, 'R' its REFUSE. Returns 0 or TK_EIO. */
int auth__proof(const uint8_t *token, size_t token_len, uint8_t label,
                const uint8_t *hello_d, const uint8_t *hello_a, uint8_t *out);
/* Constant-time comparison of n bytes. */
bool auth__equal(const uint8_t *a, const uint8_t *b, size_t n);

/* ---- Codec (codec.c): the only code that knows protobuf-c ---- */

/* Encoder scratch, reusable; owned by one thread. */
struct codec_enc {
    Tierkv__RaftMessage msg;
    union {
        Tierkv__RequestVote vote;
        Tierkv__RequestVoteResponse vote_resp;
        Tierkv__AppendEntries append;
        Tierkv__AppendEntriesResponse append_resp;
        Tierkv__InstallSnapshot snapshot;
        Tierkv__TimeoutNow timeout_now;
        Tierkv__ReadIndex read_index;
        Tierkv__ReadIndexResponse read_index_resp;
    } body;
    Tierkv__SnapshotMeta meta;
    Tierkv__Configuration config;
    uint64_t voters[RAFT_VOTERS_MAX];
    uint64_t learners[RAFT_LEARNERS_MAX];
    Tierkv__Entry *ents;
    Tierkv__Entry **ent_ptrs;
    size_t ents_cap;
};

void codec__enc_init(struct codec_enc *e);
void codec__enc_destroy(struct codec_enc *e);
/* Prepares `m` for packing and gives an upper bound of its packed size
 * (without frame header or kind byte), computed without walking the message
 * twice: every varint counted at its 10-byte maximum. For a snapshot, only data[offset,
 * offset + chunk_len) goes in, with done = (offset + chunk_len == data length); other
 * types ignore both. `m` must stay unchanged until codec__enc_pack. Returns 0 or
 * TK_EINVAL (an unknown type, too many voters, a chunk outside the data). */
int codec__enc_prepare(struct codec_enc *e, const struct raft_message *m, uint64_t offset,
                       size_t chunk_len, size_t *size);
/* The exact packed size of the prepared message (walks it: use when the bound
 * is not good enough, e.g. near the frame limit). */
size_t codec__enc_size(struct codec_enc *e);
/* Packs the prepared message into out (room for the bound from prepare);
 * returns the bytes written, at most that bound. */
size_t codec__enc_pack(struct codec_enc *e, uint8_t *out);
/* Packs the prepared message through `buf`'s append, field by field: a bytes
 * field's contents come as one call pointing at the caller's payload (a log
 * entry's blob), so the caller may send it by reference. Returns the bytes
 * appended; the same bytes as codec__enc_pack. */
size_t codec__enc_pack_to(struct codec_enc *e, ProtobufCBuffer *buf);

/* Decoder: an arena for protobuf-c's allocations, reset per message. Payloads
 * of 256 bytes or more are unpacked straight into tk_blobs, which the decoded
 * message then references (no second copy); smaller ones are copied once. */
struct codec_arena_chunk;
struct codec_dec {
    struct codec_arena_chunk *chunks; /* bump allocation, kept between messages */
    struct codec_arena_chunk *cur;
    size_t used, limit;     /* bytes handed out; cap for this message */
    struct tk_blob **blobs; /* blobs handed to protobuf-c this message */
    size_t n_blobs, blobs_cap;
    size_t blob_cursor;
    struct raft_entry *ents; /* the decoded message's entries */
    size_t ents_cap, n_ents;
    struct tk_blob *snap_data; /* the decoded snapshot chunk's data */
    Tierkv__RaftMessage *pb;
};

void codec__dec_init(struct codec_dec *d);
void codec__dec_destroy(struct codec_dec *d);
/* Decodes a RaftMessage body into *out, checking it: a body must be set, ids
 * must be non-zero, entries must be consecutive after prev_index with a known
 * type, a snapshot must carry meta with 1..RAFT_VOTERS_MAX non-zero voters.
 * *out, its entries and blobs stay valid until codec__dec_release(d), which the
 * caller must call before the next decode. Returns 0 or TK_EPROTO. */
int codec__decode(struct codec_dec *d, const uint8_t *buf, size_t len,
                  struct raft_message *out);
void codec__dec_release(struct codec_dec *d);

/* Reassembles snapshot chunks (in order, from one sender). */
struct codec_snap {
    bool active;
    struct raft_snapshot_meta meta;
    uint64_t total;       /* announced by the sender (0: unknown) */
    struct tk_blob *blob; /* total known: the whole snapshot, filled to len */
    uint8_t *buf;         /* total unknown: grown by doubling */
    size_t len, cap;      /* cap: bytes set aside (blob's or buf's) */
    uint64_t max;
};

void codec__snap_init(struct codec_snap *s, uint64_t max_bytes);
void codec__snap_destroy(struct codec_snap *s);
/* Feeds a decoded snapshot chunk. A chunk at offset 0 starts a new snapshot
 * (dropping an unfinished one). Returns 1 and fills *whole (a complete
 * snapshot message whose data blob has one reference, the caller's) on the
 * last chunk; 0 when more chunks are needed; TK_EPROTO for a chunk that does
 * not continue the current snapshot (offset, total or meta differ, or chunks
 * that do not add up to the announced total); TK_ETOOBIG past max_bytes.
 * With the total announced, the first chunk sets aside one blob of exactly
 * that size, each chunk is copied into it once, and the last hands it on
 * (no final copy); without (an older sender) the buffer grows by doubling. */
int codec__snap_feed(struct codec_snap *s, const struct raft_message *chunk,
                     struct raft_message *whole);
/* The bytes received the reassembly would hold once `c` is fed (a first
 * chunk starts over), and the bytes it holds: what the memory bounds count.
 * The blob set aside for an announced total is touched only as chunks
 * arrive, so its untouched part is not counted. */
uint64_t codec__snap_need(const struct codec_snap *s, const struct raft_msg_snapshot *c);
uint64_t codec__snap_held(const struct codec_snap *s);

#endif

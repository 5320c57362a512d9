/* SPDX-License-Identifier: Apache-2.0 */
/*
 * proto.h -- the fedbox wire protocol and the ZeroMQ link that carries it.
 *
 * Messages are plain C structs (fb_msg); fb_msg_pack/unpack translate them
 * to and from frame 0 of a ZeroMQ message (a 4-byte prefix and a protobuf
 * Envelope). Tensor data never travels inside protobuf: it rides in frame 1
 * as a raw chunk. Unpacking validates everything a peer controls (prefix,
 * lengths, string sizes, counts) so that the rest of the program only sees
 * well-formed messages.
 *
 * fb_link wraps one ZeroMQ socket: a ROUTER that the coordinator binds, or a
 * DEALER that a worker connects. It is the only user of libzmq. A link is
 * used by one thread at a time.
 */
#ifndef FB_PROTO_PROTO_H
#define FB_PROTO_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* 2: RoundStart.first_chunk (updates go up in a rotated chunk order). */
/* 4: the broadcast's FULL stream seals each chunk on its own
 * (crypto/stream.c), so the model encrypts on every core. */
/* 5: SecAgg's consistency check (the included set signed and its
 * confirmations relayed before any reveal), RoundStart's private time
 * budget, and the handshake's coordinator cookie (an empty Handshake asks
 * for it; the signed hello carries it); a masked input has 6 extra
 * coordinates (the federated evaluation's three after the weight, loss
 * and FedNova's); UpdateBegin.eval_*, RoundStart.evaluate_only; update
 * chunks go up only on the coordinator's UpdateCredit; 6: SecAgg SETUP
 * and the ahead flag (a round set up during the one before), RoundStart's
 * SecAggRound.set_up. 7: a FULL stream's chunk hashes are SHA-256, not
 * BLAKE2b-256 (crypto/stream.c: the model's download, hashed on every
 * worker, at the CPU's SHA-extension speed). 8: a SecAgg advert's
 * signature covers its session part only (run and the session's c key,
 * crypto.h), and a share message's AEAD binds both ends' s keys. 9:
 * UpdateCredit.staleness (secure async: a cohort member's input is
 * weighted by its staleness at its upload's begin). 10: SecAggRound.
 * max_staleness, and the round's terms (fb_secagg_bind_terms) in every
 * share key: a worker of 9 could not open a worker of 10's shares. */
#define FB_PROTOCOL_VERSION 10
#define FB_WIRE_PREFIX_LEN 4
#define FB_NAME_MAX 64        /* worker names, bytes incl. NUL */
#define FB_TEXT_MAX 256       /* reasons, paths, bytes incl. NUL */
#define FB_PROTO_MAX_HIDDEN 16
#define FB_MAX_CONTROL_LEN 4096 /* frame 0 longer than this is malformed */
#define FB_BLOB_MAX 256         /* handshake blobs, keys, stream headers */
#define FB_WIRE_METRICS_MAX 8   /* named evaluation metrics in an update */
#define FB_WIRE_METRIC_NAME 32  /* bytes of a metric's name, incl. NUL */

/* Frame 0 flags (byte 3 of the prefix). */
#define FB_WIRE_PAYLOAD 0x01 /* a payload frame follows */
#define FB_WIRE_SEALED 0x02  /* the envelope is sealed (crypto/) */

/* A short opaque byte string carried in a message. */
typedef struct fb_blob {
	uint8_t b[FB_BLOB_MAX];
	uint32_t len;
} fb_blob;

typedef enum fb_msg_type {
	FB_MSG_NONE = 0,
	FB_MSG_HELLO,
	FB_MSG_WELCOME,
	FB_MSG_REJECT,
	FB_MSG_ROUND_START,
	FB_MSG_MODEL_FETCH,
	FB_MSG_MODEL_CHUNK,
	FB_MSG_UPDATE_BEGIN,
	FB_MSG_UPDATE_CHUNK,
	FB_MSG_HEARTBEAT,
	FB_MSG_ROUND_CANCEL,
	FB_MSG_SHUTDOWN,
	FB_MSG_HANDSHAKE,
	FB_MSG_UPDATE_END,
	FB_MSG_SECAGG,
	FB_MSG_REDIRECT,
	FB_MSG_ROUND_FAILED,
	FB_MSG_UPDATE_CREDIT,
	FB_MSG_TYPE_COUNT_
} fb_msg_type;

/* fb_msg_type_name returns "hello", "round_start", ... */
const char *fb_msg_type_name(fb_msg_type t);

/* Steps of secure aggregation (FB_MSG_SECAGG; data in the payload). */
typedef enum fb_secagg_phase {
	FB_SA_ADVERT = 1, /* worker: its signed key advert */
	FB_SA_PEERS = 2,  /* coordinator: neighbours' adverts (slot, key, ad) */
	FB_SA_SHARES = 3, /* worker: sealed shares for its neighbours */
	FB_SA_RELAY = 4,  /* coordinator: the shares addressed to a worker */
	FB_SA_INCLUDED = 5, /* coordinator: the included set U3, n bytes */
	FB_SA_REVEAL = 6,   /* worker: its shares for unmasking */
	FB_SA_CONFIRM = 7,  /* worker: its signature of U3 (crypto.h) */
	FB_SA_CONFIRMS = 8, /* coordinator: its neighbours' signatures of
	                     * U3, FB_SECAGG_CONFIRM_LEN each: reveal now */
	FB_SA_REFUSE = 9,   /* worker: it will not reveal (it holds fewer than
	                     * t confirmations of its set); no data */
	FB_SA_AGAIN = 10,   /* coordinator: send the round's masked input
	                     * again, from its UpdateBegin (the sum started
	                     * again); no data */
	FB_SA_SETUP = 11,   /* coordinator: set up a later round's secure
	                     * aggregation now (its SecAggRound, packed by
	                     * fb_sa_setup_pack): advert and shares go while
	                     * the current round runs */
	FB_SA_PHASE_MAX_ = 11
} fb_secagg_phase;

typedef struct fb_wire_model_spec {
	char arch[32];
	uint32_t input_dim;
	uint32_t classes;
	uint32_t hidden[FB_PROTO_MAX_HIDDEN];
	uint32_t hidden_count;
	uint64_t synthetic_params;
	char plugin[FB_TEXT_MAX];
	uint32_t task; /* fb_task: 0 classification, 1 regression */
} fb_wire_model_spec;

typedef struct fb_msg {
	fb_msg_type type;
	union {
		struct {
			uint32_t protocol_version;
			char name[FB_NAME_MAX];
			uint32_t worker_index;
			uint64_t num_samples;
			char backend[FB_TEXT_MAX];
			char software[FB_NAME_MAX];
			uint64_t session;
			uint32_t lane;
			uint32_t partitions; /* 0: own data; else data.workers */
		} hello;
		struct {
			uint32_t protocol_version;
			uint64_t run_id;
			uint32_t worker_id;
			uint32_t heartbeat_ms;
			uint32_t liveness_ms;
			uint32_t chunk_bytes;
			fb_wire_model_spec model;
			uint64_t param_count;
		} welcome;
		struct {
			char reason[FB_TEXT_MAX];
			uint32_t protocol_version;
		} reject;
		struct {
			uint32_t round;
			uint64_t param_count;
			uint32_t chunk_count;
			uint32_t chunk_bytes;
			uint64_t local_steps;
			uint32_t batch_size;
			float lr;
			float momentum;
			float weight_decay;
			uint64_t seed;
			uint32_t deadline_ms;
			bool synthetic;
			fb_blob round_key;
			fb_blob stream_header;
			fb_blob stream_trailer;
			float prox_mu;
			bool fednova;
			float local_epochs;
			uint32_t first_chunk;
			uint32_t time_budget_ms; /* secure: > 0, the worker
			                          * schedules its own steps */
			uint64_t min_steps, max_steps; /* with time_budget_ms */
			uint32_t model_round; /* the model stream's; 0: round */
			bool evaluate_only; /* no training: a zero update */
			bool secagg; /* the fields below are set */
			uint32_t sa_slot;
			uint32_t sa_n;
			uint32_t sa_degree;
			uint32_t sa_threshold;
			fb_blob sa_graph_seed;
			uint32_t sa_ring_bits;
			double sa_clip;
			uint64_t sa_max_samples;
			double sa_a_bound;
			uint32_t sa_max_staleness; /* async: a credit's most */
			bool sa_set_up; /* set up ahead (FB_SA_SETUP) */
		} round_start;
		struct {
			uint32_t round;
			uint32_t chunk;
		} model_fetch, model_chunk, update_chunk;
		struct {
			uint32_t round;
			uint64_t num_samples;
			uint64_t param_count;
			uint32_t chunk_count;
			uint64_t steps;
			double train_loss;
			double train_seconds;
			char backend[FB_TEXT_MAX];
			fb_blob stream_key;
			fb_blob stream_header;
			double a_norm;
			double steps_per_second;
			/* federated evaluation (plain rounds; 0 examples:
			 * none) */
			uint64_t eval_examples;
			double eval_loss;
			double eval_accuracy; /* NaN: none */
			uint32_t eval_metric_count; /* <= FB_WIRE_METRICS_MAX */
			char eval_name[FB_WIRE_METRICS_MAX]
			              [FB_WIRE_METRIC_NAME];
			double eval_metric[FB_WIRE_METRICS_MAX];
		} update_begin;
		struct {
			uint32_t round;
			uint32_t phase; /* fb_secagg_phase */
			uint32_t count;
			bool ahead; /* of a round set up ahead */
		} secagg;
		struct {
			uint32_t round;
			fb_blob stream_trailer;
		} update_end;
		struct {
			fb_blob data;
			uint32_t lane;
		} handshake;
		struct {
			uint32_t lane;
			uint32_t port;
		} redirect;
		struct {
			uint32_t round;
			uint32_t chunks; /* more update chunks it may send */
			uint32_t staleness; /* secure async: server steps
			                     * since its task's model */
		} update_credit;
		struct {
			uint32_t round;
		} heartbeat;
		struct {
			uint32_t round;
			char reason[FB_TEXT_MAX];
		} round_cancel;
		struct {
			uint32_t round;
			char reason[FB_TEXT_MAX];
		} round_failed;
		struct {
			char reason[FB_TEXT_MAX];
		} shutdown;
	} u;
} fb_msg;

/* fb_msg_has_payload says whether messages of type `t` carry frame 1. */
bool fb_msg_has_payload(fb_msg_type t);

/*
 * fb_msg_pack encodes `m` into `buf` (capacity `cap`, FB_MAX_CONTROL_LEN is
 * always enough) and sets *len. Strings must be NUL-terminated within their
 * fields. Errors: FB_EINVAL (bad message), FB_ERANGE (buffer too small).
 */
FB_MUST_CHECK fb_err fb_msg_pack(const fb_msg *m, uint8_t *buf, size_t cap,
    size_t *len);

/* The most bytes fb_sa_setup_pack writes. */
#define FB_SA_SETUP_MAX 128

/*
 * fb_sa_setup_pack writes the secure-aggregation fields of RoundStart `rs`
 * (sa_slot .. sa_max_staleness) as a SecAggRound, the payload of an FB_SA_SETUP
 * step: the parameters of a round set up ahead. Errors: FB_ERANGE (cap).
 */
FB_MUST_CHECK fb_err fb_sa_setup_pack(const fb_msg *rs, uint8_t *buf,
    size_t cap, size_t *len);

/*
 * fb_sa_setup_unpack reads such a payload into rs's secure-aggregation
 * fields (secagg set, the rest of rs untouched). Errors: FB_EPROTO
 * (malformed, or a graph seed over 32 bytes).
 */
FB_MUST_CHECK fb_err fb_sa_setup_unpack(const uint8_t *buf, size_t len,
    fb_msg *rs);

/*
 * fb_msg_pack_envelope encodes `m` as a bare Envelope (no prefix), for
 * sealing. Errors as fb_msg_pack.
 */
FB_MUST_CHECK fb_err fb_msg_pack_envelope(const fb_msg *m, uint8_t *buf,
    size_t cap, size_t *len);

/* fb_msg_unpack_envelope decodes a bare Envelope (an opened sealed body);
 * `with_payload` says whether the frame carried a payload. */
FB_MUST_CHECK fb_err fb_msg_unpack_envelope(const uint8_t *buf, size_t len,
    bool with_payload, fb_msg *m, const char **why);

/*
 * fb_msg_unpack decodes frame 0 bytes into *m (zeroed on entry). Anything a
 * peer could get wrong is FB_EPROTO: bad prefix or wire version, a protobuf
 * that does not decode, no body, strings too long or not UTF-8-safe text,
 * too many hidden sizes, a frame longer than FB_MAX_CONTROL_LEN. `why`
 * (may be NULL) receives a static reason for the log on error.
 */
FB_MUST_CHECK fb_err fb_msg_unpack(const uint8_t *buf, size_t len, fb_msg *m,
    const char **why);

/* ---- the link ---- */

#define FB_PEER_ID_MAX 32

/* A peer's ZeroMQ routing id (ROUTER side only). */
typedef struct fb_peer {
	uint8_t id[FB_PEER_ID_MAX];
	uint8_t len;
} fb_peer;

bool fb_peer_equal(const fb_peer *a, const fb_peer *b);

/*
 * fb_upload_chunk is the chunk index that goes `pos`-th in an update
 * starting at `first_chunk` (RoundStart.first_chunk < chunk_count): the
 * chunk_count model chunks from first_chunk on, wrapping around, then the
 * chunks past them (the SecAgg extra chunk) as they are.
 */
uint32_t fb_upload_chunk(uint32_t first_chunk, uint32_t chunk_count,
    uint32_t pos);

/*
 * The door of a ROUTER link (proto/door.c): what a connection may hold
 * before the program says it authenticated (fb_link_peer_trust). With
 * max_pending 0 there is no door and none of this applies.
 */
typedef struct fb_door_opts {
	uint32_t max_connections; /* held at once, authenticated or not; 0:
	                           * as many as the descriptor limit allows
	                           * less fd_reserve (and never more) */
	uint32_t max_pending;     /* not yet authenticated, at once; 0: no
	                           * door */
	uint32_t max_per_source;  /* of those, from one address (> 0) */
	uint32_t handshake_ms;    /* one not authenticated this long after it
	                           * opened is closed (> 0) */
	uint32_t max_pending_bytes; /* bytes received before authenticating
	                             * beyond which it is closed (> 0) */
	uint64_t max_pending_memory; /* bytes pending connections may hold
	                              * together: each may have a frame of
	                              * ZMQ_MAXMSGSIZE in progress, so at
	                              * most this / that many are (> 0) */
	uint32_t fd_reserve;      /* descriptors kept for the program's own
	                           * files: connections never take them */
} fb_door_opts;

typedef struct fb_link_opts {
	uint32_t max_payload; /* frame 1 limit in bytes (the chunk size) */
	int send_timeout_ms;  /* blocking sends give up after this; 0: sends
	                       * never wait (FB_EAGAIN when the queue is full) */
	int hwm;              /* messages queued per peer each way, >= 2 */
	int send_hwm;         /* > 0: the send side's instead of hwm */
	int io_threads;       /* ZeroMQ I/O threads; 0 = ZeroMQ's default */
	int lanes;            /* ROUTER: listening ports (see fb_link_bind) */
	bool queue_unconnected; /* DEALER: queue sends while no connection
	                         * is up (ZeroMQ's default); false: such a
	                         * send finds no room (ZMQ_IMMEDIATE) */
	fb_door_opts door;    /* ROUTER: limits before authentication */
} fb_link_opts;

#define FB_LANES_MAX 64
/* Model chunks a worker may request ahead (transport.fetch_window). */
#define FB_FETCH_WINDOW_MAX 1024

typedef struct fb_link fb_link;

/*
 * fb_link_bind opens a ROUTER socket bound to `endpoint` (e.g.
 * "tcp://0.0.0.0:5555"). Errors: FB_EZMQ (logged with zmq's reason, e.g.
 * address in use), FB_ENOMEM. The caller owns *out.
 *
 * With opts->lanes = L >= 2 (a tcp:// endpoint, L <= io_threads and
 * FB_LANES_MAX) it listens on L ports: lane 0 on endpoint's port, lane i
 * on that port + i (each on an ephemeral port if endpoint's port is "*"
 * or 0). The connections accepted on lane i are served by the I/O threads
 * j with j % L == i. libzmq otherwise gives each new connection to the
 * least loaded I/O thread as it counts them, and connections accepted in
 * a burst can all land on one thread (bench/RESULTS.md); lanes make the
 * spread the coordinator's choice (Redirect).
 */
FB_MUST_CHECK fb_err fb_link_bind(const char *endpoint,
    const fb_link_opts *opts, fb_link **out);
/*
 * With a door (opts->door.max_pending > 0), fb_link_bind also raises the
 * process's soft RLIMIT_NOFILE to its hard limit (at most 2^20) and starts
 * a thread that watches the socket's connections (ZeroMQ's socket
 * monitor) and closes, by shutdown(2) of the descriptor ZeroMQ owns:
 *   - a new connection over max_connections, or over max_pending not yet
 *     authenticated (and no more than max_pending_memory / the socket's
 *     ZMQ_MAXMSGSIZE: libzmq allocates a frame whole when its header
 *     arrives): it takes the place of a pending one (see door.c,
 *     pick_victim: never one in its first moments), or else is refused;
 *   - one more than max_per_source pending from its address: refused;
 *   - a pending connection open for handshake_ms (also the ZMTP handshake
 *     limit, ZMQ_HANDSHAKE_IVL), or past max_pending_bytes received
 *     (checked every 20 ms);
 * and gives freed memory back to the system (malloc_trim) after peers go.
 * It logs what it closed, at most every 10 s. Errors as above, plus
 * FB_EINVAL when the descriptor limit leaves no room for connections.
 */

/*
 * fb_link_connect opens a DEALER socket connecting to `endpoint`; it
 * reconnects by itself when the connection drops (ZeroMQ's reconnect
 * interval, from 250 ms doubling to 4 s, plus up to 250 ms of jitter).
 * Messages are queued only on a connection that is up (ZMQ_IMMEDIATE):
 * while there is none, sends are FB_EAGAIN and nothing stale piles up for
 * the next connection. Errors as fb_link_bind.
 */
FB_MUST_CHECK fb_err fb_link_connect(const char *endpoint,
    const fb_link_opts *opts, fb_link **out);

/*
 * A DEALER link's connection: fb_link_conn_up says whether one is up (its
 * ZMTP handshake done), fb_link_conn_gen counts the connections that came
 * up since the link opened (a new value: the connection was replaced,
 * and what was in flight on the old one may be lost). Both are updated by
 * fb_link_wait, which reports FB_LINK_CONN when either changed. Not
 * thread-safe (the link's thread).
 */
bool fb_link_conn_up(const fb_link *l);
uint32_t fb_link_conn_gen(const fb_link *l);

/*
 * Bytes the kernel has moved on a connection, for liveness that counts
 * bytes rather than whole messages (a 1 MiB frame on a slow link takes
 * long to complete, but its bytes arrive all along): `in` payload bytes
 * received, `acked` bytes sent and acknowledged by the peer (TCP_INFO;
 * both 0 for connections that are not TCP).
 */
typedef struct fb_traffic {
	uint64_t in;
	uint64_t acked;
} fb_traffic;

/* fb_link_traffic fills *t for a DEALER link's current connection.
 * Errors: FB_ECLOSED (no connection up), FB_ENOTSUP (not TCP). */
FB_MUST_CHECK fb_err fb_link_traffic(const fb_link *l, fb_traffic *t);

/*
 * One connection of a ROUTER link, as the caller remembers it for a peer
 * (fields private: a descriptor of ZeroMQ's and its socket's inode, so a
 * descriptor that was closed and reused is not mistaken for it).
 */
typedef struct fb_conn {
	int fd;       /* -1: none */
	uint64_t ino;
} fb_conn;

/*
 * fb_link_last_conn sets *c to the connection the last message received
 * on a ROUTER link came over. When *c already names that descriptor it
 * is left as it is, without a system call (so calling it for every message
 * is cheap); else it costs one fstat. *c gets fd -1 when unknown.
 */
void fb_link_last_conn(fb_link *l, fb_conn *c);

/* fb_link_conn_traffic fills *t for connection c. Errors: FB_ECLOSED
 * (its descriptor no longer is that socket), FB_ENOTSUP (not TCP). */
FB_MUST_CHECK fb_err fb_link_conn_traffic(const fb_conn *c, fb_traffic *t);

/*
 * fb_peer_key is a 64-bit digest of a routing id (never 0), and
 * fb_link_closed_next pops the key of an authenticated connection (one
 * fb_link_peer_trust named) that closed, as the door saw it (ZeroMQ's
 * DISCONNECTED event): false when none is waiting. fb_link_closed_fd is
 * readable while some wait (-1 without a door). Up to 4096 wait; older
 * ones are dropped beyond that (liveness still finds those peers).
 * fb_link_closed_next is for the link's thread.
 */
uint64_t fb_peer_key(const fb_peer *p);
bool fb_link_closed_next(fb_link *l, uint64_t *key);
int fb_link_closed_fd(const fb_link *l);

/* fb_link_lanes is the number of listening ports (1 without lanes);
 * fb_link_lane_port the TCP port lane `lane` listens on (0: none). */
uint32_t fb_link_lanes(const fb_link *l);
uint32_t fb_link_lane_port(const fb_link *l, uint32_t lane);

/*
 * fb_endpoint_port writes to `out` the tcp:// endpoint `endpoint` with its
 * port replaced by `port` ("*" when port is 0): "tcp://host:5555", 5557 ->
 * "tcp://host:5557". FB_EINVAL if endpoint is not tcp://HOST:PORT (PORT
 * digits or "*"), FB_ERANGE if out is too small. *base_port (may be NULL)
 * receives endpoint's own port, 0 for "*".
 */
FB_MUST_CHECK fb_err fb_endpoint_port(const char *endpoint, uint32_t port,
    char *out, size_t cap, uint32_t *base_port);

/* fb_link_close closes the socket without lingering; NULL is a no-op. */
void fb_link_close(fb_link *l);

/*
 * fb_link_send sends `m` (and `payload`, `payload_len` bytes, when the type
 * carries one) to `peer` (ROUTER) or to the coordinator (DEALER; peer is
 * NULL). It blocks up to send_timeout_ms when the peer's queue is full
 * (with send_timeout_ms 0 it never blocks). Errors: FB_EAGAIN (the queue
 * is, or stayed, full: nothing was sent), FB_ECLOSED (ROUTER: peer is
 * gone), FB_EINVAL, FB_EZMQ.
 */
FB_MUST_CHECK fb_err fb_link_send(fb_link *l, const fb_peer *peer,
    const fb_msg *m, const void *payload, size_t payload_len);

/* A received message. Its payload (and sealed frame 0) point into the
 * link's receive buffers and stay valid until the next fb_link_recv or
 * fb_link_close. A sealed frame is returned undecoded (msg.type NONE,
 * `sealed` set): the caller opens it with the sender's session. */
typedef struct fb_frame {
	fb_peer peer;        /* ROUTER: sender's routing id */
	fb_msg msg;
	bool sealed;
	uint8_t *sealed_data; /* frame 0 after the prefix (mutable: opened in
	                       * place) */
	size_t sealed_len;
	uint8_t *payload;     /* mutable, so it can be decrypted in place */
	size_t payload_len;
	size_t wire_len;     /* bytes of all frames, for traffic metrics */
} fb_frame;

/*
 * fb_link_recv waits up to `timeout_ms` (0 = poll, never forever) for a
 * message, also returning early when `wake_fd` (>= 0; -1 for none) becomes
 * readable. Returns FB_OK with *f filled, FB_ETIMEDOUT when nothing came
 * (or wake_fd fired: *woke is then true), FB_EPROTO for a malformed
 * message that was dropped (*why tells why; f->peer and f->wire_len are
 * set so the caller can log and count it), FB_EZMQ on socket failure,
 * FB_ECLOSED when interrupted by a signal. On a ROUTER link a message
 * already queued is returned at once, without polling: *woke is then false
 * even if wake_fd is readable, so the caller checks what wake_fd signals on
 * every call, not only when *woke is set.
 */
FB_MUST_CHECK fb_err fb_link_recv(fb_link *l, int timeout_ms, int wake_fd,
    bool *woke, fb_frame *f, const char **why);

/*
 * fb_link_peer_trust tells the door (ROUTER with a door; otherwise a
 * no-op) that the connection the last received message came over is
 * authenticated: it is no longer pending, and none of the pending limits
 * apply to it. Call it while handling that message, with its f->peer
 * (another peer is ignored), once the message proved its sender (a sealed
 * message that opened; in plain mode, a valid hello). Never blocks; it
 * costs two atomic operations, so calling it for every message is fine.
 */
void fb_link_peer_trust(fb_link *l, const fb_peer *peer);

/* What a ROUTER link's door has seen since the link opened. */
typedef struct fb_door_stats {
	uint32_t max_connections;  /* the cap in force (after the fd limit) */
	uint32_t max_pending;      /* the pending cap in force (after memory) */
	uint32_t fd_limit;         /* RLIMIT_NOFILE's soft limit in force */
	uint32_t connections;      /* held now, authenticated or pending */
	uint32_t pending;          /* held now, not yet authenticated */
	uint32_t peak_connections;
	uint32_t peak_pending;
	uint64_t accepted;         /* connections ZeroMQ accepted */
	uint64_t trusted;          /* that were then authenticated */
	uint64_t refused_source;   /* over max_per_source */
	uint64_t refused_full;     /* over max_connections / max_pending */
	uint64_t evicted;          /* pending, closed to make room */
	uint64_t timed_out;        /* pending past handshake_ms */
	uint64_t over_bytes;       /* pending past max_pending_bytes */
	uint64_t accept_failed;    /* accept(2) failed (EMFILE, ...) */
	uint64_t trims;            /* malloc_trim calls */
} fb_door_stats;

/* fb_link_door_stats fills *out (all zero without a door). Thread-safe;
 * takes the door's lock briefly. */
void fb_link_door_stats(fb_link *l, fb_door_stats *out);

/* What fb_link_wait waits for, and what it found ready. */
#define FB_LINK_IN 1u   /* a message can be received */
#define FB_LINK_OUT 2u  /* a message can be sent without waiting */
#define FB_LINK_WAKE 4u /* wake_fd is readable */
#define FB_LINK_CONN 8u /* DEALER: its connection came up or went down */

/*
 * fb_link_wait waits up to `timeout_ms` (0: poll) until one of the events
 * in `want` (FB_LINK_IN, FB_LINK_OUT; FB_LINK_WAKE with wake_fd >= 0) is
 * ready and sets *ready to those that are (0 on timeout or a signal).
 * FB_LINK_OUT on a DEALER means the coordinator's queue has room for one
 * more message. On a DEALER it also reports FB_LINK_CONN (whatever `want`
 * says) when the connection changed (fb_link_conn_up, fb_link_conn_gen).
 * Errors: FB_EZMQ.
 */
FB_MUST_CHECK fb_err fb_link_wait(fb_link *l, int timeout_ms, int wake_fd,
    unsigned want, unsigned *ready);

/*
 * A payload frame taken out of the link (fb_link_take_payload), owned by
 * the caller, usable from any thread. fb_buf_data's bytes are writable
 * (decryption in place); fb_buf_free(NULL) is a no-op.
 */
typedef struct fb_buf fb_buf;

/*
 * fb_link_take_payload moves the payload frame of the message just received
 * (FB_OK from fb_link_recv with a payload) out of the link, without a copy,
 * so that another thread can consume it after the next fb_link_recv;
 * f->payload then points into *out, which the caller owns on FB_OK and
 * releases with fb_buf_free. Errors: FB_EINVAL (no payload held), FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_link_take_payload(fb_link *l, fb_buf **out);
/* fb_buf_alloc makes a buffer of `len` bytes (contents undefined), for
 * payloads made here rather than received. Errors: FB_ENOMEM. */
FB_MUST_CHECK fb_err fb_buf_alloc(size_t len, fb_buf **out);
uint8_t *fb_buf_data(fb_buf *b);
size_t fb_buf_len(const fb_buf *b);
void fb_buf_free(fb_buf *b);

/*
 * fb_link_send_raw sends a prepared frame 0 (`head`, with its prefix) and,
 * when `payload` is non-NULL, a payload frame. Same blocking and errors as
 * fb_link_send. Used for sealed messages.
 */
FB_MUST_CHECK fb_err fb_link_send_raw(fb_link *l, const fb_peer *peer,
    const uint8_t *head, size_t head_len, const void *payload,
    size_t payload_len);

/*
 * fb_lent is memory whose bytes fb_link_send_from hands to ZeroMQ without a
 * copy (an update of several GB is sent from where it lies). Each message in
 * flight holds a reference, the owner one more: the owner must not write the
 * bytes while fb_lent_idle is false, and fb_lent_free drops the owner's
 * reference (the memory goes once the last message has left the socket or
 * was dropped by fb_link_close). The references are atomic: ZeroMQ's I/O
 * thread drops them.
 */
typedef struct fb_lent fb_lent;

/* fb_lent_new allocates `len` bytes (64-byte aligned, contents undefined).
 * Errors: FB_ENOMEM. */
FB_MUST_CHECK fb_err fb_lent_new(size_t len, fb_lent **out);
void *fb_lent_data(fb_lent *b);
/* True when no message holds the memory: the owner may write it. */
bool fb_lent_idle(const fb_lent *b);
/* True unless an older generation of b (fb_lent_own) is still held by
 * messages: sends from b then copy, so that a peer that stops reading
 * pins at most one old generation, never one per replacement. */
bool fb_lent_lendable(const fb_lent *b);
/* fb_lent_free drops the owner's reference (or one fb_lent_ref took);
 * NULL is a no-op. */
void fb_lent_free(fb_lent *b);
/* fb_lent_notify asks for a wake when b turns idle: each time a release
 * leaves only the owner's reference, 1 is written to the eventfd `fd` (on
 * whichever thread released it, ZeroMQ's I/O thread for a message); -1
 * stops it. Set it before b is lent; fd must outlive b's messages. A
 * replacement from fb_lent_own keeps it. */
void fb_lent_notify(fb_lent *b, int fd);
/* fb_lent_ref takes one more reference for a holder other than the link's
 * messages (dropped by fb_lent_free): b is not idle while it is held.
 * Thread-safe. */
void fb_lent_ref(fb_lent *b);
/*
 * fb_lent_own makes *b writable by its owner: when messages still hold it
 * (say, chunks queued for a peer that stopped reading), *b is replaced by
 * fresh memory of `len` bytes, holding a copy of the old bytes when `keep`,
 * and the old memory is left to those messages. Errors: FB_ENOMEM (*b is
 * then unchanged).
 */
FB_MUST_CHECK fb_err fb_lent_own(fb_lent **b, size_t len, bool keep);

/*
 * fb_link_send_from and fb_link_send_raw_from are fb_link_send and
 * fb_link_send_raw for a payload that lies in `origin`'s memory (NULL: an
 * ordinary send): it is sent without a copy, and the message holds a
 * reference to `origin` until ZeroMQ has written it out; it is copied
 * instead while fb_lent_lendable(origin) is false. On error no reference
 * is left behind.
 */
FB_MUST_CHECK fb_err fb_link_send_from(fb_link *l, const fb_peer *peer,
    const fb_msg *m, const void *payload, size_t payload_len,
    fb_lent *origin);
FB_MUST_CHECK fb_err fb_link_send_raw_from(fb_link *l, const fb_peer *peer,
    const uint8_t *head, size_t head_len, const void *payload,
    size_t payload_len, fb_lent *origin);

/* fb_link_bytes_sent/received count all traffic since open. */
uint64_t fb_link_bytes_sent(const fb_link *l);
uint64_t fb_link_bytes_received(const fb_link *l);


/* ---- sealed messages (secure mode) ---- */

struct fb_session; /* crypto/crypto.h */

/*
 * fb_secure_send packs `m`, seals it with session `s` for `round` and sends
 * it with `payload` (already encrypted by the caller, or NULL). Same
 * blocking and errors as fb_link_send, plus FB_ERANGE from sealing.
 */
FB_MUST_CHECK fb_err fb_secure_send(fb_link *l, const fb_peer *peer,
    struct fb_session *s, uint32_t round, const fb_msg *m,
    const void *payload, size_t payload_len);

/* fb_secure_send_from: the payload lies in `origin` (see
 * fb_link_send_from) and is sent without a copy unless the message type
 * seals its payload here. */
FB_MUST_CHECK fb_err fb_secure_send_from(fb_link *l, const fb_peer *peer,
    struct fb_session *s, uint32_t round, const fb_msg *m,
    const void *payload, size_t payload_len, fb_lent *origin);

/* fb_secure_sender reads the (unauthenticated) sender id of a sealed frame,
 * to find its session. Errors: FB_EPROTO. */
FB_MUST_CHECK fb_err fb_secure_sender(const fb_frame *f, uint32_t *sender);

/*
 * fb_secure_open authenticates and decrypts f's sealed frame 0 with `s`
 * (in place) and decodes it into f->msg. The sealed header's round must
 * equal the round inside the message for round-scoped messages. On error
 * *reject (a fb_reject value, see crypto.h) and *why say what was wrong.
 * Errors: FB_EAUTH, FB_ESTALE, FB_EPROTO.
 */
FB_MUST_CHECK fb_err fb_secure_open(struct fb_session *s, fb_frame *f,
    int *reject, const char **why);

#endif

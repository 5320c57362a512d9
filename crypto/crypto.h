/* SPDX-License-Identifier: Apache-2.0 */
/*
 * crypto.h -- identities, sessions, sealed messages and payload streams.
 *
 * fedbox encrypts and signs every message end to end. This module is the
 * only user of libsodium and works on caller byte buffers only; framing
 * and transport (ZeroMQ, protobuf) live in proto/.
 *
 *   identity   Ed25519 key pair: NAME.key (0600) + NAME.pub (one text line)
 *   handshake  worker hello -> coordinator reply; ephemeral X25519 keys
 *              signed by the identities; yields an fb_session per worker
 *   message    control message sealed with XChaCha20-Poly1305 under a
 *              directional session key; header (run, round, sender, seq,
 *              type) in the clear but authenticated
 *   stream     large payload: crypto_secretstream chunks + a trailer signed
 *              over a BLAKE2b digest of the whole stream
 *
 * Decoders of network bytes never log (a flood would flood the log); they
 * return an fb_err and, through `fb_reject *why`, a reason the caller logs
 * once and counts (fb_reject_name gives a metrics-friendly name). All wire
 * integers are little-endian. Every layout starts with a version byte
 * FB_CRYPTO_WIRE_VERSION and a kind byte, so the four blobs can never be
 * mistaken for each other.
 *
 * Wire layouts (offset:length):
 *
 *   cookie  (FB_HS_COOKIE_LEN = 32), the coordinator's answer to an empty
 *           handshake: 0:8 issue time (LE64, ms on the coordinator's
 *           clock)  8:8 random  16:16 BLAKE2b-128 keyed with the
 *           coordinator's per-process cookie key over
 *           "fedbox/cookie/v1" || bytes 0..16
 *   hello   (FB_HS_HELLO_LEN = 164)
 *     0:1 version  1:1 kind=1  2:2 proto version
 *     4:32 worker Ed25519 pk  36:32 worker ephemeral X25519 pk
 *     68:32 the coordinator's cookie (its freshness: a hello recorded
 *           before the coordinator restarted is refused)
 *     100:64 Ed25519 sig by worker over "fedbox/hello/v1" || bytes 0..100
 *   reply   (FB_HS_REPLY_LEN = 152)
 *     0:1 version  1:1 kind=2  2:2 proto version  4:4 worker id assigned
 *     8:16 run id  24:32 coordinator Ed25519 pk
 *     56:32 coordinator ephemeral X25519 pk
 *     88:64 Ed25519 sig by coordinator over
 *           "fedbox/reply/v1" || hello (all 164) || reply bytes 0..88
 *   sealed message (FB_MSG_HEADER_LEN = 40, then body, then 16-byte MAC)
 *     0:1 version  1:1 message type (caller's)  2:2 reserved, zero
 *     4:16 run id  20:4 round  24:4 sender id  28:8 sequence number
 *     36:4 body length  40:n ciphertext  40+n:16 Poly1305 tag
 *     AEAD = XChaCha20-Poly1305-IETF, AD = bytes 0..40, key = the
 *     sender->receiver session key, nonce = sequence (LE64) || 16 zeros
 *     (sequence numbers start at 1 and never repeat under one key).
 *   stream header (FB_STREAM_HEADER_LEN = 32)
 *     0:1 version  1:1 kind=3  2:1 digest mode (fb_stream_digest)
 *     3:1 reserved, zero  4:4 max chunk length
 *     8:24 TAGS: secretstream header; FULL, INDEXED_TAGS: 8:16 random
 *     nonce, 24:8 zero
 *   stream chunk, TAGS: secretstream ciphertext of up to `max chunk
 *     length` bytes (+17); AD = run id || round || sender; last chunk
 *     tagged FINAL.
 *   stream chunk k, FULL and INDEXED_TAGS: 0:1 flag (0, or 1 on the last chunk), then
 *     XChaCha20-Poly1305-IETF ciphertext and 16-byte tag (+17 in all);
 *     nonce = header nonce || LE64(k); AD = run id || round || sender ||
 *     LE64(k) || flag.
 *   stream trailer (FB_STREAM_TRAILER_LEN = 140)
 *     0:1 version  1:1 kind=4  2:2 reserved, zero  4:16 run id  20:4 round
 *     24:4 sender id  28:8 payload length (plaintext bytes)
 *     36:8 chunk count  44:32 digest
 *     76:64 Ed25519 sig by the sender over "fedbox/trailr/v1" || 0..76
 *     digest = BLAKE2b-256("fedbox/stream/v1" || stream header ||
 *              for each chunk: FULL: SHA-256(LE64(ciphertext length)
 *              || ciphertext); TAGS: LE64(ciphertext length) || the last
 *              16 bytes of the chunk, its Poly1305 tag; INDEXED_TAGS:
 *              LE64(ciphertext length) || LE64(k) || its Poly1305 tag)
 *
 * Session keys: worker = crypto_kx client, coordinator = server, over the
 * two ephemeral keys; each direction's key is then
 * BLAKE2b-256(key = transcript hash, "fedbox/c2s/v1" or "fedbox/s2c/v1" ||
 * kx key), transcript hash = BLAKE2b-256("fedbox/trans/v1" || hello ||
 * reply). Ephemeral secrets are wiped after the handshake: forward secrecy.
 *
 * Global model broadcast (one ciphertext for all workers):
 *   coordinator: fb_stream_push_alloc with ctx = {run, round,
 *     FB_SENDER_COORDINATOR} and FB_STREAM_DIGEST_FULL gives the round key;
 *     fb_msg_seal it to each selected worker's session; push the model
 *     once; fb_stream_push_final with the coordinator identity.
 *   worker: fb_msg_open gives the round key; fb_stream_pull_alloc with the
 *     same ctx and FULL; pull the chunks; fb_stream_pull_final with the
 *     pinned coordinator key.
 * Worker updates use the same calls with sender = the worker's id and
 * FB_STREAM_DIGEST_INDEXED_TAGS (see the enum): the worker seals the
 * chunks on its pool (fb_stream_push_chunk_at), the coordinator opens each
 * in parts after its MAC (fb_stream_pull_chunk_par).
 */
#ifndef FB_CRYPTO_CRYPTO_H
#define FB_CRYPTO_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define FB_CRYPTO_WIRE_VERSION 1

#define FB_PUBKEY_LEN 32
#define FB_SIG_LEN 64
#define FB_RUN_ID_LEN 16
/* A comment in a .pub line: printable bytes, NUL included in this limit. */
#define FB_COMMENT_MAX 128
/* Enough for any public key line fb_pubkey_format writes (with NUL). */
#define FB_PUBLINE_MAX 192
/* "fb:" + 16 hex digits + NUL. */
#define FB_FINGERPRINT_SIZE 20

#define FB_HS_HELLO_LEN 164
#define FB_HS_REPLY_LEN 152
#define FB_HS_COOKIE_LEN 32
#define FB_HS_COOKIE_KEY_LEN 32

#define FB_MSG_HEADER_LEN 40
#define FB_MSG_MAC_LEN 16
#define FB_MSG_OVERHEAD (FB_MSG_HEADER_LEN + FB_MSG_MAC_LEN)
#define FB_MSG_BODY_MAX (64u << 20) /* bytes; control messages only */

#define FB_STREAM_KEY_LEN 32
#define FB_STREAM_HEADER_LEN 32
#define FB_STREAM_CHUNK_OVERHEAD 17     /* ciphertext = plaintext + this */
#define FB_STREAM_CHUNK_MAX (64u << 20) /* bytes of plaintext per chunk */
#define FB_STREAM_TRAILER_LEN 140
#define FB_STREAM_HASH_LEN 32 /* a FULL chunk's own digest */
#define FB_STREAM_PART_ALIGN 64 /* fb_stream_pull_decrypt offsets */

/* Sender id the coordinator uses; worker ids are never this value. */
#define FB_SENDER_COORDINATOR UINT32_C(0xffffffff)
/* Round argument of fb_msg_open that accepts any round. */
#define FB_ROUND_ANY UINT32_C(0xffffffff)

typedef struct fb_pubkey {
	uint8_t b[FB_PUBKEY_LEN]; /* Ed25519 public key */
} fb_pubkey;

typedef struct fb_run_id {
	uint8_t b[FB_RUN_ID_LEN]; /* random per coordinator run */
} fb_run_id;

typedef struct fb_identity fb_identity;
typedef struct fb_handshake fb_handshake;
typedef struct fb_session fb_session;
typedef struct fb_stream_push fb_stream_push;
typedef struct fb_stream_pull fb_stream_pull;

/*
 * Why a decoder rejected its input. The fb_err says how to react; this says
 * what to count. Names (fb_reject_name) are stable metrics keys.
 */
typedef enum fb_reject {
	FB_REJECT_NONE = 0,
	FB_REJECT_MALFORMED,     /* wrong size, version, kind, field: EPROTO */
	FB_REJECT_TOO_LARGE,     /* over a declared or caller limit: EPROTO */
	FB_REJECT_VERSION,       /* other protocol version: ENOTSUP */
	FB_REJECT_UNKNOWN_KEY,   /* worker key not on the allowlist: EAUTH */
	FB_REJECT_UNPINNED_KEY,  /* coordinator key not the pinned one: EAUTH */
	FB_REJECT_BAD_SIGNATURE, /* Ed25519 signature or digest wrong: EAUTH */
	FB_REJECT_BAD_MAC,       /* tampered, reordered or duplicated: EAUTH */
	FB_REJECT_REPLAY,      /* sequence number not above last seen: EAUTH */
	FB_REJECT_WRONG_RUN,   /* other run id: EAUTH */
	FB_REJECT_WRONG_ROUND, /* other round than the caller accepts: ESTALE */
	FB_REJECT_WRONG_SENDER, /* sender id is not the session's peer: EAUTH */
	FB_REJECT_TRUNCATED, /* stream ended before FINAL, counts off: EPROTO */
	FB_REJECT_COUNT_
} fb_reject;

/* fb_reject_name returns a static snake_case name, e.g. "bad_mac". */
const char *fb_reject_name(fb_reject why);

/*
 * fb_crypto_init initialises libsodium. Idempotent and thread-safe; every
 * allocating call here runs it too. Errors: FB_EIO (logged).
 */
FB_MUST_CHECK fb_err fb_crypto_init(void);

/*
 * fb_crypto_ciphers names the library that runs the bulk ChaCha20 passes
 * (model and update chunks, masks; the bytes are the same either way):
 * "libcrypto" (OpenSSL's, with its AVX2/AVX-512 code), "libsodium" when
 * libcrypto has none of them or FEDBOX_CIPHER=libsodium is in the
 * environment (for comparisons), or "libcrypto and libsodium" when it has
 * some (a FIPS provider has no ChaCha20).
 */
const char *fb_crypto_ciphers(void);

/* fb_wipe zeroes `len` bytes in a way the compiler cannot elide. Use it on
 * stream keys and plaintext once they are used. */
void fb_wipe(void *p, size_t len);

#define FB_HASH_LEN 32

/* fb_hash writes the BLAKE2b-256 of `len` bytes at `data` to `out`.
 * Thread-safe; never fails. */
void fb_hash(const void *data, size_t len, uint8_t out[FB_HASH_LEN]);

/* fb_run_id_random fills `run` with 16 random bytes. Thread-safe. */
FB_MUST_CHECK fb_err fb_run_id_random(fb_run_id *run);

/* ---- identities ---------------------------------------------------------- */

/*
 * fb_identity_alloc makes a fresh Ed25519 identity. The secret key lives in
 * sodium_malloc'd memory, inaccessible (PROT_NONE) except while signing.
 * `comment` (may be NULL) is kept for NAME.pub: printable, shorter than
 * FB_COMMENT_MAX. On FB_OK the caller owns *out (fb_identity_free).
 * An fb_identity is thread-safe: sign from any number of threads.
 * Errors: FB_ENOMEM, FB_EINVAL (bad comment), FB_EIO (libsodium init).
 */
FB_MUST_CHECK fb_err fb_identity_alloc(const char *comment, fb_identity **out);

/* fb_identity_alloc_from_seed is fb_identity_alloc with a caller-chosen
 * 32-byte seed: for tests, fuzzing and known answers, never for real keys.*/
FB_MUST_CHECK fb_err fb_identity_alloc_from_seed(
    const uint8_t seed[32], const char *comment, fb_identity **out);

/*
 * fb_identity_load reads a secret key file written by fb_identity_save.
 * It refuses a file that group or others may read or write (logging the
 * path, its mode and "fix it with: chmod 600 PATH"), a file that is not a
 * regular file, and a file whose public line does not match its secret.
 * Blocks on file I/O. On FB_OK the caller owns *out.
 * Errors: FB_EIO (cannot open/read, logged), FB_EINVAL (permissions,
 * logged), FB_EFORMAT (not a fedbox key file, logged), FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_identity_load(const char *path, fb_identity **out);

/*
 * fb_identity_save writes NAME.key (mode 0600, secret) and NAME.pub (0644,
 * the public line + newline). Each file is written to a temporary created
 * with O_EXCL and mode 0600, fsynced, then renamed into place; without
 * `force` an existing NAME.key or NAME.pub is left alone and the call fails.
 * Blocks on file I/O. Errors: FB_EIO (logged, e.g. file exists),
 * FB_EINVAL (name too long).
 */
FB_MUST_CHECK fb_err fb_identity_save(
    const fb_identity *id, const char *name, int force);

/* fb_identity_free wipes and frees `id`; NULL is a no-op. */
void fb_identity_free(fb_identity *id);

/* fb_identity_pubkey returns the public key of `id`. */
void fb_identity_pubkey(const fb_identity *id, fb_pubkey *pk);

/* fb_identity_comment returns the comment ("" if none); valid while `id`
 * lives. */
const char *fb_identity_comment(const fb_identity *id);

/*
 * fb_identity_sign signs `len` bytes with a domain-separation prefix:
 * sig = Ed25519(sk, "fedbox/" || domain || "\0" || msg). `domain` is a
 * short ASCII name of what is signed (e.g. "secagg-session"), at most 32
 * bytes. Thread-safe. Errors: FB_EINVAL (domain too long).
 */
FB_MUST_CHECK fb_err fb_identity_sign(const fb_identity *id, const char *domain,
    const uint8_t *msg, size_t len, uint8_t sig[FB_SIG_LEN]);

/* fb_pubkey_verify checks a signature made by fb_identity_sign.
 * Errors: FB_EAUTH (bad signature), FB_EINVAL (domain too long). */
FB_MUST_CHECK fb_err fb_pubkey_verify(const fb_pubkey *pk, const char *domain,
    const uint8_t *msg, size_t len, const uint8_t sig[FB_SIG_LEN]);

/* ---- public keys as text ------------------------------------------------- */

/*
 * fb_pubkey_parse parses one public key line
 *   fedbox-ed25519 <base64 of 32 bytes> [comment]
 * with an optional trailing "\n" or "\r\n". The key must be a valid,
 * non-small-order Ed25519 point. `comment` (may be NULL) receives the
 * comment ("" if none), truncated to `comment_cap`. Does not log.
 * Errors: FB_EINVAL (any malformation).
 */
FB_MUST_CHECK fb_err fb_pubkey_parse(
    const char *line, fb_pubkey *pk, char *comment, size_t comment_cap);

/* fb_pubkey_format writes the line (no newline) into `buf`.
 * Errors: FB_ERANGE (buf too small), FB_EINVAL (comment not printable). */
FB_MUST_CHECK fb_err fb_pubkey_format(
    const fb_pubkey *pk, const char *comment, char *buf, size_t cap);

/* fb_pubkey_load reads the first line of a .pub file and parses it.
 * Errors: FB_EIO (logged), FB_EINVAL (malformed, logged with the path). */
FB_MUST_CHECK fb_err fb_pubkey_load(
    const char *path, fb_pubkey *pk, char *comment, size_t comment_cap);

/* fb_pubkey_fingerprint writes "fb:" + 16 hex digits of BLAKE2b(pk): short,
 * safe for logs. */
void fb_pubkey_fingerprint(const fb_pubkey *pk, char out[FB_FINGERPRINT_SIZE]);

/* fb_pubkey_equal returns 1 when the keys are equal, else 0. */
int fb_pubkey_equal(const fb_pubkey *a, const fb_pubkey *b);

/* ---- handshake ----------------------------------------------------------- */

/*
 * fb_peer_lookup_cb maps an admitted worker's key to its worker id
 * (< FB_SENDER_COORDINATOR) and returns 1, or returns 0 for an unknown key.
 * Called from fb_handshake_accept on the caller's thread.
 */
typedef int (*fb_peer_lookup_cb)(
    void *arg, const fb_pubkey *pk, uint32_t *worker_id);

/* An allowlist as an array; fb_allowlist_lookup_cb with arg = the list
 * gives worker id = index in `keys`. */
typedef struct fb_allowlist {
	const fb_pubkey *keys;
	size_t count;
} fb_allowlist;
int fb_allowlist_lookup_cb(void *arg, const fb_pubkey *pk, uint32_t *worker_id);

/* What the coordinator side of a handshake needs; borrowed, not owned. */
typedef struct fb_hs_accept_cfg {
	const fb_identity *self;  /* coordinator identity */
	fb_run_id run;            /* this run's id (fb_run_id_random) */
	uint16_t proto_version;   /* hellos with another version: VERSION */
	fb_peer_lookup_cb lookup; /* the allowlist */
	void *lookup_arg;
	const uint8_t *cookie_key; /* FB_HS_COOKIE_KEY_LEN bytes, random per
	                            * coordinator process: its cookies */
	int64_t now_ms;            /* the clock cookies were issued on */
	int64_t cookie_ms;         /* how long a cookie is good for, > 0 */
} fb_hs_accept_cfg;

/*
 * fb_hs_cookie_make (coordinator) writes a fresh cookie (layout above)
 * under `key`, issued at now_ms, for a worker to put in its hello. Cheap:
 * one BLAKE2b, no state. Thread-safe.
 */
void fb_hs_cookie_make(const uint8_t key[FB_HS_COOKIE_KEY_LEN],
    int64_t now_ms, uint8_t cookie[FB_HS_COOKIE_LEN]);

/*
 * fb_hs_cookie_check says whether `cookie` was made under `key` and issued
 * no more than max_ms before now_ms (and not after it). Errors: FB_EAUTH
 * (not made under this key: another coordinator process, or forged),
 * FB_ESTALE (too old, or from the future).
 */
FB_MUST_CHECK fb_err fb_hs_cookie_check(const uint8_t key[FB_HS_COOKIE_KEY_LEN],
    const uint8_t cookie[FB_HS_COOKIE_LEN], int64_t now_ms, int64_t max_ms);

/*
 * fb_handshake_start (worker) makes an ephemeral X25519 key pair and writes
 * the signed hello into `hello`, carrying the coordinator's `cookie` (from
 * its answer to an empty handshake). `coordinator` is the pinned key the
 * reply must come from. On FB_OK the caller owns *out (fb_handshake_free),
 * which keeps the ephemeral secret until freed. Errors: FB_ENOMEM, FB_EIO.
 */
FB_MUST_CHECK fb_err fb_handshake_start(const fb_identity *self,
    const fb_pubkey *coordinator, uint16_t proto_version,
    const uint8_t cookie[FB_HS_COOKIE_LEN], uint8_t hello[FB_HS_HELLO_LEN],
    fb_handshake **out);

/*
 * fb_handshake_accept (coordinator) verifies a hello: size and version,
 * protocol version, worker key on the allowlist, worker signature, then
 * its cookie (made under cfg->cookie_key, at most cfg->cookie_ms old:
 * a hello recorded before this coordinator process started, or long
 * ago, is refused). Then it makes its own ephemeral key, writes the
 * signed reply into `reply` and returns the worker's session in *out
 * (caller owns: fb_session_free). Otherwise stateless: a hello replayed
 * within its cookie's life yields a fresh session nobody can use (the
 * caller remembers the cookies it saw to refuse that too).
 * Does not block; thread-safe for distinct outputs.
 * Errors (with *why): FB_EPROTO (MALFORMED), FB_ENOTSUP (VERSION),
 * FB_EAUTH (UNKNOWN_KEY, BAD_SIGNATURE), FB_ESTALE (REPLAY: the cookie is
 * not this process's or has expired); FB_ENOMEM, FB_EINVAL (no cookie key,
 * or lookup gave FB_SENDER_COORDINATOR). *out = NULL and `reply` zeroed
 * on error.
 */
FB_MUST_CHECK fb_err fb_handshake_accept(const fb_hs_accept_cfg *cfg,
    const uint8_t *hello, size_t hello_len, uint8_t reply[FB_HS_REPLY_LEN],
    fb_session **out, fb_reject *why);

/*
 * fb_handshake_finish (worker) verifies the reply: size and version,
 * coordinator key equal to the pinned one, signature over hello and reply.
 * On FB_OK the caller owns *out. A rejected reply leaves `hs` usable, so a
 * forged reply cannot stop the real one from completing.
 * Errors (with *why): FB_EPROTO (MALFORMED), FB_ENOTSUP (VERSION),
 * FB_EAUTH (UNPINNED_KEY, BAD_SIGNATURE); FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_handshake_finish(fb_handshake *hs, const uint8_t *reply,
    size_t reply_len, fb_session **out, fb_reject *why);

/* fb_handshake_free wipes and frees; NULL is a no-op. */
void fb_handshake_free(fb_handshake *hs);

/* ---- sessions and sealed messages ---------------------------------------- */

/* fb_session_free wipes and frees; NULL is a no-op. */
void fb_session_free(fb_session *s);

/* Accessors of public session facts. */
void fb_session_run_id(const fb_session *s, fb_run_id *run);
void fb_session_peer(const fb_session *s, fb_pubkey *pk);
/* The worker's id: this side's on a worker, the peer's on a coordinator. */
uint32_t fb_session_worker_id(const fb_session *s);
/* The transcript hash, for binding other protocols to this session. */
void fb_session_transcript(const fb_session *s, uint8_t th[32]);

/* The clear header of a sealed message. */
typedef struct fb_msg_info {
	uint8_t type;    /* caller's message type */
	uint32_t round;  /* round the sender sealed it for */
	uint32_t sender; /* worker id or FB_SENDER_COORDINATOR */
	uint64_t seq;    /* > 0, strictly increasing per direction */
	uint32_t body_len;
	fb_run_id run;
} fb_msg_info;

/*
 * fb_msg_seal encrypts `body` into `out` (header || ciphertext || MAC) with
 * the next sequence number. `out_cap` >= body_len + FB_MSG_OVERHEAD.
 * `body` may be disjoint from `out` or exactly out + FB_MSG_HEADER_LEN
 * (in place, no copy). Seal and open may run on two threads at once; two
 * seals on one session may not. Errors: FB_ERANGE (too big for out or
 * FB_MSG_BODY_MAX, or sequence numbers exhausted).
 */
FB_MUST_CHECK fb_err fb_msg_seal(fb_session *s, uint8_t type, uint32_t round,
    const uint8_t *body, size_t body_len, uint8_t *out, size_t out_cap,
    size_t *out_len);

/*
 * fb_msg_open checks and decrypts a sealed message. Order: layout, then run
 * id and sender against the session, then the MAC (before any decryption),
 * then the sequence number (must exceed the last accepted one), then the
 * round (`round` or FB_ROUND_ANY). A message rejected for its round still
 * consumes its sequence number. `body` may be disjoint from `in` or exactly
 * in + FB_MSG_HEADER_LEN. On entry *body_len = 0 and *info is zeroed; on
 * error `body` holds no plaintext.
 * Errors (with *why): FB_EPROTO (MALFORMED, TOO_LARGE: body_cap too small),
 * FB_EAUTH (WRONG_RUN, WRONG_SENDER, BAD_MAC, REPLAY),
 * FB_ESTALE (WRONG_ROUND).
 */
FB_MUST_CHECK fb_err fb_msg_open(fb_session *s, uint32_t round,
    const uint8_t *in, size_t in_len, uint8_t *body, size_t body_cap,
    size_t *body_len, fb_msg_info *info, fb_reject *why);

/* fb_msg_peek parses the clear header WITHOUT authenticating it, to route a
 * message to its session. Errors: FB_EPROTO (malformed). */
FB_MUST_CHECK fb_err fb_msg_peek(
    const uint8_t *in, size_t in_len, fb_msg_info *info);

/* ---- payload streams ----------------------------------------------------- */

/*
 * What the signed digest of a stream covers. FULL: all the ciphertext, so
 * the signature binds the content even against holders of the stream key;
 * required when the key is shared (the global model broadcast). TAGS: each
 * chunk's Poly1305 tag only; as strong against anyone without the key and
 * close to raw secretstream speed (BLAKE2b costs about as much as the
 * cipher), but the receiver, holding the key, could forge chunks with the
 * same tags, so the signature no longer binds the content against it. For
 * worker updates, whose key only the worker and the coordinator know.
 * TAGS' chunks are a secretstream, whose MACs chain: sealed one after the
 * other. INDEXED_TAGS: FULL's chunks (indexed nonce, FINAL flag and index
 * in the AD), each sealed on its own, so on many threads at once, and
 * TAGS' digest (each chunk's length, index and Poly1305 tag). Tags
 * suffice where the key is private to the two ends: without the key no
 * one can make a chunk that verifies under a given tag (each chunk's
 * Poly1305 key comes from the stream key and its index), so the signed
 * tags bind the content against everyone but the receiver, which could
 * as well lie about what it received. Truncation and a moved end are
 * caught as in FULL (the trailer's chunk count and length, the flag in
 * the AD); a chunk at another index than it was sealed at fails its MAC
 * (the index is in its nonce and AD). The updates' mode. The mode is in
 * the stream header; the receiver states the mode it requires.
 */
typedef enum fb_stream_digest {
	FB_STREAM_DIGEST_FULL = 0,
	FB_STREAM_DIGEST_TAGS = 1,
	FB_STREAM_DIGEST_INDEXED_TAGS = 2,
} fb_stream_digest;

/* Who and what a stream belongs to; both ends must agree on it. */
typedef struct fb_stream_ctx {
	fb_run_id run;
	uint32_t round;
	uint32_t sender; /* worker id, or FB_SENDER_COORDINATOR */
} fb_stream_ctx;

/*
 * fb_stream_push_alloc starts a payload stream under a fresh random key,
 * written to `key` (send it inside an fb_msg_seal'd message, then fb_wipe
 * it), and writes the stream header to `header`. Chunks carry at most
 * `chunk_len` bytes (1..FB_STREAM_CHUNK_MAX; ~1 MiB is a good size);
 * `digest` picks what the trailer's digest covers (fb_stream_digest).
 * On FB_OK the caller owns *out (fb_stream_push_free). One thread at a time.
 * Errors: FB_EINVAL (chunk_len, digest), FB_ENOMEM, FB_EIO.
 */
FB_MUST_CHECK fb_err fb_stream_push_alloc(const fb_stream_ctx *ctx,
    size_t chunk_len, fb_stream_digest digest, uint8_t key[FB_STREAM_KEY_LEN],
    uint8_t header[FB_STREAM_HEADER_LEN], fb_stream_push **out);

/*
 * fb_stream_push_chunk encrypts `m_len` (<= chunk_len) bytes into `c`
 * (c_cap >= m_len + FB_STREAM_CHUNK_OVERHEAD); `final` != 0 marks the last
 * chunk (it may be empty). For zero copy put the plaintext at c + 1 (in
 * place); otherwise `m` and `c` must not overlap.
 * Errors: FB_ERANGE (sizes), FB_EINVAL (after the final chunk).
 */
FB_MUST_CHECK fb_err fb_stream_push_chunk(fb_stream_push *p, const uint8_t *m,
    size_t m_len, int final, uint8_t *c, size_t c_cap, size_t *c_len);

/*
 * fb_stream_push_chunk_at seals chunk `index` of a FULL or INDEXED_TAGS
 * stream on its own,
 * as fb_stream_push_chunk would have as the index-th chunk, and writes the
 * chunk's hash for the trailer's digest to `hash`. Chunks may be sealed in
 * any order and on several threads at once (`p` is only read); then
 * fb_stream_push_hashes takes their hashes in index order. A chunk may be
 * sealed again, before or after the trailer is signed: the same index and
 * plaintext give the same bytes (a sender that keeps no ciphertext seals
 * each chunk again when it is fetched). `hash` may be NULL: not computed.
 * (An INDEXED_TAGS "hash" is the chunk's digest entry, see the top.)
 * Errors: FB_EINVAL (a TAGS stream), FB_ERANGE (sizes).
 */
FB_MUST_CHECK fb_err fb_stream_push_chunk_at(const fb_stream_push *p,
    uint64_t index, const uint8_t *m, size_t m_len, int final, uint8_t *c,
    size_t c_cap, size_t *c_len, uint8_t hash[FB_STREAM_HASH_LEN]);

/*
 * fb_stream_push_hashes appends `count` chunk hashes (count *
 * FB_STREAM_HASH_LEN bytes, in index order) of chunks holding payload_len
 * plaintext bytes in all to a FULL or INDEXED_TAGS stream's digest; `final` says the last
 * of them was the FINAL chunk. One thread. Errors: FB_EINVAL (a TAGS
 * stream, or finished).
 */
FB_MUST_CHECK fb_err fb_stream_push_hashes(fb_stream_push *p,
    const uint8_t *hashes, uint64_t count, uint64_t payload_len, int final);

/*
 * fb_stream_push_final signs the trailer with `signer` (whose key the
 * receiver expects) after the final chunk. Errors: FB_EINVAL (no final
 * chunk yet).
 */
FB_MUST_CHECK fb_err fb_stream_push_final(fb_stream_push *p,
    const fb_identity *signer, uint8_t trailer[FB_STREAM_TRAILER_LEN]);

/* fb_stream_push_free wipes and frees; NULL is a no-op. */
void fb_stream_push_free(fb_stream_push *p);

/*
 * fb_stream_pull_alloc starts decrypting a stream given its key and header.
 * `max_chunk_len` bounds the chunk length the header may declare (memory);
 * a header of another digest mode than `digest` is MALFORMED (no downgrade).
 * On FB_OK the caller owns *out (fb_stream_pull_free). One thread at a time.
 * Errors (with *why): FB_EPROTO (MALFORMED, TOO_LARGE); FB_EINVAL (digest
 * not a mode), FB_ENOMEM, FB_EIO.
 */
FB_MUST_CHECK fb_err fb_stream_pull_alloc(const fb_stream_ctx *ctx,
    fb_stream_digest digest, const uint8_t key[FB_STREAM_KEY_LEN],
    const uint8_t *header, size_t header_len, size_t max_chunk_len,
    fb_stream_pull **out, fb_reject *why);

/*
 * fb_stream_pull_chunk verifies (MAC first) and decrypts one chunk into `m`
 * (m_cap >= c_len - FB_STREAM_CHUNK_OVERHEAD); for zero copy pass
 * m = c + 1 (in place). *final is set on the FINAL chunk. The plaintext is
 * authentic under the stream key but the payload is complete and attributed
 * to the signer only when fb_stream_pull_final returns FB_OK. After any
 * error the stream is dead: later calls return the same error.
 * Errors (with *why): FB_EPROTO (MALFORMED: too short, unknown tag, chunk
 * after FINAL; TOO_LARGE), FB_EAUTH (BAD_MAC: tampered, reordered,
 * duplicated or from another stream), FB_ERANGE (m_cap too small).
 */
FB_MUST_CHECK fb_err fb_stream_pull_chunk(fb_stream_pull *p, const uint8_t *c,
    size_t c_len, uint8_t *m, size_t m_cap, size_t *m_len, int *final,
    fb_reject *why);

/*
 * A TAGS or INDEXED_TAGS chunk opened on several threads:
 * fb_stream_pull_open checks the next chunk (sizes, then its MAC over the
 * whole chunk, then its tag or flag; one thread), takes it
 * into the digest and moves the chain on; fb_stream_pull_decrypt then
 * decrypts parts of it, and fb_stream_pull_close ends it. Chunks come in
 * order as for fb_stream_pull_chunk, and so do its errors: after any
 * error the stream is dead.
 */

/*
 * fb_stream_pull_open checks ciphertext chunk `c` (c_len bytes) of a TAGS
 * or INDEXED_TAGS stream as fb_stream_pull_chunk would, and opens it for its parts: on
 * FB_OK *m_len is its plaintext length (<= m_cap) and *final is set on the
 * FINAL chunk; nothing is decrypted yet. No other pull call but
 * fb_stream_pull_decrypt until fb_stream_pull_close. Errors (with *why):
 * as fb_stream_pull_chunk's, and FB_EINVAL (a FULL stream, or a chunk
 * already open).
 */
FB_MUST_CHECK fb_err fb_stream_pull_open(fb_stream_pull *p, const uint8_t *c,
    size_t c_len, size_t m_cap, size_t *m_len, int *final, fb_reject *why);

/*
 * fb_stream_pull_decrypt decrypts plaintext bytes off .. off + len - 1 of
 * the open chunk `c` (as given to fb_stream_pull_open) into m[off ..].
 * `off` is a multiple of FB_STREAM_PART_ALIGN; `m` and `c` do not
 * overlap, or m == c + 1 (in place). Any number of threads at once (`p` is only read), on parts
 * that do not overlap. Errors: FB_EINVAL (no chunk open), FB_ERANGE (off,
 * len).
 */
FB_MUST_CHECK fb_err fb_stream_pull_decrypt(const fb_stream_pull *p,
    const uint8_t *c, size_t off, size_t len, uint8_t *m);

/* fb_stream_pull_close ends the open chunk (wipes its key); after its
 * parts, one thread. No-op without one. */
void fb_stream_pull_close(fb_stream_pull *p);

/*
 * fb_stream_pull_chunk_par is fb_stream_pull_chunk (same contract, m and c
 * not overlapping or m == c + 1) with a TAGS or INDEXED_TAGS chunk's
 * decryption split in
 * parts of 128 KiB or more after its MAC verified: run(ctx, n, fn, arg)
 * must call fn(arg, i) for every i in [0, n), on any threads, and return
 * when all are done (the signature of aggregation.h's fb_par_run). A FULL
 * stream's chunk goes in one piece.
 */
FB_MUST_CHECK fb_err fb_stream_pull_chunk_par(fb_stream_pull *p,
    const uint8_t *c, size_t c_len, uint8_t *m, size_t m_cap, size_t *m_len,
    int *final, fb_reject *why,
    void (*run)(void *ctx, uint32_t n, void (*fn)(void *arg, uint32_t i),
        void *arg),
    void *ctx);

/*
 * fb_stream_pull_chunk_at verifies (MAC first) and decrypts chunk `index`
 * of a FULL or INDEXED_TAGS stream on its own, as fb_stream_pull_chunk
 * would have as the
 * index-th chunk, and writes the chunk's hash for the trailer's digest to
 * `hash`. Chunks may be taken in any order and on several threads at once
 * (`p` is only read); `m` and `c` must not overlap. *final is set on the
 * FINAL chunk. Nothing counts until fb_stream_pull_hashes has taken the
 * hashes in index order, and nothing is complete or attributed before
 * fb_stream_pull_final. Errors (with *why): FB_EINVAL (a TAGS stream, or
 * finished or dead), FB_EPROTO (MALFORMED, TOO_LARGE), FB_ERANGE (m_cap),
 * FB_EAUTH (BAD_MAC: tampered, another index or another stream).
 */
FB_MUST_CHECK fb_err fb_stream_pull_chunk_at(const fb_stream_pull *p,
    uint64_t index, const uint8_t *c, size_t c_len, uint8_t *m,
    size_t m_cap, size_t *m_len, int *final, uint8_t hash[FB_STREAM_HASH_LEN],
    fb_reject *why);

/*
 * fb_stream_pull_hashes appends `count` chunk hashes (count *
 * FB_STREAM_HASH_LEN bytes) from fb_stream_pull_chunk_at of the chunks
 * numbered from the stream's chunk count on, in index order, holding
 * payload_len plaintext bytes in all, to a FULL or INDEXED_TAGS stream's
 * digest; `final`
 * says the last of them was the FINAL chunk. One thread. Errors:
 * FB_EINVAL (a TAGS stream, or finished or dead).
 */
FB_MUST_CHECK fb_err fb_stream_pull_hashes(fb_stream_pull *p,
    const uint8_t *hashes, uint64_t count, uint64_t payload_len, int final);

/*
 * fb_stream_pull_final verifies the trailer: signature by `signer`, then
 * run/round/sender against the ctx, then payload length, chunk count and
 * digest against what was pulled. On FB_OK *payload_len (may be NULL) is
 * the total plaintext length. A rejected trailer leaves `p` usable.
 * Errors (with *why): FB_EPROTO (MALFORMED; TRUNCATED: no FINAL chunk yet
 * or counts differ), FB_EAUTH (BAD_SIGNATURE, WRONG_RUN, WRONG_SENDER),
 * FB_ESTALE (WRONG_ROUND).
 */
FB_MUST_CHECK fb_err fb_stream_pull_final(fb_stream_pull *p,
    const fb_pubkey *signer, const uint8_t *trailer, size_t trailer_len,
    uint64_t *payload_len, fb_reject *why);

/* fb_stream_pull_free wipes and frees; NULL is a no-op. */
void fb_stream_pull_free(fb_stream_pull *p);

/* ======================================================================== */
/*
 * Secure aggregation (issue 4): Shamir sharing (shamir.c), mask expansion
 * (mask.c), the neighbour graph and the per-worker and server steps of
 * SecAgg+ (secagg.c). Pure functions over caller buffers; transport,
 * timeouts and the round state machine are the caller's.
 *
 * Protocol (Bonawitz et al. 2017, "Practical Secure Aggregation for
 * Privacy-Preserving Machine Learning", with the sparse neighbour graph of
 * Bell et al. 2020, "Secure Single-Server Aggregation with (Poly)Logarithmic
 * Overhead"). The round's n workers have indices 0..n-1 (the coordinator's
 * slots; the caller maps its worker ids to them). Round parameters
 * (fb_secagg_params) are public: run id, round, n, degree k, threshold t,
 * and 32 bytes of coordinator randomness for the graph.
 *   0 keys     each worker holds an X25519 key pair c (share encryption)
 *              for its session (fb_secagg_keys) and makes, each round, an
 *              X25519 key pair s (pairwise masks) and a 32-byte self-mask
 *              seed b; it advertises c_pk, signed by its identity once a
 *              session, with the round's s_pk and H(b). The coordinator
 *              relays the adverts (at least to each worker's neighbours).
 *              U1 = workers whose advert arrived.
 *   1 shares   worker i Shamir-shares b_i and s_sk_i t-of-(|N1(i)|+1)
 *              among itself and its neighbours in U1 (x = index + 1) and
 *              seals each neighbour's pair of shares under the round's
 *              key from X25519(c_i, c_j), binding both s_pk: the
 *              coordinator relays ciphertexts it cannot read or redirect
 *              to another s key. U2 = workers whose shares went out.
 *   2 masking  y_i = x_i + PRG(b_i) + sum_{j in N(i), j in U2}
 *              sigma_ij PRG(s_ij)  (mod 2^32), sigma_ij = +1 if i < j,
 *              -1 if i > j, s_ij = H(X25519(s_i, s_pk_j), keys, run,
 *              round). The coordinator adds y_i into its sum as it streams
 *              in. U3 = workers whose y_i was added completely.
 *   3 unmask   each survivor reveals, for each owner j whose shares it
 *              holds: the b-share if j is in U3, else the s-share; never
 *              both for one j (fb_secagg_worker_reveal refuses). The
 *              coordinator reconstructs b_i (i in U3, checked against H(b))
 *              and s_j (j in U2 \ U3, checked against s_pk_j) and subtracts
 *              PRG(b_i) and the residual pairwise masks sigma_ij PRG(s_ij)
 *              (i in U3, j dropped) chunk by chunk: sum = sum_{i in U3} x_i.
 *   3a confirm the coordinator sends U3 to every worker in it; each signs
 *              the set it was told (fb_secagg_worker_confirm, once per
 *              round: it never signs two sets) and the coordinator relays
 *              to each confirmer its neighbours' signatures (U4 = the
 *              confirmers). A worker reveals only once it holds t valid
 *              signatures over its own set (its own and its neighbours'),
 *              the ConsistencyCheck round of Bonawitz et al.: a
 *              coordinator that tells two workers different sets cannot
 *              collect t confirmations of both from honest workers.
 * Pairwise masks of two workers in U3 cancel. The dropped worker's
 * own input is absent (its y never completed), so its self-mask needs
 * nothing. Threat model: under an honest-but-curious coordinator the
 * coordinator learns only the sum of at least t inputs. Against one that
 * lies, each identity key signs for one slot (a second advert or
 * confirmation under a key already seen for another slot is refused, by
 * the workers and by the server side), each worker holds at most one
 * kind of share revealed per owner, and the confirmations bind the
 * included set; the workers' own threshold floor (not enforced here: the
 * caller's policy) keeps t a majority of each neighbourhood, so that two
 * conflicting sets would need t - ((k + 1) - t) colluding neighbours. The
 * terms that weigh and encode the inputs are bound into the share keys
 * (fb_secagg_terms): an input is masked only with neighbours told its
 * terms, and goes in only beside t - 1 of them.
 *
 * Key lifetimes (issue 25). b and s are one round's: made by
 * fb_secagg_worker_alloc_keys and wiped by _free, and every message
 * carries run and round inside its authenticated bytes, so nothing of
 * round r is taken in round r + 1 (an advert gets FB_ESTALE, a share
 * message does not open). c is the session's (fb_secagg_keys: in the
 * worker, the process's), and so is its advert signature; each pair's
 * X25519(c_i, c_j) is made once a session and cached, and each round's
 * share key is a KDF of it with run and round. What a reveal exposes,
 * and for how long: b_i (i included) gives PRG(b_i), round r's self-mask
 * of i; s_sk_j (j dropped) gives j's pair seeds of round r, and of no
 * other round: s is never used again. c_sk is never revealed. So no
 * reveal needs a new agreement afterwards: the per-round s is that
 * renewal, made before it is needed, for one key pair and k X25519 a
 * round. Why s is not kept for a session: a recovery reconstructs s_sk_j
 * itself, the input of the pair-seed KDF, not one round's output, so with
 * a session-long s it would yield j's pair seeds of all rounds under the
 * key, the earlier ones included; in each earlier round r' where j was
 * included the coordinator reconstructed b_j (as it must) and received
 * y_j (each upload arrives on its own stream), so it could remove every
 * mask of y_j and read x_j of round r'. That needs no lie, one real
 * dropout after rounds with j included; a rekey after the reveal would
 * protect the rounds after it, not those before. What a session c costs
 * is forward secrecy within the session: whoever takes worker i's memory
 * (its c_sk) and recorded the session's share messages can open those i
 * sent, its own shares of b_i and s_i of every round so far, and so,
 * with i's recorded y_i, read i's past updates; and those i received,
 * one holder's shares of each neighbour's secrets (below the threshold
 * unless t holders are taken, the bound the protocol has anyway). Whoever
 * holds i's memory holds its data and, as the coordinator, every model
 * it trained from, from which its updates follow; per-round c would
 * guard them for one key pair and k X25519 a round, a ratchet of each
 * pair's key for a hash a round (neither built). A restart makes a new c,
 * and so does every new session (fb_secagg_keys). The setup stays
 * off a round's critical path by running round r + 1's adverts and
 * shares while round r runs (secagg_test: "a round set up during the
 * previous one"; secure_aggregation.setup_ahead, coordinator/secagg.c).
 * A coordinator that claims a dropout gains what the threat model above
 * says: that round's s_j, i.e. j's pair masks of that round, while each
 * honest holder gives it one kind of share of j per round, never both,
 * so b_j of that round stays out of its reach without colluders. A
 * coordinator that replaces an s_pk in a relayed advert gets share
 * messages that do not open at either end of the pair: the two workers
 * hold no shares of each other, and mask with neither's key.
 *
 * Ring: masks live in Z_2^32. An encoding into Z_2^bits (bits <= 32, see
 * aggregation.h) embeds into it: the sum mod 2^32 reduced mod 2^bits is the
 * sum mod 2^bits, and a masked value mod 2^bits is still uniform, so a
 * transport may send only the low `bits` bits of each masked coordinate.
 */

/* ---- Shamir sharing over GF(2^61 - 1) ----------------------------------- */

#define FB_SHAMIR_SECRET_LEN 32
/* A 32-byte secret is 5 field elements: limbs 0..3 are bytes [7l, 7l+7)
 * little-endian (< 2^56), limb 4 is bytes 28..31 (< 2^32). */
#define FB_SHAMIR_LIMBS 5
/* Packed share: x (LE32) || y[0..5) (LE64 each, < p). */
#define FB_SHAMIR_SHARE_LEN (4 + 8 * FB_SHAMIR_LIMBS)
/* Largest evaluation point and number of shares. */
#define FB_SHAMIR_X_MAX (1u << 20)

/* One share: the evaluation of 5 independent polynomials (one per limb)
 * of degree t - 1 at x. Holds secret material: wipe it after use. */
typedef struct fb_shamir_share {
	uint32_t x;                  /* 1..FB_SHAMIR_X_MAX; worker index + 1 */
	uint64_t y[FB_SHAMIR_LIMBS]; /* each < 2^61 - 1 */
} fb_shamir_share;

/*
 * fb_shamir_split makes `count` shares of `secret` at the distinct points
 * xs[0..count) (1..FB_SHAMIR_X_MAX), any t of which (1 <= t <= count)
 * reconstruct it and fewer reveal nothing. Coefficients come from
 * randombytes_buf and are wiped. `out` (count shares) is zeroed first.
 * Thread-safe. Errors: FB_EINVAL (t, count, xs), FB_ENOMEM, FB_EIO.
 */
FB_MUST_CHECK fb_err fb_shamir_split(const uint8_t secret[FB_SHAMIR_SECRET_LEN],
    uint32_t t, const uint32_t *xs, uint32_t count, fb_shamir_share *out);

/*
 * fb_shamir_split_coeffs is fb_shamir_split with caller coefficients, for
 * known-answer tests only: coeffs[l * (t - 1) + d - 1] (each < p) is the
 * coefficient of x^d of limb l's polynomial, d = 1..t-1.
 */
FB_MUST_CHECK fb_err fb_shamir_split_coeffs(
    const uint8_t secret[FB_SHAMIR_SECRET_LEN], uint32_t t, const uint32_t *xs,
    uint32_t count, const uint64_t *coeffs, fb_shamir_share *out);

/*
 * fb_shamir_combine reconstructs the secret from `count` >= t shares of a
 * t-of-n sharing by Lagrange interpolation at 0 over the first t; each
 * further share must lie on the same polynomial. Checks, in order:
 * FB_EINVAL (t == 0, n == 0 or n > FB_SHAMIR_X_MAX), FB_ERANGE (count < t:
 * below threshold), FB_EPROTO (a y >= p, an x of 0 or above n, or two
 * shares with one x), FB_EAUTH (inconsistent: a further share is off the
 * polynomial, or a reconstructed limb is out of its range). With more than
 * t shares a corrupted one is always caught. Among exactly t it cannot be
 * (any t points fit a polynomial): the limb range check catches random
 * corruption with probability about 31/32 per limb, but a small change
 * with small Lagrange coefficients can keep a limb in range and give a
 * wrong secret with FB_OK (tests/vectors/shamir.txt has such cases).
 * Callers that know a commitment to the secret check it (secagg does).
 * `secret` is zeroed on any error. Thread-safe. Also FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_shamir_combine(const fb_shamir_share *shares,
    uint32_t count, uint32_t t, uint32_t n,
    uint8_t secret[FB_SHAMIR_SECRET_LEN]);

/* fb_shamir_share_pack writes the FB_SHAMIR_SHARE_LEN-byte form. */
void fb_shamir_share_pack(const fb_shamir_share *s,
    uint8_t out[FB_SHAMIR_SHARE_LEN]);

/* fb_shamir_share_unpack parses it. Errors: FB_EPROTO (x == 0 or a
 * y >= p; *s zeroed). */
FB_MUST_CHECK fb_err fb_shamir_share_unpack(
    const uint8_t in[FB_SHAMIR_SHARE_LEN], fb_shamir_share *s);

/* ---- masks --------------------------------------------------------------- */

#define FB_MASK_SEED_LEN 32
/* Masks cover at most 2^32 ChaCha20 blocks of 16 elements each. */
#define FB_MASK_MAX_ELEMS (UINT64_C(1) << 36)

/* What a keystream is for; part of the nonce, so no two roles share one. */
typedef enum fb_mask_role {
	FB_MASK_SELF = 1,  /* self-mask PRG(b_i) */
	FB_MASK_PAIR = 2,  /* pairwise mask PRG(s_ij) */
	FB_MASK_GRAPH = 3, /* neighbour graph permutation */
} fb_mask_role;

/* One mask term of fb_mask_apply: v += sign * PRG(seed, role, round). */
typedef struct fb_mask_term {
	uint8_t seed[FB_MASK_SEED_LEN];
	uint8_t role;  /* fb_mask_role */
	int8_t sign;   /* +1 or -1 */
} fb_mask_term;

/*
 * PRG(seed, role, round) is the ChaCha20 (IETF, 20 rounds) keystream under
 * key = seed and nonce = "fbm" || role (1 byte) || round (LE32) || 4 zero
 * bytes, read as little-endian uint32 words: element e is bytes
 * [4e, 4e+4) of the stream, i.e. word e mod 16 of block e / 16. Random
 * access by block counter lets a mask stream chunk by chunk.
 *
 * fb_mask_add sets v[i] += PRG[offset + i] (mod 2^32) for i < count;
 * fb_mask_sub subtracts it. Memory: a 16 KiB stack buffer; no mask is
 * materialised. Thread-safe. Errors: FB_ERANGE (offset + count above
 * FB_MASK_MAX_ELEMS), FB_EINVAL (role); v untouched on error.
 */
FB_MUST_CHECK fb_err fb_mask_add(uint32_t *v, uint64_t offset, uint64_t count,
    const uint8_t seed[FB_MASK_SEED_LEN], fb_mask_role role, uint32_t round);
FB_MUST_CHECK fb_err fb_mask_sub(uint32_t *v, uint64_t offset, uint64_t count,
    const uint8_t seed[FB_MASK_SEED_LEN], fb_mask_role role, uint32_t round);

/*
 * fb_mask_apply adds all `nterms` terms into v[0..count) (elements
 * offset.. of the masks), block by block so that v stays in cache while
 * each term's keystream is made: the one pass a worker (all its masks) or
 * the coordinator (all corrections) needs per chunk. Errors as fb_mask_add
 * (and FB_EINVAL for a sign other than +-1).
 */
FB_MUST_CHECK fb_err fb_mask_apply(uint32_t *v, uint64_t offset,
    uint64_t count, const fb_mask_term *terms, uint32_t nterms,
    uint32_t round);

/*
 * fb_mask_pair_seed derives the seed both ends of a pair compute:
 *   BLAKE2b-256("fedbox/secagg-pair/v1" || min(pk_a, pk_b) ||
 *               max(pk_a, pk_b) || run || LE32 round || X25519(sk, peer))
 * (min/max by memcmp, so it is order-independent). `self_pk` is sk's
 * public key. Errors: FB_EAUTH (peer key of small order: all-zero shared
 * secret), FB_EINVAL (equal keys); `seed` zeroed on error.
 */
FB_MUST_CHECK fb_err fb_mask_pair_seed(const uint8_t sk[32],
    const uint8_t self_pk[32], const uint8_t peer_pk[32], const fb_run_id *run,
    uint32_t round, uint8_t seed[FB_MASK_SEED_LEN]);

/* ---- the neighbour graph ------------------------------------------------- */

/* fb_secagg_params.degree value asking for fb_secagg_degree_auto. */
#define FB_SECAGG_DEGREE_AUTO 0u
/* The most workers in one secure round. */
#define FB_SECAGG_MAX_WORKERS 65536u
/* c of the automatic degree k = ceil(c * log2 n). */
#define FB_SECAGG_AUTO_C 3.0

typedef struct fb_secagg_graph fb_secagg_graph;

/*
 * fb_secagg_degree_auto returns the automatic degree for n >= 2 workers and
 * threshold t: k = max(ceil(3 log2 n), t - 1), rounded up to even, at most
 * n - 1 (the complete graph). c = 3 is a practical default (n = 16: 12,
 * 64: 18, 128: 22, 1000: 30), not Bell et al.'s proven constant, which
 * depends on the tolerated dropout and corruption rates; pass a number to
 * choose another degree.
 */
uint32_t fb_secagg_degree_auto(uint32_t n, uint32_t t);

/* fb_secagg_threshold_default returns the majority of a neighbourhood of
 * degree k (k neighbours plus the worker itself): floor((k + 1) / 2) + 1,
 * e.g. 3 for n = 5 on the complete graph. */
uint32_t fb_secagg_threshold_default(uint32_t k);

/*
 * fb_secagg_graph_alloc derives the round's graph on n workers (2..
 * FB_SECAGG_MAX_WORKERS) from the coordinator's 32 random bytes: a random
 * Harary graph (Bell et al. 2020): positions on a cycle from a Fisher-Yates
 * shuffle driven by PRG(seed, FB_MASK_GRAPH, round) (unbiased by
 * rejection), each worker joined to the k/2 nearest positions on either
 * side. `degree` 0 is auto (with threshold t), an odd k is rounded up, k >=
 * n - 1 is the complete graph (classic SecAgg). Symmetric and identical on
 * every node given the same inputs. Errors: FB_EINVAL, FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_secagg_graph_alloc(uint32_t n, uint32_t degree,
    uint32_t t, const uint8_t seed[32], uint32_t round,
    fb_secagg_graph **out);

/* fb_secagg_graph_free releases it; NULL is a no-op. */
void fb_secagg_graph_free(fb_secagg_graph *g);

/* fb_secagg_graph_degree returns the actual degree k (every node has it). */
uint32_t fb_secagg_graph_degree(const fb_secagg_graph *g);

/* fb_secagg_graph_adjacent returns 1 when i != j are neighbours, else 0. */
int fb_secagg_graph_adjacent(const fb_secagg_graph *g, uint32_t i,
    uint32_t j);

/* fb_secagg_graph_neighbours writes i's k neighbours, ascending, into
 * out[0..k). Errors: FB_EINVAL (i out of range). */
FB_MUST_CHECK fb_err fb_secagg_graph_neighbours(const fb_secagg_graph *g,
    uint32_t i, uint32_t *out);

/* ---- SecAgg+ steps ------------------------------------------------------- */

/* Key advertisement, FB_SECAGG_ADV_LEN = 188 bytes:
 *   0:1 version  1:1 kind=16  2:2 reserved, zero  4:16 run id  20:4 round
 *   24:4 worker index  28:32 c_pk (the session's)  60:32 s_pk (the
 *   round's)  92:32 H(b) = BLAKE2b-256("fedbox/secagg-b/v1" || run ||
 *   LE32 round || LE32 index || b)
 *   124:64 fb_identity_sign(domain "secagg-session", bytes 0..20 ||
 *         bytes 28..60): the session part, the same bytes every round.
 * Round, index, s_pk and H(b) are outside the signature: the pair's share
 * messages bind both s_pk (their AEAD's associated data), the coordinator
 * takes H(b) from the worker's own advert on its authenticated session,
 * and the coordinator assigns the index and round anyway. */
#define FB_SECAGG_ADV_LEN 188
/* An advert as the coordinator relays it to a neighbour: LE32 slot ||
 * the owner's identity key || the advert. */
#define FB_SECAGG_PEER_ENTRY_LEN (4 + FB_PUBKEY_LEN + FB_SECAGG_ADV_LEN)
/* Sealed shares from one worker to one neighbour, 136 bytes:
 *   0:1 version  1:1 kind=17  2:2 reserved  4:16 run  20:4 round
 *   24:4 from  28:4 to  32:88 ciphertext of (b-share || s-share, packed)
 *   120:16 tag.  XChaCha20-Poly1305-IETF, AD = bytes 0..32 || the
 *   sender's s_pk || the recipient's s_pk (not sent: both ends hold
 *   them from the adverts), nonce = LE32 from || LE32 to || 16 zero
 *   bytes, key = BLAKE2b-256("fedbox/secagg-enc/v1" || min(c_pk) ||
 *   max(c_pk) || run || LE32 round || the round's terms digest
 *   (fb_secagg_params.terms) || X25519(c_sk, peer c_pk)), the X25519 of
 *   the session keys, made once a pair and session. */
#define FB_SECAGG_SHARE_MSG_LEN 136
/* Reveal: header 0:1 version 1:1 kind=18 2:2 reserved 4:16 run 20:4 round
 * 24:4 from 28:4 count, then count entries of FB_SECAGG_REVEAL_ENTRY_LEN:
 * 0:4 owner index 4:1 kind (1 = b-share, 2 = s-share) 5:3 zero
 * 8:44 packed share. Secret material: send it sealed (fb_msg_seal). */
#define FB_SECAGG_REVEAL_HEADER_LEN 32
#define FB_SECAGG_REVEAL_ENTRY_LEN (8 + FB_SHAMIR_SHARE_LEN)
/* Confirmation of the included set, 128 bytes:
 *   0:1 version  1:1 kind=19  2:2 reserved, zero  4:16 run id  20:4 round
 *   24:4 signer index  28:4 n
 *   32:32 H(U3) = BLAKE2b-256("fedbox/secagg-u3/v1" || run || LE32 round
 *         || LE32 n || n bytes, 1 for each included worker, else 0)
 *   64:64 fb_identity_sign(domain "secagg-included", bytes 0..64) */
#define FB_SECAGG_CONFIRM_LEN 128

typedef struct fb_secagg_params {
	fb_run_id run;
	uint32_t round;
	uint32_t n;         /* workers in the round, 2..FB_SECAGG_MAX_WORKERS */
	uint32_t degree;    /* k; FB_SECAGG_DEGREE_AUTO; >= n - 1: complete */
	uint32_t threshold; /* t, 2..k+1 (actual k): shares to reconstruct */
	uint8_t graph_seed[32]; /* coordinator randomness for the round */
	/* fb_secagg_bind_terms' digest of the round's terms (all zero: none
	 * bound); it goes into every share key, so two neighbours told
	 * different terms cannot open each other's shares */
	uint8_t terms[32];
} fb_secagg_params;

/*
 * The terms of a round that fix how each input is encoded and weighed,
 * public to its workers. A worker weighs its own input, from these and
 * its sample count: a coordinator that told one worker a max_samples (or
 * a max_staleness) and its neighbours another could weigh the neighbours
 * down to nothing and read that worker's input nearly alone in the sum.
 * Bound into the share keys (fb_secagg_bind_terms), a difference between
 * two neighbours makes their shares unreadable to each other: each counts
 * the other as not having shared, and a worker left with fewer than t - 1
 * readable shares leaves the round. An input then goes in only beside at
 * least t - 1 neighbours told its own terms: weighing all others down
 * leaves it in a sum of at least t inputs weighed alike.
 */
typedef struct fb_secagg_terms {
	uint32_t ring_bits;     /* encoding ring Z_2^ring_bits */
	double clip;            /* coordinates clamped to +-clip */
	uint64_t max_samples;   /* weight = samples / max_samples */
	double a_bound;         /* FedNova: bound on ||a_i||_1 */
	uint32_t max_staleness; /* async: a credit's staleness at most */
} fb_secagg_terms;

/* fb_secagg_bind_terms sets p->terms to BLAKE2b-256("fedbox/secagg-terms/
 * v1" || LE32 n || LE32 degree || LE32 threshold || graph_seed || LE32
 * ring_bits || LE64 bits of clip || LE64 max_samples || LE64 bits of
 * a_bound || LE32 max_staleness), from p's n, degree, threshold and
 * graph_seed (set them first) and `t`. */
void fb_secagg_bind_terms(fb_secagg_params *p, const fb_secagg_terms *t);

typedef struct fb_secagg_worker fb_secagg_worker;
typedef struct fb_secagg_server fb_secagg_server;

/*
 * A party's secure-aggregation session: a worker's c key pair (share
 * encryption) and the session signature of its adverts, kept across
 * rounds; and, for a worker or the coordinator, a cache of the peers'
 * session signatures it verified, a worker's with each peer's X25519
 * agreement. A round's instances borrow it (fb_secagg_worker_alloc_keys,
 * fb_secagg_server_alloc_keys); one thread at a time uses it and them.
 * The cache holds at most 131,072 signatures, then starts again.
 */
typedef struct fb_secagg_keys fb_secagg_keys;

/* fb_secagg_keys_alloc makes a session: a fresh c key pair, an empty
 * cache. Errors: FB_ENOMEM, FB_EIO. */
FB_MUST_CHECK fb_err fb_secagg_keys_alloc(fb_secagg_keys **out);

/* fb_secagg_keys_free wipes and frees; NULL is a no-op. Free the
 * instances that borrow it first. */
void fb_secagg_keys_free(fb_secagg_keys *k);

/* fb_secagg_keys_seen returns how many verified session signatures the
 * cache holds (for tests and logs). */
uint32_t fb_secagg_keys_seen(const fb_secagg_keys *k);

/* fb_secagg_advert_sign (re)signs an advert's session part (layout
 * above) with `id`; fb_secagg_worker_advertise does it once a session.
 * Errors: from fb_identity_sign. */
FB_MUST_CHECK fb_err fb_secagg_advert_sign(const fb_identity *id,
    uint8_t adv[FB_SECAGG_ADV_LEN]);

/*
 * fb_secagg_worker_alloc_keys starts worker `self` (< n) of a round in
 * session `keys` (borrowed: it must outlive the instance; NULL: a session
 * of this instance alone): makes the round's s key pair and b (wiped by
 * _free) and the graph. On FB_OK the caller owns *out. One thread at a
 * time per session. Errors: FB_EINVAL (params), FB_ENOMEM, FB_EIO.
 * fb_secagg_worker_alloc is it with keys NULL.
 */
FB_MUST_CHECK fb_err fb_secagg_worker_alloc_keys(const fb_secagg_params *p,
    uint32_t self, fb_secagg_keys *keys, fb_secagg_worker **out);
FB_MUST_CHECK fb_err fb_secagg_worker_alloc(const fb_secagg_params *p,
    uint32_t self, fb_secagg_worker **out);

/* fb_secagg_worker_free wipes and frees; NULL is a no-op. */
void fb_secagg_worker_free(fb_secagg_worker *w);

/* fb_secagg_worker_graph returns the round's graph (owned by w). */
const fb_secagg_graph *fb_secagg_worker_graph(const fb_secagg_worker *w);

/* fb_secagg_worker_advertise writes the advert (layout above; its session
 * signature made once a session, run and identity) and remembers id's
 * public key as this worker's own (no neighbour may sign with it). Call
 * it before fb_secagg_worker_add_advert. Errors: from fb_identity_sign. */
FB_MUST_CHECK fb_err fb_secagg_worker_advertise(
    fb_secagg_worker *w, const fb_identity *id, uint8_t adv[FB_SECAGG_ADV_LEN]);

/*
 * fb_secagg_worker_add_advert takes a peer's advert, checked against the
 * peer's identity key `peer_id` (from the allowlist): layout, session
 * signature (verified once a session: the session's cache), run, round,
 * X25519 keys not of small order (for a neighbour, by deriving the
 * pair's share key and mask seed from them at once, which fails for such
 * a key; the session agreement is cached with the signature). Adverts of non-neighbours (and of itself) are
 * checked and then ignored (FB_OK). A neighbour's
 * advert signed by a key that already signed for another neighbour slot,
 * or by this worker's own key, is refused: one identity, one slot (else
 * one key held by the coordinator could stand in for several neighbours
 * and reach the threshold alone). The key is kept: it checks the
 * neighbour's confirmation later. Only before fb_secagg_worker_make_shares.
 * Errors: FB_EPROTO (malformed, duplicate slot), FB_EAUTH (signature,
 * wrong run, an identity key already used), FB_ESTALE (wrong round or too
 * late).
 */
FB_MUST_CHECK fb_err fb_secagg_worker_add_advert(fb_secagg_worker *w,
    const fb_pubkey *peer_id, const uint8_t *adv, size_t len);

/*
 * fb_secagg_worker_make_shares shares b and s_sk t-of-(m+1) among itself
 * and the m neighbours whose adverts arrived (U1), keeps its own share, and
 * writes m sealed share messages (FB_SECAGG_SHARE_MSG_LEN each, ascending
 * recipient) into out (out_cap bytes); *out_len = m * 136. Once only.
 * Errors: FB_ERANGE (m + 1 < t: abort the round; or out_cap too small),
 * FB_EINVAL (called twice), FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_secagg_worker_make_shares(fb_secagg_worker *w,
    uint8_t *out, size_t out_cap, size_t *out_len);

/* fb_secagg_share_msg_peek reads from/to of a share message without
 * decrypting it (the coordinator routes on it). Errors: FB_EPROTO. */
FB_MUST_CHECK fb_err fb_secagg_share_msg_peek(const uint8_t *msg, size_t len,
    uint32_t *from, uint32_t *to);

/*
 * fb_secagg_worker_add_share opens a share message addressed to this worker
 * from a neighbour in U1 and keeps both shares. After make_shares, before
 * mask_begin. Errors: FB_EPROTO (malformed, not for us, unknown sender,
 * duplicate), FB_EAUTH (MAC, run), FB_ESTALE (round, or too late).
 */
FB_MUST_CHECK fb_err fb_secagg_worker_add_share(fb_secagg_worker *w,
    const uint8_t *msg, size_t len);

/*
 * fb_secagg_worker_mask_begin fixes the mask set: the neighbours whose
 * shares arrived (U2 as this worker sees it; the coordinator must have
 * relayed every U2 neighbour's shares before), with the pairwise seeds
 * derived when their adverts came. Errors: FB_ERANGE (fewer than t - 1
 * neighbours shared: abort), FB_EINVAL (order).
 */
FB_MUST_CHECK fb_err fb_secagg_worker_mask_begin(fb_secagg_worker *w);

/*
 * fb_secagg_worker_mask_chunk masks elements offset..offset+count of the
 * encoded input in place: v += PRG(b) + sum sigma_ij PRG(s_ij) (mod 2^32).
 * Chunks may come in any order, each once. Thread-safe for disjoint chunks
 * after mask_begin. Errors: FB_EINVAL (before mask_begin), FB_ERANGE.
 */
FB_MUST_CHECK fb_err fb_secagg_worker_mask_chunk(const fb_secagg_worker *w,
    uint32_t *v, uint64_t offset, uint64_t count);

/* A mask engine: fb_mask_apply's contract computed elsewhere (a GPU). */
typedef fb_err (*fb_mask_engine)(void *ctx, uint32_t *v, uint64_t offset,
    uint64_t count, const fb_mask_term *terms, uint32_t nterms,
    uint32_t round);

/*
 * fb_secagg_worker_mask_chunk_on is fb_secagg_worker_mask_chunk with the
 * masks made by `engine` (with `ctx`) instead of fb_mask_apply: after
 * mask_chunk's checks (FB_EINVAL before mask_begin, FB_ERANGE), engine gets
 * the worker's terms and round for this one call; it must not keep them.
 * Errors: those checks', then engine's.
 */
FB_MUST_CHECK fb_err fb_secagg_worker_mask_chunk_on(
    const fb_secagg_worker *w, uint32_t *v, uint64_t offset, uint64_t count,
    fb_mask_engine engine, void *ctx);

/*
 * fb_secagg_worker_confirm signs the included set the coordinator sent:
 * included[0..n) (nonzero = that worker's masked input is in the sum, U3).
 * It writes the confirmation (layout above) into out and fixes the set
 * for the round: a later call with the same set writes the same
 * confirmation, one with another set is refused (a worker signs one set
 * per round, which is what makes the check sound). After
 * fb_secagg_worker_mask_begin. Errors: FB_EPROTO (itself not included,
 * fewer than t included, or another set than the one signed), FB_EINVAL
 * (order, n), FB_ENOMEM; from fb_identity_sign.
 */
FB_MUST_CHECK fb_err fb_secagg_worker_confirm(fb_secagg_worker *w,
    const fb_identity *id, const uint8_t *included, uint32_t n,
    uint8_t out[FB_SECAGG_CONFIRM_LEN]);

/*
 * fb_secagg_worker_add_confirm takes a neighbour's confirmation, checked
 * against the identity key its advert was checked with: layout, run,
 * round, n, signature, and that it confirms the very set this worker
 * signed. The signer must be a neighbour whose advert this worker took and
 * which is in that set. After fb_secagg_worker_confirm. Errors: FB_EPROTO
 * (malformed, not a neighbour, not included, twice), FB_EAUTH (signature,
 * run, or another set: the coordinator told the two of them different
 * sets), FB_ESTALE (round), FB_EINVAL (order).
 */
FB_MUST_CHECK fb_err fb_secagg_worker_add_confirm(
    fb_secagg_worker *w, const uint8_t *msg, size_t len);

/* fb_secagg_worker_confirmations counts the valid confirmations of the
 * signed set this worker holds, its own included (0 before it signed). */
uint32_t fb_secagg_worker_confirmations(const fb_secagg_worker *w);

/*
 * fb_secagg_worker_reveal answers the unmasking request for the set this
 * worker signed (fb_secagg_worker_confirm): for every owner j whose shares
 * it holds (itself included), the b-share if j is included, else the
 * s-share. It refuses (nothing written) while it holds fewer than t
 * confirmations of that set (FB_ERANGE), and if it would reveal, for any
 * j, the other kind than an earlier reveal did (FB_EPROTO). Writes the
 * reveal (layout above) into out. Errors: also FB_ERANGE (out_cap),
 * FB_EINVAL (order).
 */
FB_MUST_CHECK fb_err fb_secagg_worker_reveal(
    fb_secagg_worker *w, uint8_t *out, size_t out_cap, size_t *out_len);

/*
 * fb_secagg_server_alloc_keys starts the coordinator's side of a round:
 * the graph and per-worker state, O(n k) memory; `seen` (borrowed, may be
 * NULL) caches the adverts' verified session signatures across rounds
 * (its c key pair is unused). fb_secagg_server_alloc is it with seen
 * NULL. Errors: FB_EINVAL, FB_ENOMEM. One thread at a time.
 */
FB_MUST_CHECK fb_err fb_secagg_server_alloc_keys(const fb_secagg_params *p,
    fb_secagg_keys *seen, fb_secagg_server **out);
FB_MUST_CHECK fb_err fb_secagg_server_alloc(const fb_secagg_params *p,
    fb_secagg_server **out);

/* fb_secagg_server_free wipes and frees; NULL is a no-op. */
void fb_secagg_server_free(fb_secagg_server *s);

/* fb_secagg_server_graph returns the round's graph (owned by s). */
const fb_secagg_graph *fb_secagg_server_graph(const fb_secagg_server *s);

/*
 * fb_secagg_server_add_advert checks worker `index`'s advert against its
 * identity key and records its public keys (U1). Errors as
 * fb_secagg_worker_add_advert; FB_EPROTO also when the advert's index is
 * not `index` or one was already recorded; FB_EAUTH also when `peer_id`
 * already signed another slot's advert (one identity, one slot).
 */
FB_MUST_CHECK fb_err fb_secagg_server_add_advert(fb_secagg_server *s,
    uint32_t index, const fb_pubkey *peer_id, const uint8_t *adv, size_t len);

/*
 * fb_secagg_server_add_shares checks the batch of share messages worker
 * `index` sent (one per U1 neighbour, from = index, ascending `to`) and
 * records it in U2; the caller relays each message to its `to`.
 * Errors: FB_EPROTO (malformed, wrong set of recipients, not in U1,
 * twice), FB_ESTALE (round).
 */
FB_MUST_CHECK fb_err fb_secagg_server_add_shares(fb_secagg_server *s,
    uint32_t index, const uint8_t *msgs, size_t len);

/* fb_secagg_server_set_included records that worker `index`'s whole masked
 * input is in the sum (U3). Errors: FB_EINVAL (not in U2, or twice). */
FB_MUST_CHECK fb_err fb_secagg_server_set_included(fb_secagg_server *s,
    uint32_t index);

/* fb_secagg_server_clear_included empties U3 again (the coordinator's sum
 * started again, before any confirmation). Errors: FB_EINVAL (the
 * confirmations or reveals have begun: U3 is fixed). */
FB_MUST_CHECK fb_err fb_secagg_server_clear_included(
    fb_secagg_server *s);

/* fb_secagg_server_included writes the U3 flags the workers' reveal
 * requests carry (n bytes). */
void fb_secagg_server_included(const fb_secagg_server *s, uint8_t *included);

/*
 * fb_secagg_server_add_confirm checks worker `from`'s confirmation of the
 * included set: `from` in U3, signed by the identity key its advert was
 * checked with, over the server's own U3 (which it fixes: no inclusion
 * after the first confirmation). Records `from` in U4 on FB_OK.
 * Errors: FB_EPROTO (malformed, not included, twice, after the reveals
 * began), FB_EAUTH (signature, run, or another set), FB_ESTALE (round).
 */
FB_MUST_CHECK fb_err fb_secagg_server_add_confirm(
    fb_secagg_server *s, uint32_t from, const uint8_t *msg, size_t len);

/*
 * fb_secagg_server_add_reveal checks and keeps worker `from`'s reveal:
 * `from` included and confirmed (U4), one entry per owner it holds shares
 * of (owners in U2, neighbours or itself), kind b exactly for included
 * owners, x = from + 1. Errors: FB_EPROTO (any mismatch, or twice),
 * FB_ESTALE (round), FB_EAUTH (run).
 */
FB_MUST_CHECK fb_err fb_secagg_server_add_reveal(fb_secagg_server *s,
    uint32_t from, const uint8_t *msg, size_t len);

/*
 * fb_secagg_server_finish reconstructs b_i for each included i and s_sk_j
 * for each dropped j in U2 with an included neighbour, checks them against
 * the adverts, and prepares the correction terms (seeds only; the masks
 * are expanded by fb_secagg_server_unmask_chunk). Errors: FB_ERANGE (fewer
 * than t included, or fewer than t shares for someone: below threshold,
 * abort the round), FB_EAUTH (a secret failed its check: corrupt shares),
 * FB_EINVAL (order), FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_secagg_server_finish(fb_secagg_server *s);

/* fb_secagg_server_correction_terms returns how many mask expansions one
 * unmask pass costs (survivors + residual pairwise masks). */
uint64_t fb_secagg_server_correction_terms(const fb_secagg_server *s);

/*
 * fb_secagg_server_unmask_chunk removes the masks from elements offset..
 * offset+count of the accumulated sum of masked inputs, in place (mod
 * 2^32); afterwards sum = sum of the included encoded inputs. Each chunk
 * once. Thread-safe for disjoint chunks after finish. Errors: FB_EINVAL
 * (before finish), FB_ERANGE.
 */
FB_MUST_CHECK fb_err fb_secagg_server_unmask_chunk(const fb_secagg_server *s,
    uint32_t *sum, uint64_t offset, uint64_t count);

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * crypto_impl.h -- private to crypto/ (and its white-box tests and fuzz
 * targets): struct layouts, domain strings and helpers shared by keys.c,
 * session.c and stream.c. Includes sodium.h; never include it from a public
 * header.
 */
#ifndef FB_CRYPTO_CRYPTO_IMPL_H
#define FB_CRYPTO_CRYPTO_IMPL_H

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include <sodium.h>

#include "crypto/crypto.h"

/* Domain-separation prefixes, exactly FB_DOMAIN_LEN bytes each. */
#define FB_DOMAIN_LEN 16
extern const uint8_t fb_dom_hello[FB_DOMAIN_LEN];
extern const uint8_t fb_dom_reply[FB_DOMAIN_LEN];
extern const uint8_t fb_dom_trans[FB_DOMAIN_LEN];
extern const uint8_t fb_dom_c2s[FB_DOMAIN_LEN];
extern const uint8_t fb_dom_s2c[FB_DOMAIN_LEN];
extern const uint8_t fb_dom_stream[FB_DOMAIN_LEN];
extern const uint8_t fb_dom_trailer[FB_DOMAIN_LEN];

/* Kind bytes (offset 1) of the fixed layouts. */
enum {
	FB_KIND_HELLO = 1,
	FB_KIND_REPLY = 2,
	FB_KIND_STREAM_HEADER = 3,
	FB_KIND_TRAILER = 4,
};

struct fb_identity {
	uint8_t *sk; /* sodium_malloc'd seed||pk, PROT_NONE when idle */
	fb_pubkey pk;
	pthread_mutex_t lock; /* serialises the protection flips of sk */
	char comment[FB_COMMENT_MAX];
};

/* Whole struct in sodium_malloc memory: it holds the session keys. */
struct fb_session {
	uint8_t tx[32]; /* key for messages this side seals */
	uint8_t rx[32]; /* key for messages this side opens */
	uint8_t th[32]; /* transcript hash (public) */
	fb_run_id run;
	fb_pubkey peer;     /* the peer's identity */
	uint32_t self_id;   /* sender id this side writes */
	uint32_t peer_id;   /* sender id the peer must write */
	uint32_t worker_id; /* the worker's id (one of the two above) */
	uint64_t send_seq;  /* last sequence number sealed; 0 = none */
	uint64_t recv_seq;  /* last sequence number accepted; 0 = none */
};

/* fb_crypto_ready is fb_crypto_init for internal callers. */
fb_err fb_crypto_ready(void);

/* fb_identity_sign_raw signs `len` bytes as they are (no prefix). */
void fb_identity_sign_raw(const fb_identity *id, const uint8_t *msg, size_t len,
    uint8_t sig[FB_SIG_LEN]);

/* fb_session_alloc_keys makes a session from explicit keys (handshake,
 * tests, fuzz targets). Errors: FB_ENOMEM. */
fb_err fb_session_alloc_keys(const uint8_t tx[32], const uint8_t rx[32],
    const uint8_t th[32], const fb_run_id *run, const fb_pubkey *peer,
    uint32_t self_id, uint32_t peer_id, fb_session **out);

/* fb_stream_push_alloc_key is fb_stream_push_alloc with a caller key (tests
 * and fuzz targets only). */
fb_err fb_stream_push_alloc_key(const fb_stream_ctx *ctx, size_t chunk_len,
    fb_stream_digest digest, const uint8_t key[FB_STREAM_KEY_LEN],
    uint8_t header[FB_STREAM_HEADER_LEN], fb_stream_push **out);

/*
 * Memory for short-lived secrets (secmem.c): like sodium_malloc and
 * sodium_free (locked, out of core dumps, wiped when freed; contents
 * unspecified when allocated; 64-byte aligned), from arenas for blocks up
 * to FB_SECMEM_MAX bytes, without sodium_malloc's system calls each time.
 * NULL when out of memory. Thread-safe.
 */
#define FB_SECMEM_MAX 65472
void *fb_secmem_alloc(size_t len);
void fb_secmem_free(void *p);

/* fb_x25519_small_order says whether an X25519 public key is of small
 * order (X25519 with it is zero for every secret key): a table lookup,
 * the keys crypto_scalarmult refuses (mask.c). */
int fb_x25519_small_order(const uint8_t pk[32]);

/*
 * The bulk passes (bulk.c): libsodium's results byte for byte, on
 * libcrypto's faster code for messages of FB_CHACHA_MIN bytes and more.
 * fb_xchacha_seal and fb_xchacha_open are
 * crypto_aead_xchacha20poly1305_ietf_{encrypt,decrypt}_detached (m == c is
 * allowed; a failed open wipes m and returns -1); fb_chacha20_xor_ic is
 * crypto_stream_chacha20_ietf_xor_ic; fb_sha256_2 is the SHA-256 of a || b
 * (fb_crypto_ciphers, crypto.h, names the library they run on).
 */
#define FB_CHACHA_MIN 4096
void fb_xchacha_seal(uint8_t *c, uint8_t mac[16], const uint8_t *m,
    size_t m_len, const uint8_t *ad, size_t ad_len, const uint8_t npub[24],
    const uint8_t k[32]);
int fb_xchacha_open(uint8_t *m, const uint8_t *c, size_t c_len,
    const uint8_t mac[16], const uint8_t *ad, size_t ad_len,
    const uint8_t npub[24], const uint8_t k[32]);
void fb_chacha20_xor_ic(uint8_t *c, const uint8_t *m, size_t len,
    const uint8_t n[12], uint32_t ic, const uint8_t k[32]);
void fb_sha256_2(uint8_t out[32], const uint8_t *a, size_t a_len,
    const uint8_t *b, size_t b_len);

/* Poly1305 in steps, crypto_onetimeauth_poly1305_{init,update,final}'s
 * tag: on libcrypto when the message will be FB_CHACHA_MIN bytes or more
 * (`len`, a hint). final ends it and wipes the key. */
typedef struct fb_poly {
	struct evp_mac_ctx_st *ctx; /* NULL: st, libsodium's */
	crypto_onetimeauth_poly1305_state st;
} fb_poly;
void fb_poly_init(fb_poly *p, const uint8_t key[32], size_t len);
void fb_poly_update(fb_poly *p, const uint8_t *m, size_t len);
void fb_poly_final(fb_poly *p, uint8_t mac[16]);

static inline void
le16_store(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static inline uint16_t
le16_load(const uint8_t *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}

static inline void
le32_store(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++) {
		p[i] = (uint8_t)(v >> (8 * i));
	}
}

static inline uint32_t
le32_load(const uint8_t *p)
{
	return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
	       ((uint32_t)p[3] << 24);
}

static inline void
fb_set_why(fb_reject *why, fb_reject v)
{
	if (why != NULL) {
		*why = v;
	}
}

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bulk.c -- the passes over every byte of a secure round: ChaCha20 and
 * XChaCha20-Poly1305 (model and update chunks, secure-aggregation masks)
 * and SHA-256 (a FULL stream's chunk hashes) on OpenSSL's libcrypto, whose
 * ChaCha20 uses AVX-512 or AVX2 and whose SHA-256 uses the SHA extensions
 * where the CPU has them: 3x libsodium 1.0.18's ChaCha20, and SHA-256 at
 * 2.8x its BLAKE2b, on the AVX-512 cores this was measured on
 * (bench/crypto_raw).
 *
 * The output is libsodium's, byte for byte, so either end may use either
 * library:
 *   - XChaCha20-Poly1305-IETF (crypto_aead_xchacha20poly1305_ietf_*):
 *     the subkey HChaCha20(key, nonce[0..16]) (libsodium's own
 *     crypto_core_hchacha20), then RFC 8439's ChaCha20-Poly1305 under it
 *     with the nonce 0^4 || nonce[16..24]: libcrypto's
 *     "ChaCha20-Poly1305";
 *   - ChaCha20-IETF from block `ic` (crypto_stream_chacha20_ietf_xor_ic):
 *     libcrypto's "ChaCha20", whose 16-byte IV is LE32(ic) || nonce;
 *   - SHA-256 (crypto_hash_sha256): libcrypto's "SHA2-256";
 *   - Poly1305 (crypto_onetimeauth_poly1305_*, a chunk's MAC checked
 *     before its ChaCha20 pass is split over threads): libcrypto's
 *     "POLY1305", 3.5x libsodium's here.
 * unit/crypto_test checks them against libsodium.
 *
 * Messages under FB_CHACHA_MIN bytes, a keystream that would run its
 * 32-bit block counter over, and any call libcrypto fails (no cipher, no
 * memory) go to libsodium: libcrypto's per-call setup is not worth it for
 * a few blocks. FEDBOX_CIPHER=libsodium in the environment sends every call
 * there, for comparisons in one build (bench/crypto_raw, bench/transfer).
 *
 * One difference is kept out of sight: libsodium checks the tag before it
 * decrypts, libcrypto decrypts as it goes and checks at the end. A message
 * whose tag fails has its plaintext buffer wiped before the error returns,
 * so nothing unauthenticated is left to read either way.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "common/log.h"
#include "crypto/crypto_impl.h"

/* libcrypto takes int lengths: longer messages go in pieces of this. */
#define PIECE (1u << 30)

static pthread_once_t once = PTHREAD_ONCE_INIT;
static EVP_CIPHER *aead;   /* NULL: libsodium only */
static EVP_CIPHER *stream; /* NULL: libsodium only */
static EVP_MD *sha256;     /* NULL: libsodium only */
static EVP_MAC *poly;      /* NULL: libsodium only */

static void
fetch(void)
{
	const char *e = getenv("FEDBOX_CIPHER");

	if (e != NULL && strcmp(e, "libsodium") == 0) {
		return;
	}
	aead = EVP_CIPHER_fetch(NULL, "ChaCha20-Poly1305", NULL);
	stream = EVP_CIPHER_fetch(NULL, "ChaCha20", NULL);
	sha256 = EVP_MD_fetch(NULL, "SHA2-256", NULL);
	poly = EVP_MAC_fetch(NULL, "POLY1305", NULL);
}

const char *
fb_crypto_ciphers(void)
{
	int n;

	pthread_once(&once, fetch);
	n = (aead != NULL) + (stream != NULL) + (sha256 != NULL) +
	    (poly != NULL);
	/* (some but not all: a libcrypto configured without some, e.g. a
	 * FIPS provider, which has no ChaCha20) */
	return n == 4   ? "libcrypto"
	       : n == 0 ? "libsodium"
	                : "libcrypto and libsodium";
}

/* Whether a message of `len` bytes is worth libcrypto's setup; its
 * algorithms are fetched then (those missing stay NULL: libsodium's). */
static bool
worth_it(size_t len)
{
	if (len < FB_CHACHA_MIN) {
		return false;
	}
	pthread_once(&once, fetch);
	return true;
}

/* The cipher for a message of `len` bytes (the AEAD, or the bare stream);
 * NULL: libsodium's. */
static const EVP_CIPHER *
cipher_for(bool want_aead, size_t len)
{
	return !worth_it(len) ? NULL : want_aead ? aead : stream;
}

/* libcrypto failed inside a message it had begun: with the other
 * library's answer no longer possible (in place, part of it is already
 * changed), stop, as libsodium does on misuse. It takes a broken
 * libcrypto: these calls fail only on bad arguments, checked above. */
static void
midway(const char *what)
{
	fb_log_error("libcrypto failed in the middle of %s; stopping", what);
	abort();
}

/* The XChaCha20 subkey and the IETF nonce that go with `npub`. */
static void
x_subkey(uint8_t sub[32], uint8_t n12[12], const uint8_t npub[24],
    const uint8_t k[32])
{
	crypto_core_hchacha20(sub, npub, k, NULL);
	memset(n12, 0, 4);
	memcpy(n12 + 4, npub + 16, 8);
}

/* Feeds `len` bytes through ctx in pieces; false on an error. */
static bool
update(EVP_CIPHER_CTX *ctx, uint8_t *out, const uint8_t *in, size_t len)
{
	while (len > 0) {
		int n = (int)(len > PIECE ? PIECE : len), outl = 0;
		if (EVP_CipherUpdate(ctx, out, &outl, in, n) != 1 ||
		    outl != n) {
			return false;
		}
		if (out != NULL) {
			out += n;
		}
		in += n;
		len -= (size_t)n;
	}
	return true;
}

/* The AEAD's setup and AD, for sealing (enc 1) or opening (enc 0). */
static EVP_CIPHER_CTX *
aead_start(const EVP_CIPHER *ci, int enc, const uint8_t *ad, size_t ad_len,
    const uint8_t npub[24], const uint8_t k[32])
{
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	uint8_t sub[32], n12[12];
	bool ok;

	if (ctx == NULL) {
		return NULL;
	}
	x_subkey(sub, n12, npub, k);
	ok = EVP_CipherInit_ex2(ctx, ci, sub, n12, enc, NULL) == 1 &&
	     (ad_len == 0 || update(ctx, NULL, ad, ad_len));
	sodium_memzero(sub, sizeof(sub));
	if (!ok) {
		EVP_CIPHER_CTX_free(ctx);
		return NULL;
	}
	return ctx;
}

void
fb_xchacha_seal(uint8_t *c, uint8_t mac[16], const uint8_t *m, size_t m_len,
    const uint8_t *ad, size_t ad_len, const uint8_t npub[24],
    const uint8_t k[32])
{
	const EVP_CIPHER *ci = cipher_for(true, m_len);
	EVP_CIPHER_CTX *ctx;
	int outl = 0;

	if (ci == NULL ||
	    (ctx = aead_start(ci, 1, ad, ad_len, npub, k)) == NULL) {
		crypto_aead_xchacha20poly1305_ietf_encrypt_detached(
		    c, mac, NULL, m, m_len, ad, ad_len, NULL, npub, k);
		return;
	}
	if (!update(ctx, c, m, m_len) ||
	    EVP_EncryptFinal_ex(ctx, c, &outl) != 1 ||
	    EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, 16, mac) != 1) {
		midway("a seal");
	}
	EVP_CIPHER_CTX_free(ctx);
}

int
fb_xchacha_open(uint8_t *m, const uint8_t *c, size_t c_len,
    const uint8_t mac[16], const uint8_t *ad, size_t ad_len,
    const uint8_t npub[24], const uint8_t k[32])
{
	const EVP_CIPHER *ci = cipher_for(true, c_len);
	EVP_CIPHER_CTX *ctx;
	uint8_t tag[16];
	int outl = 0, ok;

	if (ci == NULL ||
	    (ctx = aead_start(ci, 0, ad, ad_len, npub, k)) == NULL) {
		return crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
		    m, NULL, c, c_len, mac, ad, ad_len, npub, k);
	}
	memcpy(tag, mac, sizeof(tag));
	if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, 16, tag) != 1 ||
	    !update(ctx, m, c, c_len)) {
		midway("an open");
	}
	/* the tag's check: the only failure expected here */
	ok = EVP_DecryptFinal_ex(ctx, m, &outl) == 1;
	EVP_CIPHER_CTX_free(ctx);
	if (!ok) {
		sodium_memzero(m, c_len); /* unauthenticated: not for reading */
		return -1;
	}
	return 0;
}

void
fb_chacha20_xor_ic(uint8_t *c, const uint8_t *m, size_t len,
    const uint8_t n[12], uint32_t ic, const uint8_t k[32])
{
	const EVP_CIPHER *ci = cipher_for(false, len);
	EVP_CIPHER_CTX *ctx = NULL;
	uint8_t iv[16];
	uint64_t blocks = ((uint64_t)len + 63) / 64;

	le32_store(iv, ic);
	memcpy(iv + 4, n, 12);
	/* libsodium and libcrypto may part ways once the block counter
	 * wraps: never let it */
	if (ci == NULL || blocks > (1ull << 32) - ic ||
	    (ctx = EVP_CIPHER_CTX_new()) == NULL ||
	    EVP_CipherInit_ex2(ctx, ci, k, iv, 1, NULL) != 1) {
		EVP_CIPHER_CTX_free(ctx); /* (NULL is fine) */
		(void)crypto_stream_chacha20_ietf_xor_ic(c, m, len, n, ic, k);
		return;
	}
	if (!update(ctx, c, m, len)) {
		midway("a keystream");
	}
	EVP_CIPHER_CTX_free(ctx);
}

void
fb_sha256_2(uint8_t out[32], const uint8_t *a, size_t a_len, const uint8_t *b,
    size_t b_len)
{
	EVP_MD_CTX *ctx = NULL;
	crypto_hash_sha256_state st;
	unsigned int n = 0;

	if (worth_it(a_len + b_len) && sha256 != NULL &&
	    (ctx = EVP_MD_CTX_new()) != NULL &&
	    EVP_DigestInit_ex2(ctx, sha256, NULL) == 1 &&
	    EVP_DigestUpdate(ctx, a, a_len) == 1 &&
	    EVP_DigestUpdate(ctx, b, b_len) == 1 &&
	    EVP_DigestFinal_ex(ctx, out, &n) == 1 && n == 32) {
		EVP_MD_CTX_free(ctx);
		return;
	}
	/* (a digest has no output to spoil until its end: starting over
	 * is fine) */
	EVP_MD_CTX_free(ctx);
	crypto_hash_sha256_init(&st);
	crypto_hash_sha256_update(&st, a, a_len);
	crypto_hash_sha256_update(&st, b, b_len);
	crypto_hash_sha256_final(&st, out);
}

void
fb_poly_init(fb_poly *p, const uint8_t key[32], size_t len)
{
	p->ctx = NULL;
	if (worth_it(len) && poly != NULL &&
	    (p->ctx = EVP_MAC_CTX_new(poly)) != NULL &&
	    EVP_MAC_init(p->ctx, key, 32, NULL) != 1) {
		EVP_MAC_CTX_free(p->ctx);
		p->ctx = NULL;
	}
	if (p->ctx == NULL) {
		crypto_onetimeauth_poly1305_init(&p->st, key);
	}
}

void
fb_poly_update(fb_poly *p, const uint8_t *m, size_t len)
{
	if (p->ctx == NULL) {
		crypto_onetimeauth_poly1305_update(&p->st, m, len);
	} else if (len > 0 && EVP_MAC_update(p->ctx, m, len) != 1) {
		midway("a MAC");
	}
}

void
fb_poly_final(fb_poly *p, uint8_t mac[16])
{
	size_t n = 0;

	if (p->ctx == NULL) {
		crypto_onetimeauth_poly1305_final(&p->st, mac);
		sodium_memzero(&p->st, sizeof(p->st));
		return;
	}
	if (EVP_MAC_final(p->ctx, mac, &n, 16) != 1 || n != 16) {
		midway("a MAC");
	}
	EVP_MAC_CTX_free(p->ctx); /* (libcrypto wipes its key) */
	p->ctx = NULL;
}

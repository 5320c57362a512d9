/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stream.c -- encrypted, signed payload streams (model updates, the global
 * model broadcast).
 *
 * TAGS streams (worker updates): crypto_secretstream_xchacha20poly1305 over
 * caller-sized chunks: each chunk's MAC chains on the previous ones, so
 * tampering, reordering and duplication fail at the chunk and truncation
 * fails for want of a FINAL tag. The digest hashes only each chunk's
 * length and Poly1305 tag: as strong against anyone without the stream
 * key, and nearly as fast as raw secretstream, but a key holder could forge
 * chunks with the same tags, so it is only for streams whose key is private
 * to the two ends (see crypto.h).
 *
 * FULL and INDEXED_TAGS streams (the broadcast, whose round key every
 * selected worker holds; worker updates): each chunk is sealed on its own, XChaCha20-Poly1305-IETF with the
 * nonce (header nonce || chunk index) and the chunk index and FINAL flag in
 * its associated data, so reordering, duplication and a moved FINAL fail at
 * the chunk, and the chunks of one stream can be sealed on many threads at
 * once. The digest is BLAKE2b over the header and each chunk's own
 * SHA-256 of its length-prefixed ciphertext; the sender signs it in the
 * trailer, so a worker holding the round key cannot forge a chunk that
 * another worker would accept as the coordinator's. INDEXED_TAGS hashes,
 * in index order, LE64(length) || LE64(index) || the chunk's Poly1305 tag
 * in place of that SHA-256 pass (TAGS' trade, for a key private to the two
 * ends), so its chunks seal and open on many threads at the cipher's
 * speed; its ChaCha20 pass may be split over threads on the pull side too,
 * after the MAC of the whole chunk (fb_stream_pull_open).
 * Work per chunk either way: one ChaCha20 + Poly1305 pass (+ one SHA-256
 * pass over the ciphertext in FULL mode; both on libcrypto, bulk.c); in
 * place, no copies. A TAGS chunk's ChaCha20 pass may be split over
 * threads on the pull side (fb_stream_pull_open, _decrypt, _close); its
 * chain of chunks stays in order.
 */
#include <stdatomic.h>
#include <string.h>

#include "common/util.h"
#include "crypto/crypto_impl.h"

#define SS_HEADER_LEN crypto_secretstream_xchacha20poly1305_HEADERBYTES
#define AD_LEN (FB_RUN_ID_LEN + 8)
/* FULL chunks: AD = run id || round || sender || LE64(index) || flag. */
#define IX_AD_LEN (AD_LEN + 9)
#define IX_NONCE_LEN 16 /* the header's nonce; the index fills the rest */
#define IX_FLAG_MESSAGE 0
#define IX_FLAG_FINAL 1
/* Trailer offsets. */
#define T_RUN 4
#define T_ROUND 20
#define T_SENDER 24
#define T_LEN 28
#define T_COUNT 36
#define T_DIGEST 44
#define T_SIG 76

_Static_assert(SS_HEADER_LEN == 24, "secretstream header size");
_Static_assert(
    FB_STREAM_CHUNK_OVERHEAD == crypto_secretstream_xchacha20poly1305_ABYTES,
    "chunk overhead");
_Static_assert(FB_STREAM_CHUNK_OVERHEAD ==
        1 + crypto_aead_xchacha20poly1305_ietf_ABYTES,
    "a FULL chunk is its flag, its ciphertext and its tag");
_Static_assert(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES ==
        IX_NONCE_LEN + 8,
    "nonce = header nonce || LE64(index)");

/* Both ends' state; fb_secmem_alloc'd (it holds the stream key). The
 * BLAKE2b state first: it needs 64-byte alignment, which fb_secmem_alloc
 * gives. */
typedef struct stream_core {
	crypto_generichash_state hash;
	crypto_secretstream_xchacha20poly1305_state ss;
	fb_stream_ctx ctx;
	uint8_t ad[AD_LEN]; /* run id || round || sender */
	uint8_t digest[32]; /* valid once `finished` */
	int mode;           /* fb_stream_digest, as in the header */
	int chain;          /* FB_STREAM_DIGEST_TAGS: a secretstream */
	/* FULL, INDEXED_TAGS: the key and the header's nonce, chunks sealed
	 * one by one */
	uint8_t key[FB_STREAM_KEY_LEN];
	uint8_t nonce[IX_NONCE_LEN];
	size_t chunk_len;   /* max plaintext bytes per chunk */
	uint64_t payload_len;
	uint64_t chunk_count;
	int finished; /* FINAL chunk seen */
	/* TAGS, INDEXED_TAGS pull: a chunk open (fb_stream_pull_open), its
	 * length */
	int part_open;
	size_t part_len;
	/* the open chunk's ChaCha20 key, nonce and the block counter of its
	 * first message byte, for its parts (a TAGS chain has moved on
	 * already) */
	uint8_t part_k[crypto_stream_chacha20_ietf_KEYBYTES];
	uint8_t part_nonce[crypto_stream_chacha20_ietf_NONCEBYTES];
	uint32_t part_ic;
	fb_err dead;  /* pull: first error, repeated afterwards */
	fb_reject dead_why;
} stream_core;

struct fb_stream_push {
	stream_core c;
};
struct fb_stream_pull {
	stream_core c;
};

/* core_start fills ctx, AD and the header blob and starts the digest. */
static void
core_start(stream_core *c, const fb_stream_ctx *ctx, size_t chunk_len,
    const uint8_t header[FB_STREAM_HEADER_LEN])
{
	c->ctx = *ctx;
	c->mode = header[2];
	c->chain = header[2] == FB_STREAM_DIGEST_TAGS;
	c->chunk_len = chunk_len;
	memcpy(c->ad, ctx->run.b, FB_RUN_ID_LEN);
	le32_store(c->ad + FB_RUN_ID_LEN, ctx->round);
	le32_store(c->ad + FB_RUN_ID_LEN + 4, ctx->sender);
	crypto_generichash_init(&c->hash, NULL, 0, 32);
	crypto_generichash_update(&c->hash, fb_dom_stream, FB_DOMAIN_LEN);
	crypto_generichash_update(&c->hash, header, FB_STREAM_HEADER_LEN);
}

/* ix_chunk_hash is a FULL chunk's own digest: SHA-256 of LE64(len) ||
 * ciphertext (flag and tag included). SHA-256, not the BLAKE2b of the
 * rest: every byte of the model goes through it on every worker, and
 * with the CPU's SHA extensions (bulk.c) it runs at 2.8x libsodium's
 * BLAKE2b. */
static void
ix_chunk_hash(const uint8_t *ct, size_t len, uint8_t out[FB_STREAM_HASH_LEN])
{
	uint8_t l[8];

	_Static_assert(FB_STREAM_HASH_LEN == 32, "a SHA-256");
	fb_store_le64(l, (uint64_t)len);
	fb_sha256_2(out, l, sizeof(l), ct, len);
}

/* ix_chunk_entry is what chunk `index` of a FULL or INDEXED_TAGS stream
 * puts into the digest: FULL, its own SHA-256 (ix_chunk_hash);
 * INDEXED_TAGS, LE64(len) || LE64(index) || its Poly1305 tag (the last 16
 * bytes; len >= 17 here). */
static void
ix_chunk_entry(const stream_core *c, uint64_t index, const uint8_t *ct,
    size_t len, uint8_t out[FB_STREAM_HASH_LEN])
{
	_Static_assert(FB_STREAM_HASH_LEN == 8 + 8 + FB_MSG_MAC_LEN,
	    "an INDEXED_TAGS entry fills a chunk hash");
	if (c->mode == FB_STREAM_DIGEST_FULL) {
		ix_chunk_hash(ct, len, out);
		return;
	}
	fb_store_le64(out, (uint64_t)len);
	fb_store_le64(out + 8, index);
	memcpy(out + 16, ct + len - FB_MSG_MAC_LEN, FB_MSG_MAC_LEN);
}

/* The digest takes the next chunk (in order, one thread). */
static void
core_hash_chunk(stream_core *c, const uint8_t *ct, size_t len)
{
	uint8_t l[8];

	if (!c->chain) {
		uint8_t h[FB_STREAM_HASH_LEN];
		ix_chunk_entry(c, c->chunk_count, ct, len, h);
		crypto_generichash_update(&c->hash, h, sizeof(h));
		return;
	}
	fb_store_le64(l, (uint64_t)len);
	crypto_generichash_update(&c->hash, l, sizeof(l));
	/* The Poly1305 tag closes every chunk (len >= 17 here). */
	crypto_generichash_update(
	    &c->hash, ct + len - FB_MSG_MAC_LEN, FB_MSG_MAC_LEN);
}

/* FULL chunks' own hashes, in index order, into the stream's digest. */
static void
core_take_hashes(stream_core *c, const uint8_t *hashes, uint64_t count,
    uint64_t payload_len, int final)
{
	crypto_generichash_update(&c->hash, hashes,
	    (size_t)count * FB_STREAM_HASH_LEN);
	c->payload_len += payload_len;
	c->chunk_count += count;
	if (final) {
		c->finished = 1;
		crypto_generichash_final(&c->hash, c->digest, 32);
	}
}

/* ix_nonce_ad fills chunk `index`'s nonce and associated data. */
static void
ix_nonce_ad(const stream_core *c, uint64_t index, uint8_t flag,
    uint8_t nonce[IX_NONCE_LEN + 8], uint8_t ad[IX_AD_LEN])
{
	memcpy(nonce, c->nonce, IX_NONCE_LEN);
	fb_store_le64(nonce + IX_NONCE_LEN, index);
	memcpy(ad, c->ad, AD_LEN);
	fb_store_le64(ad + AD_LEN, index);
	ad[AD_LEN + 8] = flag;
}

static void
trailer_body(const stream_core *c, uint8_t t[FB_STREAM_TRAILER_LEN])
{
	t[0] = FB_CRYPTO_WIRE_VERSION;
	t[1] = FB_KIND_TRAILER;
	le16_store(t + 2, 0);
	memcpy(t + T_RUN, c->ctx.run.b, FB_RUN_ID_LEN);
	le32_store(t + T_ROUND, c->ctx.round);
	le32_store(t + T_SENDER, c->ctx.sender);
	fb_store_le64(t + T_LEN, c->payload_len);
	fb_store_le64(t + T_COUNT, c->chunk_count);
	memcpy(t + T_DIGEST, c->digest, 32);
}

/* ---- push ---------------------------------------------------------------- */

fb_err
fb_stream_push_alloc_key(const fb_stream_ctx *ctx, size_t chunk_len,
    fb_stream_digest digest, const uint8_t key[FB_STREAM_KEY_LEN],
    uint8_t header[FB_STREAM_HEADER_LEN], fb_stream_push **out)
{
	fb_err rc = FB_OK;
	fb_stream_push *p = NULL;

	*out = NULL;
	memset(header, 0, FB_STREAM_HEADER_LEN);
	if (chunk_len == 0 || chunk_len > FB_STREAM_CHUNK_MAX ||
	    (digest != FB_STREAM_DIGEST_FULL &&
	        digest != FB_STREAM_DIGEST_TAGS &&
	        digest != FB_STREAM_DIGEST_INDEXED_TAGS)) {
		rc = FB_EINVAL;
		goto out;
	}
	if ((rc = fb_crypto_ready()) != FB_OK) {
		goto out;
	}
	if ((p = fb_secmem_alloc(sizeof(*p))) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	memset(p, 0, sizeof(*p));
	header[0] = FB_CRYPTO_WIRE_VERSION;
	header[1] = FB_KIND_STREAM_HEADER;
	header[2] = (uint8_t)digest;
	le32_store(header + 4, (uint32_t)chunk_len);
	if (digest == FB_STREAM_DIGEST_TAGS) {
		crypto_secretstream_xchacha20poly1305_init_push(
		    &p->c.ss, header + 8, key);
	} else {
		randombytes_buf(header + 8, IX_NONCE_LEN);
		memcpy(p->c.key, key, FB_STREAM_KEY_LEN);
		memcpy(p->c.nonce, header + 8, IX_NONCE_LEN);
	}
	core_start(&p->c, ctx, chunk_len, header);
	*out = p;
	p = NULL;
out:
	fb_secmem_free(p);
	return rc;
}

fb_err
fb_stream_push_alloc(const fb_stream_ctx *ctx, size_t chunk_len,
    fb_stream_digest digest, uint8_t key[FB_STREAM_KEY_LEN],
    uint8_t header[FB_STREAM_HEADER_LEN], fb_stream_push **out)
{
	fb_err rc;

	*out = NULL;
	memset(key, 0, FB_STREAM_KEY_LEN);
	memset(header, 0, FB_STREAM_HEADER_LEN);
	if ((rc = fb_crypto_ready()) != FB_OK) {
		return rc;
	}
	crypto_secretstream_xchacha20poly1305_keygen(key);
	rc = fb_stream_push_alloc_key(ctx, chunk_len, digest, key, header, out);
	if (rc != FB_OK) {
		sodium_memzero(key, FB_STREAM_KEY_LEN);
	}
	return rc;
}

fb_err
fb_stream_push_chunk(fb_stream_push *p, const uint8_t *m, size_t m_len,
    int final, uint8_t *c, size_t c_cap, size_t *c_len)
{
	unsigned long long clen = 0;
	uint8_t tag = final ? crypto_secretstream_xchacha20poly1305_TAG_FINAL
	                    : crypto_secretstream_xchacha20poly1305_TAG_MESSAGE;

	*c_len = 0;
	if (p->c.finished) {
		return FB_EINVAL;
	}
	if (m_len > p->c.chunk_len ||
	    c_cap < m_len + FB_STREAM_CHUNK_OVERHEAD) {
		return FB_ERANGE;
	}
	if (!p->c.chain) {
		uint8_t h[FB_STREAM_HASH_LEN];
		fb_err rc = fb_stream_push_chunk_at(p, p->c.chunk_count, m, m_len,
		    final, c, c_cap, c_len, h);
		if (rc != FB_OK) {
			return rc;
		}
		return fb_stream_push_hashes(p, h, 1, m_len, final);
	}
	crypto_secretstream_xchacha20poly1305_push(
	    &p->c.ss, c, &clen, m, m_len, p->c.ad, AD_LEN, tag);
	core_hash_chunk(&p->c, c, (size_t)clen);
	p->c.payload_len += m_len;
	p->c.chunk_count++;
	if (final) {
		p->c.finished = 1;
		crypto_generichash_final(&p->c.hash, p->c.digest, 32);
	}
	*c_len = (size_t)clen;
	return FB_OK;
}

fb_err
fb_stream_push_chunk_at(const fb_stream_push *p, uint64_t index,
    const uint8_t *m, size_t m_len, int final, uint8_t *c, size_t c_cap,
    size_t *c_len, uint8_t hash[FB_STREAM_HASH_LEN])
{
	uint8_t nonce[IX_NONCE_LEN + 8], ad[IX_AD_LEN];
	uint8_t flag = final ? IX_FLAG_FINAL : IX_FLAG_MESSAGE;

	*c_len = 0;
	if (hash != NULL) {
		memset(hash, 0, FB_STREAM_HASH_LEN);
	}
	if (p->c.chain) {
		return FB_EINVAL;
	}
	if (m_len > p->c.chunk_len ||
	    c_cap < m_len + FB_STREAM_CHUNK_OVERHEAD) {
		return FB_ERANGE;
	}
	ix_nonce_ad(&p->c, index, flag, nonce, ad);
	/* (in place when m == c + 1) */
	fb_xchacha_seal(c + 1, c + 1 + m_len, m, m_len, ad, sizeof(ad), nonce,
	    p->c.key);
	c[0] = flag;
	*c_len = m_len + FB_STREAM_CHUNK_OVERHEAD;
	if (hash != NULL) {
		ix_chunk_entry(&p->c, index, c, *c_len, hash);
	}
	return FB_OK;
}

fb_err
fb_stream_push_hashes(fb_stream_push *p, const uint8_t *hashes,
    uint64_t count, uint64_t payload_len, int final)
{
	if (p->c.chain || p->c.finished) {
		return FB_EINVAL;
	}
	core_take_hashes(&p->c, hashes, count, payload_len, final);
	return FB_OK;
}

/*
 * The steps of crypto_secretstream_xchacha20poly1305 (as libsodium
 * documents its algorithm), for a chunk opened in parts. The state's
 * nonce is LE32(counter) || an 8-byte inner nonce under the state's key k.
 * ChaCha20-IETF(k, nonce) block 0 keys Poly1305, block 1 encrypts the tag
 * byte (as a 64-byte block, whose first byte is sent), blocks 2 on the
 * message. MAC = Poly1305(ad, zero pad to 16, the tag block, the
 * ciphertext, (16 - 64 + len) & 15 zero bytes (secretstream's own padding
 * rule), LE64(ad length), LE64(64 + len)). Then the inner nonce takes
 * MAC[0..8] by XOR, the counter goes up, and a FINAL tag (or a counter
 * wrap) rekeys. crypto_test checks it against libsodium's own push.
 */
#define SS_BLOCK_LEN 64
#define SS_COUNTER_LEN 4
#define SS_INONCE_LEN 8

_Static_assert(FB_STREAM_PART_ALIGN == SS_BLOCK_LEN, "parts are blocks");
_Static_assert(sizeof(((crypto_secretstream_xchacha20poly1305_state *)0)
                          ->nonce) == SS_COUNTER_LEN + SS_INONCE_LEN,
    "secretstream nonce = counter || inner nonce");

fb_err
fb_stream_push_final(fb_stream_push *p, const fb_identity *signer,
    uint8_t trailer[FB_STREAM_TRAILER_LEN])
{
	uint8_t msg[FB_DOMAIN_LEN + T_SIG];

	memset(trailer, 0, FB_STREAM_TRAILER_LEN);
	if (!p->c.finished) {
		return FB_EINVAL;
	}
	trailer_body(&p->c, trailer);
	memcpy(msg, fb_dom_trailer, FB_DOMAIN_LEN);
	memcpy(msg + FB_DOMAIN_LEN, trailer, T_SIG);
	fb_identity_sign_raw(signer, msg, sizeof(msg), trailer + T_SIG);
	return FB_OK;
}

void
fb_stream_push_free(fb_stream_push *p)
{
	fb_secmem_free(p);
}

/* ---- pull ---------------------------------------------------------------- */

fb_err
fb_stream_pull_alloc(const fb_stream_ctx *ctx, fb_stream_digest digest,
    const uint8_t key[FB_STREAM_KEY_LEN], const uint8_t *header,
    size_t header_len, size_t max_chunk_len, fb_stream_pull **out,
    fb_reject *why)
{
	fb_err rc = FB_OK;
	fb_stream_pull *p = NULL;
	uint32_t chunk_len;

	*out = NULL;
	fb_set_why(why, FB_REJECT_NONE);
	if ((rc = fb_crypto_ready()) != FB_OK) {
		goto out;
	}
	if (digest != FB_STREAM_DIGEST_FULL && digest != FB_STREAM_DIGEST_TAGS &&
	    digest != FB_STREAM_DIGEST_INDEXED_TAGS) {
		rc = FB_EINVAL;
		goto out;
	}
	if (header_len != FB_STREAM_HEADER_LEN ||
	    header[0] != FB_CRYPTO_WIRE_VERSION ||
	    header[1] != FB_KIND_STREAM_HEADER || header[2] != digest ||
	    header[3] != 0) {
		fb_set_why(why, FB_REJECT_MALFORMED);
		rc = FB_EPROTO;
		goto out;
	}
	chunk_len = le32_load(header + 4);
	if (chunk_len == 0 || chunk_len > max_chunk_len ||
	    chunk_len > FB_STREAM_CHUNK_MAX) {
		fb_set_why(why, FB_REJECT_TOO_LARGE);
		rc = FB_EPROTO;
		goto out;
	}
	if ((p = fb_secmem_alloc(sizeof(*p))) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	memset(p, 0, sizeof(*p));
	if (digest != FB_STREAM_DIGEST_TAGS) {
		if (!sodium_is_zero(header + 8 + IX_NONCE_LEN,
		        FB_STREAM_HEADER_LEN - 8 - IX_NONCE_LEN)) {
			fb_set_why(why, FB_REJECT_MALFORMED);
			rc = FB_EPROTO;
			goto out;
		}
		memcpy(p->c.key, key, FB_STREAM_KEY_LEN);
		memcpy(p->c.nonce, header + 8, IX_NONCE_LEN);
	} else if (crypto_secretstream_xchacha20poly1305_init_pull(
	               &p->c.ss, header + 8, key) != 0) {
		fb_set_why(why, FB_REJECT_MALFORMED);
		rc = FB_EPROTO;
		goto out;
	}
	core_start(&p->c, ctx, chunk_len, header);
	*out = p;
	p = NULL;
out:
	fb_secmem_free(p);
	return rc;
}

/* pull_die records the first error of a stream and returns it. */
static fb_err
pull_die(fb_stream_pull *p, fb_err rc, fb_reject r, fb_reject *why)
{
	p->c.dead = rc;
	p->c.dead_why = r;
	fb_set_why(why, r);
	return rc;
}

/*
 * The checks before a chunk is pulled, in order: a dead stream gives its
 * error again; a chunk open (or, `tags_open`, a FULL stream) is the
 * caller's mistake; then the chunk's size against the stream and the
 * caller's buffer. The outputs start cleared.
 */
static fb_err
pull_begin(fb_stream_pull *p, int tags_open, size_t c_len, size_t m_cap,
    size_t *m_len, int *final, fb_reject *why)
{
	size_t n;

	*m_len = 0;
	*final = 0;
	fb_set_why(why, FB_REJECT_NONE);
	if (p->c.dead != FB_OK) {
		fb_set_why(why, p->c.dead_why);
		return p->c.dead;
	}
	if (p->c.part_open ||
	    (tags_open && p->c.mode == FB_STREAM_DIGEST_FULL)) {
		return FB_EINVAL;
	}
	if (p->c.finished || c_len < FB_STREAM_CHUNK_OVERHEAD) {
		return pull_die(p, FB_EPROTO, FB_REJECT_MALFORMED, why);
	}
	n = c_len - FB_STREAM_CHUNK_OVERHEAD;
	if (n > p->c.chunk_len) {
		return pull_die(p, FB_EPROTO, FB_REJECT_TOO_LARGE, why);
	}
	if (m_cap < n) {
		return FB_ERANGE; /* caller's buffer; the stream lives on */
	}
	return FB_OK;
}

/* A FULL chunk (length checked, hashed): the next index, its flag. */
static fb_err
ix_pull(fb_stream_pull *p, const uint8_t *c, size_t c_len, uint8_t *m,
    size_t *m_len, int *final, fb_reject *why)
{
	uint8_t nonce[IX_NONCE_LEN + 8], ad[IX_AD_LEN];
	size_t n = c_len - FB_STREAM_CHUNK_OVERHEAD;
	uint8_t flag = c[0];

	/* The flag is authenticated as it came; only then is it read. */
	ix_nonce_ad(&p->c, p->c.chunk_count, flag, nonce, ad);
	if (fb_xchacha_open(m, c + 1, n, c + 1 + n, ad, sizeof(ad), nonce,
	        p->c.key) != 0) {
		return pull_die(p, FB_EAUTH, FB_REJECT_BAD_MAC, why);
	}
	if (flag != IX_FLAG_MESSAGE && flag != IX_FLAG_FINAL) {
		sodium_memzero(m, n);
		return pull_die(p, FB_EPROTO, FB_REJECT_MALFORMED, why);
	}
	p->c.payload_len += n;
	p->c.chunk_count++;
	if (flag == IX_FLAG_FINAL) {
		p->c.finished = 1;
		crypto_generichash_final(&p->c.hash, p->c.digest, 32);
		*final = 1;
	}
	*m_len = n;
	return FB_OK;
}

fb_err
fb_stream_pull_chunk(fb_stream_pull *p, const uint8_t *c, size_t c_len,
    uint8_t *m, size_t m_cap, size_t *m_len, int *final, fb_reject *why)
{
	unsigned long long mlen = 0;
	unsigned char tag = 0;
	fb_err rc;

	if ((rc = pull_begin(p, 0, c_len, m_cap, m_len, final, why)) !=
	    FB_OK) {
		return rc;
	}
	/* Hash first: with m == c + 1 the pull overwrites the ciphertext. */
	core_hash_chunk(&p->c, c, c_len);
	if (!p->c.chain) {
		return ix_pull(p, c, c_len, m, m_len, final, why);
	}
	if (crypto_secretstream_xchacha20poly1305_pull(
	        &p->c.ss, m, &mlen, &tag, c, c_len, p->c.ad, AD_LEN) != 0) {
		return pull_die(p, FB_EAUTH, FB_REJECT_BAD_MAC, why);
	}
	if (tag != crypto_secretstream_xchacha20poly1305_TAG_MESSAGE &&
	    tag != crypto_secretstream_xchacha20poly1305_TAG_FINAL) {
		sodium_memzero(m, (size_t)mlen);
		return pull_die(p, FB_EPROTO, FB_REJECT_MALFORMED, why);
	}
	p->c.payload_len += mlen;
	p->c.chunk_count++;
	if (tag == crypto_secretstream_xchacha20poly1305_TAG_FINAL) {
		p->c.finished = 1;
		crypto_generichash_final(&p->c.hash, p->c.digest, 32);
		*final = 1;
	}
	*m_len = (size_t)mlen;
	return FB_OK;
}

/*
 * An INDEXED_TAGS chunk opened in parts: the steps of
 * crypto_aead_xchacha20poly1305_ietf_decrypt_detached (as libsodium
 * documents its construction), the MAC checked over the whole chunk first,
 * on one thread. Subkey = HChaCha20(key, nonce 0..16); ChaCha20-IETF
 * under it with the nonce 4 zero bytes || nonce 16..24: block 0 keys
 * Poly1305, blocks 1 on the message. MAC = Poly1305(ad, zero pad to 16,
 * the ciphertext, zero pad to 16, LE64(ad length), LE64(length)).
 * crypto_test checks it against libsodium's own seal.
 */
static fb_err
ix_open(fb_stream_pull *p, const uint8_t *c, size_t c_len, size_t *m_len,
    int *final, fb_reject *why)
{
	static const uint8_t zero[16];
	uint8_t nonce[IX_NONCE_LEN + 8], ad[IX_AD_LEN];
	uint8_t block[SS_BLOCK_LEN], l[8], mac[FB_MSG_MAC_LEN];
	fb_poly poly;
	size_t n = c_len - FB_STREAM_CHUNK_OVERHEAD;
	uint8_t flag = c[0];

	_Static_assert(sizeof(((stream_core *)0)->part_nonce) ==
	        4 + 8, "ChaCha20-IETF nonce = 4 zero bytes || nonce 16..24");
	ix_nonce_ad(&p->c, p->c.chunk_count, flag, nonce, ad);
	crypto_core_hchacha20(p->c.part_k, nonce, p->c.key, NULL);
	memset(p->c.part_nonce, 0, 4);
	memcpy(p->c.part_nonce + 4, nonce + IX_NONCE_LEN, 8);
	crypto_stream_chacha20_ietf(
	    block, sizeof(block), p->c.part_nonce, p->c.part_k);
	fb_poly_init(&poly, block, n);
	sodium_memzero(block, sizeof(block));
	fb_poly_update(&poly, ad, sizeof(ad));
	fb_poly_update(
	    &poly, zero, (0x10 - sizeof(ad)) & 0xf);
	fb_poly_update(&poly, c + 1, n);
	fb_poly_update(&poly, zero, (0x10 - n) & 0xf);
	fb_store_le64(l, sizeof(ad));
	fb_poly_update(&poly, l, sizeof(l));
	fb_store_le64(l, (uint64_t)n);
	fb_poly_update(&poly, l, sizeof(l));
	fb_poly_final(&poly, mac);
	if (sodium_memcmp(mac, c + 1 + n, sizeof(mac)) != 0) {
		sodium_memzero(mac, sizeof(mac));
		fb_stream_pull_close(p);
		return pull_die(p, FB_EAUTH, FB_REJECT_BAD_MAC, why);
	}
	sodium_memzero(mac, sizeof(mac));
	/* The flag is authenticated as it came; only then is it read. */
	if (flag != IX_FLAG_MESSAGE && flag != IX_FLAG_FINAL) {
		fb_stream_pull_close(p);
		return pull_die(p, FB_EPROTO, FB_REJECT_MALFORMED, why);
	}
	p->c.part_ic = 1;
	core_hash_chunk(&p->c, c, c_len);
	p->c.payload_len += n;
	p->c.chunk_count++;
	p->c.part_open = 1;
	p->c.part_len = n;
	if (flag == IX_FLAG_FINAL) {
		p->c.finished = 1;
		crypto_generichash_final(&p->c.hash, p->c.digest, 32);
		*final = 1;
	}
	*m_len = n;
	return FB_OK;
}

/*
 * A TAGS chunk opened in parts: the steps of
 * crypto_secretstream_xchacha20poly1305_pull (see the push side above),
 * the MAC checked over the whole chunk first, on one thread, and the
 * ChaCha20 pass split. The chain moves on at the open; the parts use the
 * key and nonce the chunk was sealed under, kept in the stream.
 */
fb_err
fb_stream_pull_open(fb_stream_pull *p, const uint8_t *c, size_t c_len,
    size_t m_cap, size_t *m_len, int *final, fb_reject *why)
{
	static const uint8_t zero[16];
	crypto_secretstream_xchacha20poly1305_state *ss = &p->c.ss;
	fb_poly poly;
	uint8_t block[SS_BLOCK_LEN], l[8], mac[FB_MSG_MAC_LEN];
	size_t n;
	uint8_t tag;
	fb_err rc;

	if ((rc = pull_begin(p, 1, c_len, m_cap, m_len, final, why)) !=
	    FB_OK) {
		return rc;
	}
	if (!p->c.chain) {
		return ix_open(p, c, c_len, m_len, final, why);
	}
	n = c_len - FB_STREAM_CHUNK_OVERHEAD;
	crypto_stream_chacha20_ietf(block, sizeof(block), ss->nonce, ss->k);
	fb_poly_init(&poly, block, n);
	fb_poly_update(&poly, p->c.ad, AD_LEN);
	fb_poly_update(
	    &poly, zero, (0x10 - (size_t)AD_LEN) & 0xf);
	memset(block, 0, sizeof(block));
	block[0] = c[0];
	crypto_stream_chacha20_ietf_xor_ic(
	    block, block, sizeof(block), ss->nonce, 1U, ss->k);
	tag = block[0];
	block[0] = c[0];
	fb_poly_update(&poly, block, sizeof(block));
	fb_poly_update(&poly, c + 1, n);
	fb_poly_update(
	    &poly, zero, (0x10 - sizeof(block) + n) & 0xf);
	fb_store_le64(l, AD_LEN);
	fb_poly_update(&poly, l, sizeof(l));
	fb_store_le64(l, (uint64_t)(sizeof(block) + n));
	fb_poly_update(&poly, l, sizeof(l));
	fb_poly_final(&poly, mac);
	sodium_memzero(block, sizeof(block));
	if (sodium_memcmp(mac, c + 1 + n, sizeof(mac)) != 0) {
		sodium_memzero(mac, sizeof(mac));
		return pull_die(p, FB_EAUTH, FB_REJECT_BAD_MAC, why);
	}
	if (tag != crypto_secretstream_xchacha20poly1305_TAG_MESSAGE &&
	    tag != crypto_secretstream_xchacha20poly1305_TAG_FINAL) {
		sodium_memzero(mac, sizeof(mac));
		return pull_die(p, FB_EPROTO, FB_REJECT_MALFORMED, why);
	}
	memcpy(p->c.part_k, ss->k, sizeof(p->c.part_k));
	memcpy(p->c.part_nonce, ss->nonce, sizeof(p->c.part_nonce));
	p->c.part_ic = 2;
	for (size_t i = 0; i < SS_INONCE_LEN; i++) {
		ss->nonce[SS_COUNTER_LEN + i] ^= mac[i];
	}
	sodium_memzero(mac, sizeof(mac));
	sodium_increment(ss->nonce, SS_COUNTER_LEN);
	if ((tag & crypto_secretstream_xchacha20poly1305_TAG_REKEY) != 0 ||
	    sodium_is_zero(ss->nonce, SS_COUNTER_LEN)) {
		crypto_secretstream_xchacha20poly1305_rekey(ss);
	}
	core_hash_chunk(&p->c, c, c_len);
	p->c.payload_len += n;
	p->c.chunk_count++;
	p->c.part_open = 1;
	p->c.part_len = n;
	if (tag == crypto_secretstream_xchacha20poly1305_TAG_FINAL) {
		p->c.finished = 1;
		crypto_generichash_final(&p->c.hash, p->c.digest, 32);
		*final = 1;
	}
	*m_len = n;
	return FB_OK;
}

fb_err
fb_stream_pull_decrypt(const fb_stream_pull *p, const uint8_t *c, size_t off,
    size_t len, uint8_t *m)
{
	if (!p->c.part_open) {
		return FB_EINVAL;
	}
	if (off % SS_BLOCK_LEN != 0 || off > p->c.part_len ||
	    len > p->c.part_len - off) {
		return FB_ERANGE;
	}
	fb_chacha20_xor_ic(m + off, c + 1 + off, len,
	    p->c.part_nonce, (uint32_t)(p->c.part_ic + off / SS_BLOCK_LEN),
	    p->c.part_k);
	return FB_OK;
}

void
fb_stream_pull_close(fb_stream_pull *p)
{
	sodium_memzero(p->c.part_k, sizeof(p->c.part_k));
	sodium_memzero(p->c.part_nonce, sizeof(p->c.part_nonce));
	p->c.part_open = 0;
	p->c.part_len = 0;
}

/* A chunk's decryption in parts: part i of n, PART_MIN bytes or more. */
#define PART_MIN (128u << 10)
#define PARTS_MAX 16

typedef struct dec_arg {
	const fb_stream_pull *pull;
	const uint8_t *c;
	uint8_t *m;
	size_t len, part;
	atomic_int rc; /* the first part's error (none expected) */
} dec_arg;

static void
dec_piece(void *arg, uint32_t i)
{
	dec_arg *a = arg;
	size_t off = (size_t)i * a->part;
	size_t n = a->len - off < a->part ? a->len - off : a->part;
	fb_err rc = fb_stream_pull_decrypt(a->pull, a->c, off, n, a->m);

	if (rc != FB_OK) {
		int ok = FB_OK;
		atomic_compare_exchange_strong(&a->rc, &ok, (int)rc);
	}
}

fb_err
fb_stream_pull_chunk_par(fb_stream_pull *p, const uint8_t *c, size_t c_len,
    uint8_t *m, size_t m_cap, size_t *m_len, int *final, fb_reject *why,
    void (*run)(void *ctx, uint32_t n, void (*fn)(void *arg, uint32_t i),
        void *arg),
    void *ctx)
{
	dec_arg a = {.pull = p, .c = c, .m = m};
	fb_err rc;
	uint32_t parts;

	if (p->c.mode == FB_STREAM_DIGEST_FULL) {
		return fb_stream_pull_chunk(p, c, c_len, m, m_cap, m_len, final,
		    why);
	}
	if ((rc = fb_stream_pull_open(p, c, c_len, m_cap, m_len, final, why)) !=
	    FB_OK) {
		return rc;
	}
	a.len = *m_len;
	parts = (uint32_t)(a.len / PART_MIN);
	parts = parts < 1 ? 1 : parts > PARTS_MAX ? PARTS_MAX : parts;
	a.part = (a.len / parts + SS_BLOCK_LEN - 1) / SS_BLOCK_LEN *
	         SS_BLOCK_LEN;
	parts = a.part == 0 ? 1 : (uint32_t)((a.len + a.part - 1) / a.part);
	atomic_init(&a.rc, FB_OK);
	run(ctx, parts, dec_piece, &a);
	fb_stream_pull_close(p);
	return (fb_err)atomic_load(&a.rc);
}

fb_err
fb_stream_pull_chunk_at(const fb_stream_pull *p, uint64_t index,
    const uint8_t *c, size_t c_len, uint8_t *m, size_t m_cap, size_t *m_len,
    int *final, uint8_t hash[FB_STREAM_HASH_LEN], fb_reject *why)
{
	uint8_t nonce[IX_NONCE_LEN + 8], ad[IX_AD_LEN];
	size_t n;
	uint8_t flag;

	*m_len = 0;
	*final = 0;
	memset(hash, 0, FB_STREAM_HASH_LEN);
	fb_set_why(why, FB_REJECT_NONE);
	if (p->c.chain || p->c.finished || p->c.dead != FB_OK) {
		return FB_EINVAL;
	}
	if (c_len < FB_STREAM_CHUNK_OVERHEAD) {
		fb_set_why(why, FB_REJECT_MALFORMED);
		return FB_EPROTO;
	}
	n = c_len - FB_STREAM_CHUNK_OVERHEAD;
	if (n > p->c.chunk_len) {
		fb_set_why(why, FB_REJECT_TOO_LARGE);
		return FB_EPROTO;
	}
	if (m_cap < n) {
		return FB_ERANGE;
	}
	ix_chunk_entry(&p->c, index, c, c_len, hash);
	/* The flag is authenticated as it came; only then is it read. */
	flag = c[0];
	ix_nonce_ad(&p->c, index, flag, nonce, ad);
	if (fb_xchacha_open(m, c + 1, n, c + 1 + n, ad, sizeof(ad), nonce,
	        p->c.key) != 0) {
		memset(hash, 0, FB_STREAM_HASH_LEN);
		fb_set_why(why, FB_REJECT_BAD_MAC);
		return FB_EAUTH;
	}
	if (flag != IX_FLAG_MESSAGE && flag != IX_FLAG_FINAL) {
		sodium_memzero(m, n);
		memset(hash, 0, FB_STREAM_HASH_LEN);
		fb_set_why(why, FB_REJECT_MALFORMED);
		return FB_EPROTO;
	}
	*final = flag == IX_FLAG_FINAL;
	*m_len = n;
	return FB_OK;
}

fb_err
fb_stream_pull_hashes(fb_stream_pull *p, const uint8_t *hashes,
    uint64_t count, uint64_t payload_len, int final)
{
	if (p->c.chain || p->c.finished || p->c.dead != FB_OK) {
		return FB_EINVAL;
	}
	core_take_hashes(&p->c, hashes, count, payload_len, final);
	return FB_OK;
}

fb_err
fb_stream_pull_final(fb_stream_pull *p, const fb_pubkey *signer,
    const uint8_t *trailer, size_t trailer_len, uint64_t *payload_len,
    fb_reject *why)
{
	uint8_t msg[FB_DOMAIN_LEN + T_SIG];
	uint8_t want[FB_STREAM_TRAILER_LEN];

	if (payload_len != NULL) {
		*payload_len = 0;
	}
	fb_set_why(why, FB_REJECT_NONE);
	if (p->c.dead != FB_OK) {
		fb_set_why(why, p->c.dead_why);
		return p->c.dead;
	}
	if (trailer_len != FB_STREAM_TRAILER_LEN ||
	    trailer[0] != FB_CRYPTO_WIRE_VERSION ||
	    trailer[1] != FB_KIND_TRAILER || le16_load(trailer + 2) != 0) {
		fb_set_why(why, FB_REJECT_MALFORMED);
		return FB_EPROTO;
	}
	memcpy(msg, fb_dom_trailer, FB_DOMAIN_LEN);
	memcpy(msg + FB_DOMAIN_LEN, trailer, T_SIG);
	if (crypto_sign_verify_detached(
	        trailer + T_SIG, msg, sizeof(msg), signer->b) != 0) {
		fb_set_why(why, FB_REJECT_BAD_SIGNATURE);
		return FB_EAUTH;
	}
	if (memcmp(trailer + T_RUN, p->c.ctx.run.b, FB_RUN_ID_LEN) != 0) {
		fb_set_why(why, FB_REJECT_WRONG_RUN);
		return FB_EAUTH;
	}
	if (le32_load(trailer + T_SENDER) != p->c.ctx.sender) {
		fb_set_why(why, FB_REJECT_WRONG_SENDER);
		return FB_EAUTH;
	}
	if (le32_load(trailer + T_ROUND) != p->c.ctx.round) {
		fb_set_why(why, FB_REJECT_WRONG_ROUND);
		return FB_ESTALE;
	}
	if (!p->c.finished ||
	    fb_load_le64(trailer + T_LEN) != p->c.payload_len ||
	    fb_load_le64(trailer + T_COUNT) != p->c.chunk_count) {
		fb_set_why(why, FB_REJECT_TRUNCATED);
		return FB_EPROTO;
	}
	trailer_body(&p->c, want);
	if (sodium_memcmp(want, trailer, T_SIG) != 0) {
		/* Signed by the right key, over another stream. */
		fb_set_why(why, FB_REJECT_BAD_SIGNATURE);
		return FB_EAUTH;
	}
	if (payload_len != NULL) {
		*payload_len = p->c.payload_len;
	}
	return FB_OK;
}

void
fb_stream_pull_free(fb_stream_pull *p)
{
	fb_secmem_free(p);
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * session.c -- the signed handshake and sealed control messages.
 *
 * The worker sends a hello signed by its identity that carries a fresh
 * X25519 key; the coordinator answers with its own fresh X25519 key, signed
 * over the hello and the reply, so each side knows who holds the other
 * ephemeral key. crypto_kx over the ephemeral keys, mixed with the
 * transcript hash, gives one key per direction. The ephemeral secrets die
 * with the handshake (forward secrecy). Layouts are in crypto.h.
 */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "crypto/crypto_impl.h"

/* Hello field offsets. */
#define H_PROTO 2
#define H_PK 4
#define H_EPH 36
#define H_COOKIE 68
#define H_SIG 100
/* Reply field offsets. */
#define R_PROTO 2
#define R_WORKER 4
#define R_RUN 8
#define R_PK 24
#define R_EPH 56
#define R_SIG 88
/* Sealed-message header offsets. */
#define M_TYPE 1
#define M_RSV 2
#define M_RUN 4
#define M_ROUND 20
#define M_SENDER 24
#define M_SEQ 28
#define M_LEN 36

/* The worker's handshake state; fb_secmem_alloc'd (ephemeral secret). */
struct fb_handshake {
	uint8_t eph_sk[32];
	uint8_t eph_pk[32];
	uint8_t hello[FB_HS_HELLO_LEN];
	fb_pubkey self;
	fb_pubkey coordinator; /* pinned */
	uint16_t proto_version;
};

fb_err
fb_session_alloc_keys(const uint8_t tx[32], const uint8_t rx[32],
    const uint8_t th[32], const fb_run_id *run, const fb_pubkey *peer,
    uint32_t self_id, uint32_t peer_id, fb_session **out)
{
	fb_session *s;

	*out = NULL;
	if ((s = fb_secmem_alloc(sizeof(*s))) == NULL) {
		return FB_ENOMEM;
	}
	memset(s, 0, sizeof(*s));
	memcpy(s->tx, tx, 32);
	memcpy(s->rx, rx, 32);
	memcpy(s->th, th, 32);
	s->run = *run;
	s->peer = *peer;
	s->self_id = self_id;
	s->peer_id = peer_id;
	s->worker_id = self_id == FB_SENDER_COORDINATOR ? peer_id : self_id;
	*out = s;
	return FB_OK;
}

void
fb_session_free(fb_session *s)
{
	fb_secmem_free(s); /* wipes; NULL is a no-op */
}

void
fb_session_run_id(const fb_session *s, fb_run_id *run)
{
	*run = s->run;
}

void
fb_session_peer(const fb_session *s, fb_pubkey *pk)
{
	*pk = s->peer;
}

uint32_t
fb_session_worker_id(const fb_session *s)
{
	return s->worker_id;
}

void
fb_session_transcript(const fb_session *s, uint8_t th[32])
{
	memcpy(th, s->th, 32);
}

int
fb_allowlist_lookup_cb(void *arg, const fb_pubkey *pk, uint32_t *worker_id)
{
	const fb_allowlist *al = arg;

	*worker_id = 0;
	for (size_t i = 0; i < al->count && i < FB_SENDER_COORDINATOR; i++) {
		if (fb_pubkey_equal(&al->keys[i], pk)) {
			*worker_id = (uint32_t)i;
			return 1;
		}
	}
	return 0;
}

/*
 * derive_keys turns the kx keys into the session keys:
 * th = H("fedbox/trans/v1" || hello || reply), k = H_th(domain || kx key).
 */
static void
derive_keys(const uint8_t *hello, const uint8_t *reply, uint8_t c2s[32],
    uint8_t s2c[32], uint8_t th[32])
{
	crypto_generichash_state h;
	uint8_t in[FB_DOMAIN_LEN + 32];

	crypto_generichash_init(&h, NULL, 0, 32);
	crypto_generichash_update(&h, fb_dom_trans, FB_DOMAIN_LEN);
	crypto_generichash_update(&h, hello, FB_HS_HELLO_LEN);
	crypto_generichash_update(&h, reply, FB_HS_REPLY_LEN);
	crypto_generichash_final(&h, th, 32);

	memcpy(in, fb_dom_c2s, FB_DOMAIN_LEN);
	memcpy(in + FB_DOMAIN_LEN, c2s, 32);
	crypto_generichash(c2s, 32, in, sizeof(in), th, 32);
	memcpy(in, fb_dom_s2c, FB_DOMAIN_LEN);
	memcpy(in + FB_DOMAIN_LEN, s2c, 32);
	crypto_generichash(s2c, 32, in, sizeof(in), th, 32);
	sodium_memzero(in, sizeof(in));
}

/* reply_signed_msg lays out what the coordinator signs. */
static void
reply_signed_msg(const uint8_t *hello, const uint8_t *reply,
    uint8_t msg[FB_DOMAIN_LEN + FB_HS_HELLO_LEN + R_SIG])
{
	memcpy(msg, fb_dom_reply, FB_DOMAIN_LEN);
	memcpy(msg + FB_DOMAIN_LEN, hello, FB_HS_HELLO_LEN);
	memcpy(msg + FB_DOMAIN_LEN + FB_HS_HELLO_LEN, reply, R_SIG);
}

/* Cookie field offsets. */
#define C_TIME 0
#define C_RAND 8
#define C_MAC 16

static const uint8_t cookie_domain[FB_DOMAIN_LEN] = "fedbox/cookie/v1";

static void
cookie_mac(const uint8_t key[FB_HS_COOKIE_KEY_LEN], const uint8_t *cookie,
    uint8_t mac[16])
{
	crypto_generichash_state st;

	crypto_generichash_init(&st, key, FB_HS_COOKIE_KEY_LEN, 16);
	crypto_generichash_update(&st, cookie_domain, FB_DOMAIN_LEN);
	crypto_generichash_update(&st, cookie, C_MAC);
	crypto_generichash_final(&st, mac, 16);
	sodium_memzero(&st, sizeof(st));
}

void
fb_hs_cookie_make(const uint8_t key[FB_HS_COOKIE_KEY_LEN], int64_t now_ms,
    uint8_t cookie[FB_HS_COOKIE_LEN])
{
	fb_store_le64(cookie + C_TIME, (uint64_t)now_ms);
	randombytes_buf(cookie + C_RAND, 8);
	cookie_mac(key, cookie, cookie + C_MAC);
}

fb_err
fb_hs_cookie_check(const uint8_t key[FB_HS_COOKIE_KEY_LEN],
    const uint8_t cookie[FB_HS_COOKIE_LEN], int64_t now_ms, int64_t max_ms)
{
	uint8_t mac[16];
	int64_t issued;

	cookie_mac(key, cookie, mac);
	if (sodium_memcmp(mac, cookie + C_MAC, 16) != 0) {
		return FB_EAUTH;
	}
	issued = (int64_t)fb_load_le64(cookie + C_TIME);
	if (issued > now_ms || now_ms - issued > max_ms) {
		return FB_ESTALE;
	}
	return FB_OK;
}

fb_err
fb_handshake_start(const fb_identity *self, const fb_pubkey *coordinator,
    uint16_t proto_version, const uint8_t cookie[FB_HS_COOKIE_LEN],
    uint8_t hello[FB_HS_HELLO_LEN], fb_handshake **out)
{
	fb_err rc = FB_OK;
	fb_handshake *hs = NULL;
	uint8_t msg[FB_DOMAIN_LEN + H_SIG];

	*out = NULL;
	memset(hello, 0, FB_HS_HELLO_LEN);
	if ((rc = fb_crypto_ready()) != FB_OK) {
		goto out;
	}
	if ((hs = fb_secmem_alloc(sizeof(*hs))) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	memset(hs, 0, sizeof(*hs));
	crypto_kx_keypair(hs->eph_pk, hs->eph_sk);
	fb_identity_pubkey(self, &hs->self);
	hs->coordinator = *coordinator;
	hs->proto_version = proto_version;

	hs->hello[0] = FB_CRYPTO_WIRE_VERSION;
	hs->hello[1] = FB_KIND_HELLO;
	le16_store(hs->hello + H_PROTO, proto_version);
	memcpy(hs->hello + H_PK, hs->self.b, 32);
	memcpy(hs->hello + H_EPH, hs->eph_pk, 32);
	memcpy(hs->hello + H_COOKIE, cookie, FB_HS_COOKIE_LEN);
	memcpy(msg, fb_dom_hello, FB_DOMAIN_LEN);
	memcpy(msg + FB_DOMAIN_LEN, hs->hello, H_SIG);
	fb_identity_sign_raw(self, msg, sizeof(msg), hs->hello + H_SIG);
	memcpy(hello, hs->hello, FB_HS_HELLO_LEN);
	*out = hs;
	hs = NULL;
out:
	fb_secmem_free(hs);
	return rc;
}

void
fb_handshake_free(fb_handshake *hs)
{
	fb_secmem_free(hs);
}

fb_err
fb_handshake_accept(const fb_hs_accept_cfg *cfg, const uint8_t *hello,
    size_t hello_len, uint8_t reply[FB_HS_REPLY_LEN], fb_session **out,
    fb_reject *why)
{
	fb_err rc = FB_OK;
	fb_pubkey worker, self;
	uint32_t worker_id = 0;
	uint8_t msg[FB_DOMAIN_LEN + FB_HS_HELLO_LEN + R_SIG];
	uint8_t *k = NULL; /* eph sk 32 | eph pk 32 | rx 32 | tx 32 | th 32 */

	*out = NULL;
	memset(reply, 0, FB_HS_REPLY_LEN);
	fb_set_why(why, FB_REJECT_NONE);
	if ((rc = fb_crypto_ready()) != FB_OK) {
		goto out;
	}
	if (hello_len != FB_HS_HELLO_LEN ||
	    hello[0] != FB_CRYPTO_WIRE_VERSION || hello[1] != FB_KIND_HELLO) {
		fb_set_why(why, FB_REJECT_MALFORMED);
		rc = FB_EPROTO;
		goto out;
	}
	if (le16_load(hello + H_PROTO) != cfg->proto_version) {
		fb_set_why(why, FB_REJECT_VERSION);
		rc = FB_ENOTSUP;
		goto out;
	}
	memcpy(worker.b, hello + H_PK, 32);
	memcpy(msg, fb_dom_hello, FB_DOMAIN_LEN);
	memcpy(msg + FB_DOMAIN_LEN, hello, H_SIG);
	if (!cfg->lookup(cfg->lookup_arg, &worker, &worker_id)) {
		/* The signature check an allowlisted key's hello gets, done and
		 * ignored: a refusal takes as long for a key not on the
		 * allowlist as for one on it whose hello does not verify. */
		int same_work = crypto_sign_verify_detached(
		    hello + H_SIG, msg, FB_DOMAIN_LEN + H_SIG, worker.b);
		(void)same_work;
		fb_set_why(why, FB_REJECT_UNKNOWN_KEY);
		rc = FB_EAUTH;
		goto out;
	}
	if (worker_id == FB_SENDER_COORDINATOR || cfg->cookie_key == NULL) {
		rc = FB_EINVAL;
		goto out;
	}
	if (crypto_sign_verify_detached(
	        hello + H_SIG, msg, FB_DOMAIN_LEN + H_SIG, worker.b) != 0) {
		fb_set_why(why, FB_REJECT_BAD_SIGNATURE);
		rc = FB_EAUTH;
		goto out;
	}
	/* After the signature: only a hello its key really signed gets to
	 * be called stale (so the answer to a forged one stays the same). */
	if (fb_hs_cookie_check(cfg->cookie_key, hello + H_COOKIE, cfg->now_ms,
	        cfg->cookie_ms) != FB_OK) {
		fb_set_why(why, FB_REJECT_REPLAY);
		rc = FB_ESTALE;
		goto out;
	}
	if ((k = fb_secmem_alloc(160)) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	crypto_kx_keypair(k + 32, k);
	/* Server side: rx = worker->coordinator, tx = coordinator->worker. */
	if (crypto_kx_server_session_keys(
	        k + 64, k + 96, k + 32, k, hello + H_EPH) != 0) {
		fb_set_why(why, FB_REJECT_MALFORMED); /* weak ephemeral key */
		rc = FB_EPROTO;
		goto out;
	}
	reply[0] = FB_CRYPTO_WIRE_VERSION;
	reply[1] = FB_KIND_REPLY;
	le16_store(reply + R_PROTO, cfg->proto_version);
	le32_store(reply + R_WORKER, worker_id);
	memcpy(reply + R_RUN, cfg->run.b, FB_RUN_ID_LEN);
	fb_identity_pubkey(cfg->self, &self);
	memcpy(reply + R_PK, self.b, 32);
	memcpy(reply + R_EPH, k + 32, 32);
	reply_signed_msg(hello, reply, msg);
	fb_identity_sign_raw(cfg->self, msg, sizeof(msg), reply + R_SIG);
	derive_keys(hello, reply, k + 64, k + 96, k + 128);
	rc = fb_session_alloc_keys(k + 96, k + 64, k + 128, &cfg->run, &worker,
	    FB_SENDER_COORDINATOR, worker_id, out);
out:
	if (rc != FB_OK) {
		memset(reply, 0, FB_HS_REPLY_LEN);
	}
	fb_secmem_free(k);
	return rc;
}

fb_err
fb_handshake_finish(fb_handshake *hs, const uint8_t *reply, size_t reply_len,
    fb_session **out, fb_reject *why)
{
	fb_err rc = FB_OK;
	uint8_t msg[FB_DOMAIN_LEN + FB_HS_HELLO_LEN + R_SIG];
	uint8_t *k = NULL; /* rx 32 | tx 32 | th 32 */
	uint32_t worker_id;
	fb_run_id run;

	*out = NULL;
	fb_set_why(why, FB_REJECT_NONE);
	if (reply_len != FB_HS_REPLY_LEN ||
	    reply[0] != FB_CRYPTO_WIRE_VERSION || reply[1] != FB_KIND_REPLY) {
		fb_set_why(why, FB_REJECT_MALFORMED);
		rc = FB_EPROTO;
		goto out;
	}
	if (le16_load(reply + R_PROTO) != hs->proto_version) {
		fb_set_why(why, FB_REJECT_VERSION);
		rc = FB_ENOTSUP;
		goto out;
	}
	if (sodium_memcmp(reply + R_PK, hs->coordinator.b, 32) != 0) {
		fb_set_why(why, FB_REJECT_UNPINNED_KEY);
		rc = FB_EAUTH;
		goto out;
	}
	reply_signed_msg(hs->hello, reply, msg);
	if (crypto_sign_verify_detached(
	        reply + R_SIG, msg, sizeof(msg), hs->coordinator.b) != 0) {
		fb_set_why(why, FB_REJECT_BAD_SIGNATURE);
		rc = FB_EAUTH;
		goto out;
	}
	worker_id = le32_load(reply + R_WORKER);
	if (worker_id == FB_SENDER_COORDINATOR) {
		fb_set_why(why, FB_REJECT_MALFORMED);
		rc = FB_EPROTO;
		goto out;
	}
	if ((k = fb_secmem_alloc(96)) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	/* Client side: rx = coordinator->worker, tx = worker->coordinator. */
	if (crypto_kx_client_session_keys(
	        k, k + 32, hs->eph_pk, hs->eph_sk, reply + R_EPH) != 0) {
		fb_set_why(why, FB_REJECT_MALFORMED);
		rc = FB_EPROTO;
		goto out;
	}
	derive_keys(hs->hello, reply, k + 32, k, k + 64);
	memcpy(run.b, reply + R_RUN, FB_RUN_ID_LEN);
	rc = fb_session_alloc_keys(k + 32, k, k + 64, &run, &hs->coordinator,
	    worker_id, FB_SENDER_COORDINATOR, out);
out:
	fb_secmem_free(k);
	return rc;
}

/* ---- sealed messages ----------------------------------------------------- */

static void
seq_nonce(uint64_t seq, uint8_t nonce[24])
{
	memset(nonce, 0, 24);
	fb_store_le64(nonce, seq);
}

static void
header_parse(const uint8_t *in, fb_msg_info *info)
{
	info->type = in[M_TYPE];
	memcpy(info->run.b, in + M_RUN, FB_RUN_ID_LEN);
	info->round = le32_load(in + M_ROUND);
	info->sender = le32_load(in + M_SENDER);
	info->seq = fb_load_le64(in + M_SEQ);
	info->body_len = le32_load(in + M_LEN);
}

fb_err
fb_msg_peek(const uint8_t *in, size_t in_len, fb_msg_info *info)
{
	memset(info, 0, sizeof(*info));
	if (in_len < FB_MSG_OVERHEAD || in[0] != FB_CRYPTO_WIRE_VERSION ||
	    le16_load(in + M_RSV) != 0 ||
	    le32_load(in + M_LEN) != in_len - FB_MSG_OVERHEAD) {
		return FB_EPROTO;
	}
	header_parse(in, info);
	return FB_OK;
}

fb_err
fb_msg_seal(fb_session *s, uint8_t type, uint32_t round, const uint8_t *body,
    size_t body_len, uint8_t *out, size_t out_cap, size_t *out_len)
{
	uint8_t nonce[24];

	*out_len = 0;
	if (body_len > FB_MSG_BODY_MAX || out_cap < FB_MSG_OVERHEAD ||
	    out_cap - FB_MSG_OVERHEAD < body_len || s->send_seq == UINT64_MAX) {
		return FB_ERANGE;
	}
	s->send_seq++;
	out[0] = FB_CRYPTO_WIRE_VERSION;
	out[M_TYPE] = type;
	le16_store(out + M_RSV, 0);
	memcpy(out + M_RUN, s->run.b, FB_RUN_ID_LEN);
	le32_store(out + M_ROUND, round);
	le32_store(out + M_SENDER, s->self_id);
	fb_store_le64(out + M_SEQ, s->send_seq);
	le32_store(out + M_LEN, (uint32_t)body_len);
	seq_nonce(s->send_seq, nonce);
	crypto_aead_xchacha20poly1305_ietf_encrypt_detached(
	    out + FB_MSG_HEADER_LEN, out + FB_MSG_HEADER_LEN + body_len, NULL,
	    body, body_len, out, FB_MSG_HEADER_LEN, NULL, nonce, s->tx);
	*out_len = body_len + FB_MSG_OVERHEAD;
	return FB_OK;
}

fb_err
fb_msg_open(fb_session *s, uint32_t round, const uint8_t *in, size_t in_len,
    uint8_t *body, size_t body_cap, size_t *body_len, fb_msg_info *info,
    fb_reject *why)
{
	fb_err rc = FB_OK;
	fb_msg_info h;
	uint8_t nonce[24];
	size_t n;

	*body_len = 0;
	memset(info, 0, sizeof(*info));
	fb_set_why(why, FB_REJECT_NONE);
	if (fb_msg_peek(in, in_len, &h) != FB_OK) {
		fb_set_why(why, FB_REJECT_MALFORMED);
		return FB_EPROTO;
	}
	n = h.body_len;
	if (n > FB_MSG_BODY_MAX || n > body_cap) {
		fb_set_why(why, FB_REJECT_TOO_LARGE);
		return FB_EPROTO;
	}
	if (sodium_memcmp(h.run.b, s->run.b, FB_RUN_ID_LEN) != 0) {
		fb_set_why(why, FB_REJECT_WRONG_RUN);
		return FB_EAUTH;
	}
	if (h.sender != s->peer_id) {
		fb_set_why(why, FB_REJECT_WRONG_SENDER);
		return FB_EAUTH;
	}
	seq_nonce(h.seq, nonce);
	/* libsodium verifies the tag before it decrypts anything. */
	if (crypto_aead_xchacha20poly1305_ietf_decrypt_detached(body, NULL,
	        in + FB_MSG_HEADER_LEN, n, in + FB_MSG_HEADER_LEN + n, in,
	        FB_MSG_HEADER_LEN, nonce, s->rx) != 0) {
		fb_set_why(why, FB_REJECT_BAD_MAC);
		return FB_EAUTH;
	}
	if (h.seq <= s->recv_seq) {
		fb_set_why(why, FB_REJECT_REPLAY);
		rc = FB_EAUTH;
		goto out;
	}
	s->recv_seq = h.seq;
	if (round != FB_ROUND_ANY && h.round != round) {
		fb_set_why(why, FB_REJECT_WRONG_ROUND);
		rc = FB_ESTALE;
		goto out;
	}
	*body_len = n;
	*info = h;
out:
	if (rc != FB_OK) {
		sodium_memzero(body, n);
	}
	return rc;
}

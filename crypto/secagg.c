/* SPDX-License-Identifier: Apache-2.0 */
/*
 * secagg.c -- SecAgg+ as pure functions: the neighbour graph, the worker's
 * steps (keys, shares, masking, reveal) and the coordinator's (checking
 * and relaying, reconstruction, mask removal). crypto.h ("Secure
 * aggregation") has the protocol, the wire layouts and the contracts.
 *
 * Secrets (c_sk, s_sk, b, held shares, pairwise seeds) live in
 * fb_secmem_alloc'd memory and are wiped by the _free functions; temporary
 * copies are wiped where they are used.
 */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "crypto/crypto_impl.h"

#define VERSION FB_CRYPTO_WIRE_VERSION
#define KIND_ADV 16
#define KIND_SHARES 17
#define KIND_REVEAL 18
#define KIND_CONFIRM 19
#define REVEAL_B 1
#define REVEAL_S 2
#define SHARE_PT_LEN (2 * FB_SHAMIR_SHARE_LEN)
#define SHARE_HDR_LEN 32
#define ADV_SIG_AT 124
#define SESSION_SIGNED_LEN 52 /* advert bytes 0..20 and 28..60 */
#define CONFIRM_SIGNED_LEN 64
#define SHARE_AD_LEN (SHARE_HDR_LEN + 64)
/* Verified session signatures a cache keeps before it starts again: a
 * peer that sends a new one every round costs a verification, not
 * memory. */
#define SEEN_MAX 131072u

static const uint8_t enc_domain[] = "fedbox/secagg-enc/v1";
static const uint8_t commit_domain[] = "fedbox/secagg-b/v1";
static const uint8_t set_domain[] = "fedbox/secagg-u3/v1";
static const uint8_t seen_domain[] = "fedbox/secagg-seen/v1";

static void
st32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++) {
		p[i] = (uint8_t)(v >> (8 * i));
	}
}

static void
st64(uint8_t *p, uint64_t v)
{
	st32(p, (uint32_t)v);
	st32(p + 4, (uint32_t)(v >> 32));
}

static uint32_t
ld32(const uint8_t *p)
{
	return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
	       ((uint32_t)p[3] << 24);
}

/* ---- graph --------------------------------------------------------------- */

struct fb_secagg_graph {
	uint32_t n;
	uint32_t k;    /* actual degree */
	uint32_t half; /* k / 2 positions on each side; unused if complete */
	int complete;
	uint32_t *pos; /* pos[i]: worker i's position on the cycle */
	uint32_t *at;  /* at[p]: the worker at position p */
};

uint32_t
fb_secagg_degree_auto(uint32_t n, uint32_t t)
{
	uint32_t k;

	if (n < 2) {
		return 0;
	}
	k = (uint32_t)ceil(FB_SECAGG_AUTO_C * log2((double)n));
	if (t > 0 && k < t - 1) {
		k = t - 1;
	}
	k += k & 1;
	return k >= n - 1 ? n - 1 : k;
}

uint32_t
fb_secagg_threshold_default(uint32_t k)
{
	return (k + 1) / 2 + 1;
}

/* graph_degree maps a requested degree to the actual one. */
static uint32_t
graph_degree(uint32_t n, uint32_t degree, uint32_t t)
{
	if (degree == FB_SECAGG_DEGREE_AUTO) {
		return fb_secagg_degree_auto(n, t);
	}
	if (degree >= n - 1) {
		return n - 1;
	}
	degree += degree & 1;
	return degree >= n - 1 ? n - 1 : degree;
}

fb_err
fb_secagg_graph_alloc(uint32_t n, uint32_t degree, uint32_t t,
    const uint8_t seed[32], uint32_t round, fb_secagg_graph **out)
{
	fb_err rc = FB_OK;
	fb_secagg_graph *g = NULL;
	uint32_t *words = NULL;
	uint64_t drawn = 0;
	uint32_t used = 4096;

	*out = NULL;
	if (n < 2 || n > FB_SECAGG_MAX_WORKERS) {
		return FB_EINVAL;
	}
	g = calloc(1, sizeof(*g));
	if (g == NULL) {
		return FB_ENOMEM;
	}
	g->n = n;
	g->k = graph_degree(n, degree, t);
	g->complete = g->k == n - 1;
	g->half = g->k / 2;
	g->pos = calloc(n, sizeof(*g->pos));
	g->at = calloc(n, sizeof(*g->at));
	words = calloc(4096, sizeof(*words));
	if (g->pos == NULL || g->at == NULL || words == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	for (uint32_t p = 0; p < n; p++) {
		g->at[p] = p;
	}
	/* Fisher-Yates; j uniform in [0, i] by rejection on 32-bit words. */
	for (uint32_t i = n - 1; i >= 1; i--) {
		uint32_t range = i + 1;
		uint32_t limit = (uint32_t)(UINT64_C(0x100000000) -
		    (UINT64_C(0x100000000) % range));
		uint32_t r, j, tmp;
		do {
			if (used == 4096) {
				memset(words, 0, 4096 * sizeof(*words));
				if ((rc = fb_mask_add(words, drawn, 4096, seed,
				         FB_MASK_GRAPH, round)) != FB_OK) {
					goto out;
				}
				drawn += 4096;
				used = 0;
			}
			r = words[used++];
		} while (limit != 0 && r >= limit);
		j = r % range;
		tmp = g->at[i];
		g->at[i] = g->at[j];
		g->at[j] = tmp;
	}
	for (uint32_t p = 0; p < n; p++) {
		g->pos[g->at[p]] = p;
	}
	*out = g;
	g = NULL;
out:
	free(words);
	fb_secagg_graph_free(g);
	return rc;
}

void
fb_secagg_graph_free(fb_secagg_graph *g)
{
	if (g == NULL) {
		return;
	}
	free(g->pos);
	free(g->at);
	free(g);
}

uint32_t
fb_secagg_graph_degree(const fb_secagg_graph *g)
{
	return g->k;
}

int
fb_secagg_graph_adjacent(const fb_secagg_graph *g, uint32_t i, uint32_t j)
{
	uint32_t d;

	if (i == j || i >= g->n || j >= g->n) {
		return 0;
	}
	if (g->complete) {
		return 1;
	}
	d = g->pos[i] > g->pos[j] ? g->pos[i] - g->pos[j]
	                          : g->pos[j] - g->pos[i];
	if (d > g->n - d) {
		d = g->n - d;
	}
	return d <= g->half;
}

static int
cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return (x > y) - (x < y);
}

fb_err
fb_secagg_graph_neighbours(const fb_secagg_graph *g, uint32_t i,
    uint32_t *out)
{
	uint32_t c = 0;

	if (i >= g->n) {
		return FB_EINVAL;
	}
	if (g->complete) {
		for (uint32_t j = 0; j < g->n; j++) {
			if (j != i) {
				out[c++] = j;
			}
		}
		return FB_OK;
	}
	for (uint32_t d = 1; d <= g->half; d++) {
		out[c++] = g->at[(g->pos[i] + d) % g->n];
		out[c++] = g->at[(g->pos[i] + g->n - d) % g->n];
	}
	qsort(out, c, sizeof(*out), cmp_u32);
	return FB_OK;
}

/* ---- shared helpers ------------------------------------------------------ */

/* slot_of finds j among the k ascending neighbours; k if absent. */
static uint32_t
slot_of(const uint32_t *nbr, uint32_t k, uint32_t j)
{
	uint32_t lo = 0, hi = k;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (nbr[mid] < j) {
			lo = mid + 1;
		} else {
			hi = mid;
		}
	}
	return lo < k && nbr[lo] == j ? lo : k;
}

static fb_err
params_check(const fb_secagg_params *p, uint32_t *k)
{
	if (p->n < 2 || p->n > FB_SECAGG_MAX_WORKERS || p->threshold < 2) {
		return FB_EINVAL;
	}
	*k = graph_degree(p->n, p->degree, p->threshold);
	if (p->threshold > *k + 1) {
		return FB_EINVAL;
	}
	return FB_OK;
}

static void
b_commit(const fb_secagg_params *p, uint32_t index, const uint8_t b[32],
    uint8_t h[32])
{
	crypto_generichash_state st;
	uint8_t r[8];

	st32(r, p->round);
	st32(r + 4, index);
	crypto_generichash_init(&st, NULL, 0, 32);
	crypto_generichash_update(&st, commit_domain, sizeof(commit_domain) - 1);
	crypto_generichash_update(&st, p->run.b, FB_RUN_ID_LEN);
	crypto_generichash_update(&st, r, sizeof(r));
	crypto_generichash_update(&st, b, 32);
	crypto_generichash_final(&st, h, 32);
	sodium_memzero(&st, sizeof(st));
}

/* set_hash is H(U3) of a confirmation (crypto.h), flags read as 0/1. */
static void
set_hash(const fb_secagg_params *p, const uint8_t *included, uint8_t h[32])
{
	crypto_generichash_state st;
	uint8_t r[8];

	st32(r, p->round);
	st32(r + 4, p->n);
	crypto_generichash_init(&st, NULL, 0, 32);
	crypto_generichash_update(&st, set_domain, sizeof(set_domain) - 1);
	crypto_generichash_update(&st, p->run.b, FB_RUN_ID_LEN);
	crypto_generichash_update(&st, r, sizeof(r));
	for (uint32_t j = 0; j < p->n; j++) {
		uint8_t f = included[j] != 0;
		crypto_generichash_update(&st, &f, 1);
	}
	crypto_generichash_final(&st, h, 32);
}

/* confirm_make lays out and signs a confirmation of the set hashed `h`. */
static fb_err
confirm_make(const fb_secagg_params *p, uint32_t self, const uint8_t h[32],
    const fb_identity *id, uint8_t out[FB_SECAGG_CONFIRM_LEN])
{
	memset(out, 0, FB_SECAGG_CONFIRM_LEN);
	out[0] = VERSION;
	out[1] = KIND_CONFIRM;
	memcpy(out + 4, p->run.b, FB_RUN_ID_LEN);
	st32(out + 20, p->round);
	st32(out + 24, self);
	st32(out + 28, p->n);
	memcpy(out + 32, h, 32);
	return fb_identity_sign(id, "secagg-included", out, CONFIRM_SIGNED_LEN,
	    out + CONFIRM_SIGNED_LEN);
}

/*
 * confirm_parse checks a confirmation's layout, run, round and n against
 * `p` and returns its signer index; confirm_verify checks its signature by
 * `signer` and that it is over the set hashed `h`.
 */
static fb_err
confirm_parse(
    const fb_secagg_params *p, const uint8_t *m, size_t len, uint32_t *signer)
{
	*signer = 0;
	if (m == NULL || len != FB_SECAGG_CONFIRM_LEN || m[0] != VERSION ||
	    m[1] != KIND_CONFIRM || m[2] != 0 || m[3] != 0) {
		return FB_EPROTO;
	}
	if (sodium_memcmp(m + 4, p->run.b, FB_RUN_ID_LEN) != 0) {
		return FB_EAUTH;
	}
	if (ld32(m + 20) != p->round) {
		return FB_ESTALE;
	}
	*signer = ld32(m + 24);
	if (*signer >= p->n || ld32(m + 28) != p->n) {
		return FB_EPROTO;
	}
	return FB_OK;
}

static fb_err
confirm_verify(const fb_pubkey *signer, const uint8_t *m, const uint8_t h[32])
{
	if (fb_pubkey_verify(signer, "secagg-included", m, CONFIRM_SIGNED_LEN,
	        m + CONFIRM_SIGNED_LEN) != FB_OK ||
	    sodium_memcmp(m + 32, h, 32) != 0) {
		return FB_EAUTH;
	}
	return FB_OK;
}

/* ---- session keys and the verified-signature cache ------------------------ */

/* One verified session signature: tag = H(signer || signed bytes || sig);
 * x = X25519(our c_sk, its c_pk) once derived (a worker's cache). */
typedef struct seen_entry {
	uint8_t tag[32];
	uint8_t x[32];
	uint8_t used, has_x;
} seen_entry;

struct fb_secagg_keys {
	uint8_t c_sk[32], c_pk[32]; /* this party's session c key pair */
	/* the session signature of our advert, for run sig_run and sig_id */
	fb_run_id sig_run;
	fb_pubkey sig_id;
	uint8_t sig[FB_SIG_LEN];
	bool have_sig;
	seen_entry *tab; /* fb_secmem_alloc'd: it holds the agreements */
	uint32_t cap;    /* a power of two, or 0 */
	uint32_t count;
};

fb_err
fb_secagg_keys_alloc(fb_secagg_keys **out)
{
	fb_secagg_keys *k;
	fb_err rc;

	*out = NULL;
	if ((rc = fb_crypto_init()) != FB_OK) {
		return rc;
	}
	if ((k = fb_secmem_alloc(sizeof(*k))) == NULL) {
		return FB_ENOMEM;
	}
	memset(k, 0, sizeof(*k));
	crypto_box_keypair(k->c_pk, k->c_sk);
	*out = k;
	return FB_OK;
}

void
fb_secagg_keys_free(fb_secagg_keys *k)
{
	if (k == NULL) {
		return;
	}
	fb_secmem_free(k->tab); /* (wiped) */
	fb_secmem_free(k);
}

uint32_t
fb_secagg_keys_seen(const fb_secagg_keys *k)
{
	return k != NULL ? k->count : 0;
}

/* session_bytes lays out the signed part of an advert: bytes 0..20
 * (version, kind, reserved, run) and 28..60 (c_pk). */
static void
session_bytes(const uint8_t *adv, uint8_t out[SESSION_SIGNED_LEN])
{
	memcpy(out, adv, 20);
	memcpy(out + 20, adv + 28, 32);
}

static void
seen_tag(const fb_pubkey *signer, const uint8_t *adv, uint8_t tag[32])
{
	crypto_generichash_state st;
	uint8_t signed_part[SESSION_SIGNED_LEN];

	session_bytes(adv, signed_part);
	crypto_generichash_init(&st, NULL, 0, 32);
	crypto_generichash_update(&st, seen_domain, sizeof(seen_domain) - 1);
	crypto_generichash_update(&st, signer->b, FB_PUBKEY_LEN);
	crypto_generichash_update(&st, signed_part, sizeof(signed_part));
	crypto_generichash_update(&st, adv + ADV_SIG_AT, FB_SIG_LEN);
	crypto_generichash_final(&st, tag, 32);
}

/* seen_slot returns where `tag` is in tab (cap entries, a power of two
 * with a free one), or the free entry where it would go. */
static uint32_t
seen_slot(const seen_entry *tab, uint32_t cap, const uint8_t tag[32])
{
	uint32_t h = ld32(tag) & (cap - 1);

	while (tab[h].used && memcmp(tab[h].tag, tag, 32) != 0) {
		h = (h + 1) & (cap - 1);
	}
	return h;
}

/* seen_find returns the entry of `tag`, or NULL. */
static seen_entry *
seen_find(fb_secagg_keys *k, const uint8_t tag[32])
{
	uint32_t h;

	if (k == NULL || k->cap == 0) {
		return NULL;
	}
	h = seen_slot(k->tab, k->cap, tag);
	return k->tab[h].used ? &k->tab[h] : NULL;
}

/* seen_add records `tag` (not present) and returns its entry; NULL when
 * out of memory (the caller then only loses the cache). Past SEEN_MAX
 * entries the cache starts again. */
static seen_entry *
seen_add(fb_secagg_keys *k, const uint8_t tag[32])
{
	uint32_t h;

	if (k->count >= SEEN_MAX) {
		memset(k->tab, 0, (size_t)k->cap * sizeof(*k->tab));
		k->count = 0;
	}
	if (2 * (k->count + 1) > k->cap) {
		uint32_t cap = k->cap == 0 ? 64 : 2 * k->cap;
		seen_entry *tab = fb_secmem_alloc((size_t)cap * sizeof(*tab));
		if (tab == NULL) {
			return NULL;
		}
		memset(tab, 0, (size_t)cap * sizeof(*tab));
		for (uint32_t i = 0; i < k->cap; i++) {
			if (k->tab[i].used) {
				tab[seen_slot(tab, cap, k->tab[i].tag)] = k->tab[i];
			}
		}
		fb_secmem_free(k->tab);
		k->tab = tab;
		k->cap = cap;
	}
	h = seen_slot(k->tab, k->cap, tag);
	memcpy(k->tab[h].tag, tag, 32);
	k->tab[h].used = 1;
	k->tab[h].has_x = 0;
	k->count++;
	return &k->tab[h];
}

/* session_verify checks an advert's session signature by `signer`,
 * once per cache: *entry is the cache's entry (NULL without a cache). */
static fb_err
session_verify(fb_secagg_keys *k, const fb_pubkey *signer,
    const uint8_t *adv, seen_entry **entry)
{
	uint8_t tag[32], signed_part[SESSION_SIGNED_LEN];

	*entry = NULL;
	if (k != NULL) {
		seen_tag(signer, adv, tag);
		if ((*entry = seen_find(k, tag)) != NULL) {
			return FB_OK;
		}
	}
	session_bytes(adv, signed_part);
	if (fb_pubkey_verify(signer, "secagg-session", signed_part,
	        sizeof(signed_part), adv + ADV_SIG_AT) != FB_OK) {
		return FB_EAUTH;
	}
	if (k != NULL) {
		*entry = seen_add(k, tag);
	}
	return FB_OK;
}

fb_err
fb_secagg_advert_sign(const fb_identity *id, uint8_t adv[FB_SECAGG_ADV_LEN])
{
	uint8_t signed_part[SESSION_SIGNED_LEN];

	session_bytes(adv, signed_part);
	return fb_identity_sign(id, "secagg-session", signed_part,
	    sizeof(signed_part), adv + ADV_SIG_AT);
}

/*
 * adv_parse checks an advert (see crypto.h) against `p` and the signer,
 * and returns its index and keys: the session signature (through the
 * cache `seen`, which may be NULL; *entry its entry), then the round's
 * fields, which the signature does not cover. With check_order it also
 * refuses keys of small order; a worker that derives its pair keys from a
 * neighbour's advert at once skips that (the derivations refuse them).
 */
static fb_err
adv_parse(const fb_secagg_params *p, fb_secagg_keys *seen,
    const fb_pubkey *signer, const uint8_t *adv, size_t len, bool check_order,
    uint32_t *index, uint8_t c_pk[32], uint8_t s_pk[32], uint8_t commit[32],
    seen_entry **entry)
{
	fb_err rc;

	*entry = NULL;
	if (adv == NULL || len != FB_SECAGG_ADV_LEN || adv[0] != VERSION ||
	    adv[1] != KIND_ADV || adv[2] != 0 || adv[3] != 0) {
		return FB_EPROTO;
	}
	if ((rc = session_verify(seen, signer, adv, entry)) != FB_OK) {
		return rc;
	}
	if (sodium_memcmp(adv + 4, p->run.b, FB_RUN_ID_LEN) != 0) {
		return FB_EAUTH;
	}
	if (ld32(adv + 20) != p->round) {
		return FB_ESTALE;
	}
	*index = ld32(adv + 24);
	if (*index >= p->n) {
		return FB_EPROTO;
	}
	if (check_order && (fb_x25519_small_order(adv + 28) ||
	                       fb_x25519_small_order(adv + 60))) {
		return FB_EAUTH;
	}
	memcpy(c_pk, adv + 28, 32);
	memcpy(s_pk, adv + 60, 32);
	memcpy(commit, adv + 92, 32);
	return FB_OK;
}

static const uint8_t terms_domain[] = "fedbox/secagg-terms/v1";

void
fb_secagg_bind_terms(fb_secagg_params *p, const fb_secagg_terms *t)
{
	crypto_generichash_state st;
	uint8_t b[4 * 3 + 32 + 4 + 8 * 3 + 4], *q = b;
	uint64_t clip, a_bound;

	memcpy(&clip, &t->clip, 8);
	memcpy(&a_bound, &t->a_bound, 8);
	st32(q, p->n);
	st32(q + 4, p->degree);
	st32(q + 8, p->threshold);
	memcpy(q + 12, p->graph_seed, 32);
	q += 44;
	st32(q, t->ring_bits);
	st64(q + 4, clip);
	st64(q + 12, t->max_samples);
	st64(q + 20, a_bound);
	st32(q + 28, t->max_staleness);
	crypto_generichash_init(&st, NULL, 0, 32);
	crypto_generichash_update(&st, terms_domain, sizeof(terms_domain) - 1);
	crypto_generichash_update(&st, b, sizeof(b));
	crypto_generichash_final(&st, p->terms, 32);
}

/* enc_key derives the round's share-encryption key of a pair (symmetric)
 * from the pair's session agreement `shared` = X25519(c_sk, peer_pk) and
 * the round's terms (fb_secagg_bind_terms). */
static void
enc_key(const fb_secagg_params *p, const uint8_t c_pk[32],
    const uint8_t peer_pk[32], const uint8_t shared[32], uint8_t key[32])
{
	crypto_generichash_state st;
	uint8_t r[4];
	int cmp = memcmp(c_pk, peer_pk, 32);

	st32(r, p->round);
	crypto_generichash_init(&st, NULL, 0, 32);
	crypto_generichash_update(&st, enc_domain, sizeof(enc_domain) - 1);
	crypto_generichash_update(&st, cmp < 0 ? c_pk : peer_pk, 32);
	crypto_generichash_update(&st, cmp < 0 ? peer_pk : c_pk, 32);
	crypto_generichash_update(&st, p->run.b, FB_RUN_ID_LEN);
	crypto_generichash_update(&st, r, sizeof(r));
	crypto_generichash_update(&st, p->terms, 32);
	crypto_generichash_update(&st, shared, 32);
	crypto_generichash_final(&st, key, 32);
	sodium_memzero(&st, sizeof(st));
}

/* share_ad is a share message's associated data: its header, then the
 * sender's and the recipient's s_pk of the round (which the adverts carry
 * outside the session signature: the share key, from the session keys,
 * binds them to the pair). */
static void
share_ad(const uint8_t *hdr, const uint8_t from_s_pk[32],
    const uint8_t to_s_pk[32], uint8_t ad[SHARE_AD_LEN])
{
	memcpy(ad, hdr, SHARE_HDR_LEN);
	memcpy(ad + SHARE_HDR_LEN, from_s_pk, 32);
	memcpy(ad + SHARE_HDR_LEN + 32, to_s_pk, 32);
}

static void
share_nonce(uint32_t from, uint32_t to, uint8_t nonce[24])
{
	memset(nonce, 0, 24);
	st32(nonce, from);
	st32(nonce + 4, to);
}

/* share_hdr_check validates a share message header; from/to out. */
static fb_err
share_hdr_check(const fb_secagg_params *p, const uint8_t *m, size_t len,
    uint32_t *from, uint32_t *to)
{
	if (m == NULL || len != FB_SECAGG_SHARE_MSG_LEN || m[0] != VERSION ||
	    m[1] != KIND_SHARES || m[2] != 0 || m[3] != 0) {
		return FB_EPROTO;
	}
	if (sodium_memcmp(m + 4, p->run.b, FB_RUN_ID_LEN) != 0) {
		return FB_EAUTH;
	}
	if (ld32(m + 20) != p->round) {
		return FB_ESTALE;
	}
	*from = ld32(m + 24);
	*to = ld32(m + 28);
	if (*from >= p->n || *to >= p->n || *from == *to) {
		return FB_EPROTO;
	}
	return FB_OK;
}

fb_err
fb_secagg_share_msg_peek(const uint8_t *msg, size_t len, uint32_t *from,
    uint32_t *to)
{
	*from = *to = 0;
	if (msg == NULL || len != FB_SECAGG_SHARE_MSG_LEN ||
	    msg[0] != VERSION || msg[1] != KIND_SHARES) {
		return FB_EPROTO;
	}
	*from = ld32(msg + 24);
	*to = ld32(msg + 28);
	return FB_OK;
}

/* ---- worker -------------------------------------------------------------- */

typedef struct wsecret {
	uint8_t s_sk[32], s_pk[32]; /* pairwise masks: the round's */
	uint8_t b[32];              /* self-mask seed */
} wsecret;

/* What a worker knows of one neighbour (slot < k) or of itself (slot k). */
typedef struct wpeer {
	uint8_t c_pk[32], s_pk[32];
	fb_pubkey id;       /* the identity key its advert was checked with */
	uint8_t have_adv;   /* advert checked: in U1 */
	uint8_t have_share; /* its shares arrived: in U2 */
	uint8_t revealed;   /* 0, REVEAL_B or REVEAL_S */
	uint8_t confirmed;  /* it confirmed the set we signed */
	uint8_t have_key;   /* key holds the pair's share-encryption key */
	uint8_t key[32];    /* enc_key of the pair, of this round */
	uint8_t seed[32];   /* the pair's mask seed, once have_adv */
	fb_shamir_share b_share, s_share; /* the shares held for it */
} wpeer;

/* W_CONFIRMED: the included set is signed and fixed (set, set_h). */
enum { W_KEYS = 0, W_SHARED, W_MASKING, W_CONFIRMED };

struct fb_secagg_worker {
	fb_secagg_params p;
	uint32_t self, k, t;
	int stage;
	fb_secagg_graph *g;
	uint32_t *nbr;       /* k neighbours, ascending */
	wsecret *sec;        /* fb_secmem_alloc */
	fb_secagg_keys *keys; /* the session's c key pair and cache */
	bool own_keys;        /* keys made for this instance alone */
	wpeer *peers;        /* fb_secmem_alloc, k + 1 */
	fb_mask_term *terms; /* fb_secmem_alloc, k + 1 */
	uint32_t nterms;
	fb_pubkey self_id; /* our identity key (fb_secagg_worker_advertise) */
	bool have_self_id;
	uint8_t *set;      /* n flags: the included set we signed */
	uint8_t set_h[32]; /* its hash */
	uint32_t nconfirm; /* neighbours' valid confirmations of it */
};

/* peer_key returns the share-encryption key of our pair with neighbour
 * slot `slot` (derived when its advert came; wiped by mask_begin). */
static fb_err
peer_key(fb_secagg_worker *w, uint32_t slot, const uint8_t **key)
{
	*key = NULL;
	if (!w->peers[slot].have_key) {
		return FB_EPROTO;
	}
	*key = w->peers[slot].key;
	return FB_OK;
}

fb_err
fb_secagg_worker_alloc(const fb_secagg_params *p, uint32_t self,
    fb_secagg_worker **out)
{
	return fb_secagg_worker_alloc_keys(p, self, NULL, out);
}

fb_err
fb_secagg_worker_alloc_keys(const fb_secagg_params *p, uint32_t self,
    fb_secagg_keys *keys, fb_secagg_worker **out)
{
	fb_err rc = FB_OK;
	fb_secagg_worker *w = NULL;
	uint32_t k;

	*out = NULL;
	if ((rc = params_check(p, &k)) != FB_OK || self >= p->n) {
		return rc != FB_OK ? rc : FB_EINVAL;
	}
	if ((rc = fb_crypto_init()) != FB_OK) {
		return rc;
	}
	if ((w = calloc(1, sizeof(*w))) == NULL) {
		return FB_ENOMEM;
	}
	w->p = *p;
	w->self = self;
	w->t = p->threshold;
	w->keys = keys;
	if (keys == NULL) {
		if ((rc = fb_secagg_keys_alloc(&w->keys)) != FB_OK) {
			goto out;
		}
		w->own_keys = true;
	}
	if ((rc = fb_secagg_graph_alloc(p->n, p->degree, p->threshold,
	         p->graph_seed, p->round, &w->g)) != FB_OK) {
		goto out;
	}
	w->k = k = w->g->k;
	w->nbr = calloc(k + 1, sizeof(*w->nbr));
	w->sec = fb_secmem_alloc(sizeof(*w->sec));
	w->peers = fb_secmem_alloc((size_t)(k + 1) * sizeof(*w->peers));
	w->terms = fb_secmem_alloc((size_t)(k + 1) * sizeof(*w->terms));
	if (w->nbr == NULL || w->sec == NULL || w->peers == NULL ||
	    w->terms == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	memset(w->peers, 0, (size_t)(k + 1) * sizeof(*w->peers));
	memset(w->terms, 0, (size_t)(k + 1) * sizeof(*w->terms));
	if ((rc = fb_secagg_graph_neighbours(w->g, self, w->nbr)) != FB_OK) {
		goto out;
	}
	crypto_box_keypair(w->sec->s_pk, w->sec->s_sk);
	randombytes_buf(w->sec->b, sizeof(w->sec->b));
	memcpy(w->peers[k].c_pk, w->keys->c_pk, 32);
	memcpy(w->peers[k].s_pk, w->sec->s_pk, 32);
	w->peers[k].have_adv = 1;
	*out = w;
	w = NULL;
out:
	fb_secagg_worker_free(w);
	return rc;
}

void
fb_secagg_worker_free(fb_secagg_worker *w)
{
	if (w == NULL) {
		return;
	}
	fb_secagg_graph_free(w->g);
	free(w->nbr);
	free(w->set);
	fb_secmem_free(w->sec); /* (wiped) */
	fb_secmem_free(w->peers);
	fb_secmem_free(w->terms);
	if (w->own_keys) {
		fb_secagg_keys_free(w->keys);
	}
	free(w);
}

const fb_secagg_graph *
fb_secagg_worker_graph(const fb_secagg_worker *w)
{
	return w->g;
}

fb_err
fb_secagg_worker_advertise(
    fb_secagg_worker *w, const fb_identity *id, uint8_t adv[FB_SECAGG_ADV_LEN])
{
	fb_identity_pubkey(id, &w->self_id);
	w->have_self_id = true;
	fb_secagg_keys *keys = w->keys;
	fb_err rc;

	memset(adv, 0, FB_SECAGG_ADV_LEN);
	adv[0] = VERSION;
	adv[1] = KIND_ADV;
	memcpy(adv + 4, w->p.run.b, FB_RUN_ID_LEN);
	st32(adv + 20, w->p.round);
	st32(adv + 24, w->self);
	memcpy(adv + 28, keys->c_pk, 32);
	memcpy(adv + 60, w->sec->s_pk, 32);
	b_commit(&w->p, w->self, w->sec->b, adv + 92);
	/* the session part is signed once a run and identity */
	if (keys->have_sig && fb_pubkey_equal(&keys->sig_id, &w->self_id) &&
	    sodium_memcmp(keys->sig_run.b, w->p.run.b, FB_RUN_ID_LEN) == 0) {
		memcpy(adv + ADV_SIG_AT, keys->sig, FB_SIG_LEN);
		return FB_OK;
	}
	keys->have_sig = false;
	if ((rc = fb_secagg_advert_sign(id, adv)) != FB_OK) {
		return rc;
	}
	memcpy(keys->sig, adv + ADV_SIG_AT, FB_SIG_LEN);
	keys->sig_run = w->p.run;
	keys->sig_id = w->self_id;
	keys->have_sig = true;
	return FB_OK;
}

fb_err
fb_secagg_worker_add_advert(fb_secagg_worker *w, const fb_pubkey *peer_id,
    const uint8_t *adv, size_t len)
{
	fb_err rc;
	uint32_t index, slot;
	uint8_t c_pk[32], s_pk[32], commit[32], x[32];
	const uint8_t *shared;
	seen_entry *e = NULL;
	wpeer *pe;

	if ((rc = adv_parse(&w->p, w->keys, peer_id, adv, len, false, &index,
	         c_pk, s_pk, commit, &e)) != FB_OK) {
		return rc;
	}
	if (w->stage != W_KEYS) {
		return FB_ESTALE;
	}
	if (index == w->self ||
	    (slot = slot_of(w->nbr, w->k, index)) == w->k) {
		/* not a neighbour: nothing to keep, but checked all the same */
		return fb_x25519_small_order(c_pk) ||
		               fb_x25519_small_order(s_pk)
		           ? FB_EAUTH
		           : FB_OK;
	}
	if (w->peers[slot].have_adv) {
		return FB_EPROTO;
	}
	/* One identity, one slot: O(k) here, as the shares cost O(k t). */
	if (w->have_self_id && fb_pubkey_equal(peer_id, &w->self_id)) {
		return FB_EAUTH;
	}
	for (uint32_t s = 0; s < w->k; s++) {
		if (w->peers[s].have_adv &&
		    fb_pubkey_equal(peer_id, &w->peers[s].id)) {
			return FB_EAUTH;
		}
	}
	/* The pair's session agreement (once a session: the cache keeps it
	 * with the verified signature), this round's share key, and the
	 * round's mask seed: each X25519 refuses a key of small order (it
	 * comes out zero), which is the check adv_parse skipped. */
	if (memcmp(c_pk, w->keys->c_pk, 32) == 0) {
		return FB_EAUTH; /* our own session key, replayed */
	}
	if (e != NULL && e->has_x) {
		shared = e->x;
	} else {
		if (crypto_scalarmult(x, w->keys->c_sk, c_pk) != 0) {
			sodium_memzero(x, sizeof(x));
			return FB_EAUTH;
		}
		if (e != NULL) {
			memcpy(e->x, x, 32);
			e->has_x = 1;
		}
		shared = x;
	}
	pe = &w->peers[slot];
	memcpy(pe->c_pk, c_pk, 32);
	memcpy(pe->s_pk, s_pk, 32);
	enc_key(&w->p, w->keys->c_pk, c_pk, shared, pe->key);
	sodium_memzero(x, sizeof(x));
	if (fb_mask_pair_seed(w->sec->s_sk, w->sec->s_pk, s_pk, &w->p.run,
	        w->p.round, pe->seed) != FB_OK) {
		sodium_memzero(pe, sizeof(*pe));
		return FB_EAUTH;
	}
	pe->have_key = 1;
	pe->id = *peer_id;
	pe->have_adv = 1;
	return FB_OK;
}

fb_err
fb_secagg_worker_make_shares(fb_secagg_worker *w, uint8_t *out,
    size_t out_cap, size_t *out_len)
{
	fb_err rc = FB_OK;
	uint32_t m = 0, c = 0;
	uint32_t *xs = NULL, *to = NULL;
	fb_shamir_share *sh = NULL; /* b-shares then s-shares */
	uint8_t pt[SHARE_PT_LEN];   /* one plaintext, wiped below */
	uint8_t ad[SHARE_AD_LEN];

	*out_len = 0;
	if (w->stage != W_KEYS) {
		return FB_EINVAL;
	}
	for (uint32_t s = 0; s < w->k; s++) {
		m += w->peers[s].have_adv;
	}
	if (m + 1 < w->t) {
		return FB_ERANGE;
	}
	if (out_cap / FB_SECAGG_SHARE_MSG_LEN < m) {
		return FB_ERANGE;
	}
	xs = calloc(m + 1, sizeof(*xs));
	to = calloc(m + 1, sizeof(*to));
	sh = fb_secmem_alloc(2 * (size_t)(m + 1) * sizeof(*sh));
	if (xs == NULL || to == NULL || sh == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	xs[c] = w->self + 1;
	to[c++] = w->self;
	for (uint32_t s = 0; s < w->k; s++) {
		if (w->peers[s].have_adv) {
			xs[c] = w->nbr[s] + 1;
			to[c++] = s;
		}
	}
	if ((rc = fb_shamir_split(w->sec->b, w->t, xs, m + 1, sh)) != FB_OK ||
	    (rc = fb_shamir_split(w->sec->s_sk, w->t, xs, m + 1, sh + m + 1)) !=
	        FB_OK) {
		goto out;
	}
	/* Our own share: x = self + 1, kept in slot k. */
	w->peers[w->k].b_share = sh[0];
	w->peers[w->k].s_share = sh[m + 1];
	w->peers[w->k].have_share = 1;
	for (uint32_t q = 1; q <= m; q++) {
		uint8_t *msg = out + (size_t)(q - 1) * FB_SECAGG_SHARE_MSG_LEN;
		uint32_t slot = to[q], dst = w->nbr[slot];
		uint8_t nonce[24];
		const uint8_t *key = NULL;

		memset(msg, 0, SHARE_HDR_LEN);
		msg[0] = VERSION;
		msg[1] = KIND_SHARES;
		memcpy(msg + 4, w->p.run.b, FB_RUN_ID_LEN);
		st32(msg + 20, w->p.round);
		st32(msg + 24, w->self);
		st32(msg + 28, dst);
		fb_shamir_share_pack(&sh[q], pt);
		fb_shamir_share_pack(&sh[m + 1 + q], pt + FB_SHAMIR_SHARE_LEN);
		if ((rc = peer_key(w, slot, &key)) != FB_OK) {
			goto out;
		}
		share_nonce(w->self, dst, nonce);
		share_ad(msg, w->sec->s_pk, w->peers[slot].s_pk, ad);
		crypto_aead_xchacha20poly1305_ietf_encrypt(msg + SHARE_HDR_LEN,
		    NULL, pt, SHARE_PT_LEN, ad, sizeof(ad), NULL, nonce, key);
	}
	w->stage = W_SHARED;
	*out_len = (size_t)m * FB_SECAGG_SHARE_MSG_LEN;
out:
	if (rc != FB_OK && m > 0) {
		sodium_memzero(out, (size_t)m * FB_SECAGG_SHARE_MSG_LEN);
	}
	free(xs);
	free(to);
	fb_secmem_free(sh);
	sodium_memzero(pt, sizeof(pt));
	return rc;
}

fb_err
fb_secagg_worker_add_share(fb_secagg_worker *w, const uint8_t *msg,
    size_t len)
{
	fb_err rc = FB_OK;
	uint32_t from, to, slot;
	uint8_t nonce[24];
	uint8_t buf[SHARE_PT_LEN]; /* the plaintext, wiped below */
	uint8_t ad[SHARE_AD_LEN];
	const uint8_t *key = NULL;
	wpeer *pe;

	if ((rc = share_hdr_check(&w->p, msg, len, &from, &to)) != FB_OK) {
		return rc;
	}
	if (w->stage >= W_MASKING) {
		return FB_ESTALE;
	}
	if (to != w->self || (slot = slot_of(w->nbr, w->k, from)) == w->k) {
		return FB_EPROTO;
	}
	pe = &w->peers[slot];
	if (!pe->have_adv || pe->have_share) {
		return FB_EPROTO;
	}
	if ((rc = peer_key(w, slot, &key)) != FB_OK) {
		goto out;
	}
	share_nonce(from, to, nonce);
	share_ad(msg, pe->s_pk, w->sec->s_pk, ad);
	if (crypto_aead_xchacha20poly1305_ietf_decrypt(buf, NULL, NULL,
	        msg + SHARE_HDR_LEN,
	        SHARE_PT_LEN + crypto_aead_xchacha20poly1305_ietf_ABYTES, ad,
	        sizeof(ad), nonce, key) != 0) {
		rc = FB_EAUTH;
		goto out;
	}
	if ((rc = fb_shamir_share_unpack(buf, &pe->b_share)) != FB_OK ||
	    (rc = fb_shamir_share_unpack(buf + FB_SHAMIR_SHARE_LEN,
	         &pe->s_share)) != FB_OK ||
	    pe->b_share.x != w->self + 1 || pe->s_share.x != w->self + 1) {
		sodium_memzero(&pe->b_share, sizeof(pe->b_share));
		sodium_memzero(&pe->s_share, sizeof(pe->s_share));
		rc = FB_EPROTO;
		goto out;
	}
	pe->have_share = 1;
out:
	sodium_memzero(buf, sizeof(buf));
	return rc;
}

fb_err
fb_secagg_worker_mask_begin(fb_secagg_worker *w)
{
	uint32_t m = 0;

	if (w->stage != W_SHARED) {
		return FB_EINVAL;
	}
	for (uint32_t s = 0; s < w->k; s++) {
		m += w->peers[s].have_share;
	}
	if (m + 1 < w->t) {
		return FB_ERANGE;
	}
	memcpy(w->terms[0].seed, w->sec->b, 32);
	w->terms[0].role = FB_MASK_SELF;
	w->terms[0].sign = 1;
	w->nterms = 1;
	for (uint32_t s = 0; s < w->k; s++) {
		fb_mask_term *tm = &w->terms[w->nterms];
		if (!w->peers[s].have_share) {
			continue;
		}
		memcpy(tm->seed, w->peers[s].seed, sizeof(tm->seed));
		tm->role = FB_MASK_PAIR;
		tm->sign = w->self < w->nbr[s] ? 1 : -1;
		w->nterms++;
	}
	/* no share goes or comes after this: the pair keys are done, and
	 * the seeds are in the terms */
	for (uint32_t s = 0; s < w->k; s++) {
		sodium_memzero(w->peers[s].key, sizeof(w->peers[s].key));
		sodium_memzero(w->peers[s].seed, sizeof(w->peers[s].seed));
		w->peers[s].have_key = 0;
	}
	w->stage = W_MASKING;
	return FB_OK;
}

fb_err
fb_secagg_worker_mask_chunk_on(const fb_secagg_worker *w, uint32_t *v,
    uint64_t offset, uint64_t count, fb_mask_engine engine, void *ctx)
{
	fb_err rc;

	/* mask_chunk's checks (stage, range, terms) on an empty range, so
	 * that both refuse the same calls */
	if ((rc = fb_secagg_worker_mask_chunk(w, v, offset, 0)) != FB_OK) {
		return rc;
	}
	if (count > FB_MASK_MAX_ELEMS - offset) {
		return FB_ERANGE;
	}
	return engine(ctx, v, offset, count, w->terms, w->nterms, w->p.round);
}

fb_err
fb_secagg_worker_mask_chunk(const fb_secagg_worker *w, uint32_t *v,
    uint64_t offset, uint64_t count)
{
	if (w->stage < W_MASKING) {
		return FB_EINVAL;
	}
	return fb_mask_apply(v, offset, count, w->terms, w->nterms,
	    w->p.round);
}

fb_err
fb_secagg_worker_confirm(fb_secagg_worker *w, const fb_identity *id,
    const uint8_t *included, uint32_t n, uint8_t out[FB_SECAGG_CONFIRM_LEN])
{
	uint32_t inc = 0;
	uint8_t h[32];

	memset(out, 0, FB_SECAGG_CONFIRM_LEN);
	if ((w->stage != W_MASKING && w->stage != W_CONFIRMED) || n != w->p.n ||
	    included == NULL) {
		return FB_EINVAL;
	}
	for (uint32_t j = 0; j < n; j++) {
		inc += included[j] != 0;
	}
	if (!included[w->self] || inc < w->t) {
		return FB_EPROTO;
	}
	set_hash(&w->p, included, h);
	if (w->stage == W_CONFIRMED) {
		/* the same set again (a retransmission) is fine, another
		 * never: two signed sets would let the check be split */
		if (sodium_memcmp(h, w->set_h, 32) != 0) {
			return FB_EPROTO;
		}
		return confirm_make(&w->p, w->self, h, id, out);
	}
	if ((w->set = malloc(n)) == NULL) {
		return FB_ENOMEM;
	}
	for (uint32_t j = 0; j < n; j++) {
		w->set[j] = included[j] != 0;
	}
	memcpy(w->set_h, h, 32);
	w->stage = W_CONFIRMED;
	return confirm_make(&w->p, w->self, h, id, out);
}

fb_err
fb_secagg_worker_add_confirm(
    fb_secagg_worker *w, const uint8_t *msg, size_t len)
{
	uint32_t signer, slot;
	fb_err rc;

	if ((rc = confirm_parse(&w->p, msg, len, &signer)) != FB_OK) {
		return rc;
	}
	if (w->stage != W_CONFIRMED) {
		return FB_EINVAL;
	}
	if (signer == w->self ||
	    (slot = slot_of(w->nbr, w->k, signer)) == w->k ||
	    !w->peers[slot].have_adv || !w->set[signer] ||
	    w->peers[slot].confirmed) {
		return FB_EPROTO;
	}
	if ((rc = confirm_verify(&w->peers[slot].id, msg, w->set_h)) != FB_OK) {
		return rc;
	}
	w->peers[slot].confirmed = 1;
	w->nconfirm++;
	return FB_OK;
}

uint32_t
fb_secagg_worker_confirmations(const fb_secagg_worker *w)
{
	return w->stage == W_CONFIRMED ? 1 + w->nconfirm : 0;
}

fb_err
fb_secagg_worker_reveal(
    fb_secagg_worker *w, uint8_t *out, size_t out_cap, size_t *out_len)
{
	uint32_t entries = 0;
	const uint8_t *included = w->set;
	size_t need;
	uint8_t *e;

	*out_len = 0;
	if (w->stage != W_CONFIRMED) {
		return FB_EINVAL;
	}
	if (1 + w->nconfirm < w->t) {
		return FB_ERANGE;
	}
	/* First pass: refuse the whole request if any owner would get the
	 * other kind of share revealed than before. */
	for (uint32_t s = 0; s <= w->k; s++) {
		uint32_t owner = s == w->k ? w->self : w->nbr[s];
		uint8_t want = included[owner] ? REVEAL_B : REVEAL_S;
		if (!w->peers[s].have_share) {
			continue;
		}
		if (w->peers[s].revealed != 0 && w->peers[s].revealed != want) {
			return FB_EPROTO;
		}
		entries++;
	}
	need = FB_SECAGG_REVEAL_HEADER_LEN +
	       (size_t)entries * FB_SECAGG_REVEAL_ENTRY_LEN;
	if (out_cap < need) {
		return FB_ERANGE;
	}
	memset(out, 0, need);
	out[0] = VERSION;
	out[1] = KIND_REVEAL;
	memcpy(out + 4, w->p.run.b, FB_RUN_ID_LEN);
	st32(out + 20, w->p.round);
	st32(out + 24, w->self);
	st32(out + 28, entries);
	e = out + FB_SECAGG_REVEAL_HEADER_LEN;
	for (uint32_t s = 0; s <= w->k; s++) {
		uint32_t owner = s == w->k ? w->self : w->nbr[s];
		uint8_t want = included[owner] ? REVEAL_B : REVEAL_S;
		if (!w->peers[s].have_share) {
			continue;
		}
		st32(e, owner);
		e[4] = want;
		fb_shamir_share_pack(want == REVEAL_B ? &w->peers[s].b_share
		                                      : &w->peers[s].s_share,
		    e + 8);
		w->peers[s].revealed = want;
		e += FB_SECAGG_REVEAL_ENTRY_LEN;
	}
	*out_len = need;
	return FB_OK;
}

/* ---- server -------------------------------------------------------------- */

typedef struct sworker {
	uint8_t c_pk[32], s_pk[32], commit[32];
	fb_pubkey id; /* the identity key its advert was checked with */
	uint8_t in_u1, in_u2, in_u3, in_u4, revealed;
	uint32_t nshares; /* shares of this owner collected */
} sworker;

struct fb_secagg_server {
	fb_secagg_params p;
	uint32_t k, t;
	int confirming, revealing, finished;
	uint8_t set_h[32]; /* H(U3), fixed by the first confirmation */
	fb_secagg_graph *g;
	sworker *w;              /* n */
	uint32_t *keytab;        /* open addressing: slot + 1 by identity key */
	uint32_t keycap;         /* a power of two >= 2 n */
	uint32_t *nbr;           /* scratch: k neighbours */
	uint8_t *mark;           /* scratch: n flags */
	fb_shamir_share *shares; /* fb_secmem_alloc, n * (k + 1) */
	fb_mask_term *terms;     /* fb_secmem_alloc, nterms */
	uint64_t nterms;
	fb_secagg_keys *seen; /* the caller's, or NULL: no cache */
};

fb_err
fb_secagg_server_alloc(const fb_secagg_params *p, fb_secagg_server **out)
{
	return fb_secagg_server_alloc_keys(p, NULL, out);
}

fb_err
fb_secagg_server_alloc_keys(const fb_secagg_params *p, fb_secagg_keys *seen,
    fb_secagg_server **out)
{
	fb_err rc = FB_OK;
	fb_secagg_server *s = NULL;
	uint32_t k;
	size_t nsh;

	*out = NULL;
	if ((rc = params_check(p, &k)) != FB_OK) {
		return rc;
	}
	if ((rc = fb_crypto_init()) != FB_OK) {
		return rc;
	}
	if ((s = calloc(1, sizeof(*s))) == NULL) {
		return FB_ENOMEM;
	}
	s->p = *p;
	s->t = p->threshold;
	s->seen = seen;
	if ((rc = fb_secagg_graph_alloc(p->n, p->degree, p->threshold,
	         p->graph_seed, p->round, &s->g)) != FB_OK) {
		goto out;
	}
	s->k = s->g->k;
	nsh = (size_t)p->n * (s->k + 1);
	for (s->keycap = 4; s->keycap < 2 * p->n; s->keycap *= 2) {
	}
	s->w = calloc(p->n, sizeof(*s->w));
	s->nbr = calloc(s->k + 1, sizeof(*s->nbr));
	s->mark = calloc(p->n, 1);
	s->keytab = calloc(s->keycap, sizeof(*s->keytab));
	s->shares = fb_secmem_alloc(nsh * sizeof(*s->shares));
	if (s->w == NULL || s->nbr == NULL || s->mark == NULL ||
	    s->keytab == NULL || s->shares == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	*out = s;
	s = NULL;
out:
	fb_secagg_server_free(s);
	return rc;
}

void
fb_secagg_server_free(fb_secagg_server *s)
{
	if (s == NULL) {
		return;
	}
	fb_secagg_graph_free(s->g);
	free(s->w);
	free(s->nbr);
	free(s->mark);
	free(s->keytab);
	fb_secmem_free(s->shares);
	fb_secmem_free(s->terms);
	free(s);
}

const fb_secagg_graph *
fb_secagg_server_graph(const fb_secagg_server *s)
{
	return s->g;
}

/*
 * key_claim records that identity key `id` signs for slot `index`, or
 * refuses it (FB_EAUTH) when it already signed for another: one
 * identity, one slot. A hash table on the key's first bytes (allowlisted
 * Ed25519 keys), so that a round of n adverts costs O(n).
 */
static fb_err
key_claim(fb_secagg_server *s, const fb_pubkey *id, uint32_t index)
{
	uint32_t mask = s->keycap - 1;
	uint32_t h = ld32(id->b) & mask;

	while (s->keytab[h] != 0) {
		if (fb_pubkey_equal(&s->w[s->keytab[h] - 1].id, id)) {
			return FB_EAUTH;
		}
		h = (h + 1) & mask;
	}
	s->keytab[h] = index + 1;
	return FB_OK;
}

fb_err
fb_secagg_server_add_advert(fb_secagg_server *s, uint32_t index,
    const fb_pubkey *peer_id, const uint8_t *adv, size_t len)
{
	fb_err rc;
	uint32_t got;
	uint8_t c_pk[32], s_pk[32], commit[32];
	seen_entry *e;
	sworker *w;

	if (index >= s->p.n) {
		return FB_EINVAL;
	}
	w = &s->w[index];
	if ((rc = adv_parse(&s->p, s->seen, peer_id, adv, len, true, &got,
	         c_pk, s_pk, commit, &e)) != FB_OK) {
		return rc;
	}
	if (got != index || w->in_u1 || s->revealing || s->confirming) {
		return FB_EPROTO;
	}
	if ((rc = key_claim(s, peer_id, index)) != FB_OK) {
		return rc;
	}
	w->id = *peer_id;
	memcpy(w->c_pk, c_pk, 32);
	memcpy(w->s_pk, s_pk, 32);
	memcpy(w->commit, commit, 32);
	w->in_u1 = 1;
	return FB_OK;
}

fb_err
fb_secagg_server_add_shares(fb_secagg_server *s, uint32_t index,
    const uint8_t *msgs, size_t len)
{
	fb_err rc;
	uint32_t m = 0;
	const uint8_t *msg = msgs;

	if (index >= s->p.n || !s->w[index].in_u1 || s->w[index].in_u2 ||
	    s->revealing || s->confirming) {
		return FB_EPROTO;
	}
	if ((rc = fb_secagg_graph_neighbours(s->g, index, s->nbr)) != FB_OK) {
		return rc;
	}
	for (uint32_t q = 0; q < s->k; q++) {
		m += s->w[s->nbr[q]].in_u1;
	}
	if (len != (size_t)m * FB_SECAGG_SHARE_MSG_LEN || m + 1 < s->t) {
		return FB_EPROTO;
	}
	for (uint32_t q = 0; q < s->k; q++) {
		uint32_t from, to;
		if (!s->w[s->nbr[q]].in_u1) {
			continue;
		}
		if ((rc = share_hdr_check(&s->p, msg, FB_SECAGG_SHARE_MSG_LEN,
		         &from, &to)) != FB_OK) {
			return rc;
		}
		if (from != index || to != s->nbr[q]) {
			return FB_EPROTO;
		}
		msg += FB_SECAGG_SHARE_MSG_LEN;
	}
	s->w[index].in_u2 = 1;
	return FB_OK;
}

fb_err
fb_secagg_server_set_included(fb_secagg_server *s, uint32_t index)
{
	if (index >= s->p.n || !s->w[index].in_u2 || s->w[index].in_u3 ||
	    s->revealing || s->confirming) {
		return FB_EINVAL;
	}
	s->w[index].in_u3 = 1;
	return FB_OK;
}

fb_err
fb_secagg_server_clear_included(fb_secagg_server *s)
{
	if (s->revealing || s->confirming) {
		return FB_EINVAL;
	}
	for (uint32_t j = 0; j < s->p.n; j++) {
		s->w[j].in_u3 = 0;
	}
	return FB_OK;
}

void
fb_secagg_server_included(const fb_secagg_server *s, uint8_t *included)
{
	for (uint32_t j = 0; j < s->p.n; j++) {
		included[j] = s->w[j].in_u3;
	}
}

fb_err
fb_secagg_server_add_confirm(
    fb_secagg_server *s, uint32_t from, const uint8_t *msg, size_t len)
{
	uint32_t signer;
	fb_err rc;

	if (from >= s->p.n || !s->w[from].in_u3 || s->w[from].in_u4 ||
	    s->revealing || s->finished) {
		return FB_EPROTO;
	}
	if ((rc = confirm_parse(&s->p, msg, len, &signer)) != FB_OK) {
		return rc;
	}
	if (signer != from) {
		return FB_EPROTO;
	}
	if (!s->confirming) {
		uint8_t *inc = malloc(s->p.n);
		if (inc == NULL) {
			return FB_ENOMEM;
		}
		fb_secagg_server_included(s, inc);
		set_hash(&s->p, inc, s->set_h);
		free(inc);
		s->confirming = 1;
	}
	if ((rc = confirm_verify(&s->w[from].id, msg, s->set_h)) != FB_OK) {
		return rc;
	}
	s->w[from].in_u4 = 1;
	return FB_OK;
}

/* holds says whether `from` holds shares of `owner` (both in U2). */
static int
holds(const fb_secagg_server *s, uint32_t from, uint32_t owner)
{
	return s->w[owner].in_u2 &&
	       (owner == from || fb_secagg_graph_adjacent(s->g, from, owner));
}

fb_err
fb_secagg_server_add_reveal(fb_secagg_server *s, uint32_t from,
    const uint8_t *msg, size_t len)
{
	fb_err rc = FB_OK;
	uint32_t count, expect = 1;
	const uint8_t *e;
	fb_shamir_share sh;

	if (from >= s->p.n || !s->w[from].in_u3 || !s->w[from].in_u4 ||
	    s->w[from].revealed || s->finished) {
		return FB_EPROTO;
	}
	if (msg == NULL || len < FB_SECAGG_REVEAL_HEADER_LEN ||
	    msg[0] != VERSION || msg[1] != KIND_REVEAL || msg[2] != 0 ||
	    msg[3] != 0) {
		return FB_EPROTO;
	}
	if (sodium_memcmp(msg + 4, s->p.run.b, FB_RUN_ID_LEN) != 0) {
		return FB_EAUTH;
	}
	if (ld32(msg + 20) != s->p.round) {
		return FB_ESTALE;
	}
	count = ld32(msg + 28);
	if (ld32(msg + 24) != from || count > s->k + 1 ||
	    len != FB_SECAGG_REVEAL_HEADER_LEN +
	               (size_t)count * FB_SECAGG_REVEAL_ENTRY_LEN) {
		return FB_EPROTO;
	}
	if ((rc = fb_secagg_graph_neighbours(s->g, from, s->nbr)) != FB_OK) {
		return rc;
	}
	for (uint32_t q = 0; q < s->k; q++) {
		expect += s->w[s->nbr[q]].in_u2;
	}
	if (count != expect) {
		return FB_EPROTO;
	}
	/* Check every entry before keeping any. */
	memset(s->mark, 0, s->p.n);
	e = msg + FB_SECAGG_REVEAL_HEADER_LEN;
	for (uint32_t q = 0; q < count; q++, e += FB_SECAGG_REVEAL_ENTRY_LEN) {
		uint32_t owner = ld32(e);
		uint8_t want;
		if (owner >= s->p.n || s->mark[owner] || !holds(s, from, owner)) {
			rc = FB_EPROTO;
			goto out;
		}
		want = s->w[owner].in_u3 ? REVEAL_B : REVEAL_S;
		if (e[4] != want || e[5] != 0 || e[6] != 0 || e[7] != 0 ||
		    fb_shamir_share_unpack(e + 8, &sh) != FB_OK ||
		    sh.x != from + 1) {
			rc = FB_EPROTO;
			goto out;
		}
		s->mark[owner] = 1;
	}
	e = msg + FB_SECAGG_REVEAL_HEADER_LEN;
	for (uint32_t q = 0; q < count; q++, e += FB_SECAGG_REVEAL_ENTRY_LEN) {
		uint32_t owner = ld32(e);
		sworker *o = &s->w[owner];
		if (fb_shamir_share_unpack(e + 8, &s->shares[(size_t)owner *
		                                       (s->k + 1) + o->nshares]) ==
		    FB_OK) {
			o->nshares++; /* always: checked above */
		}
	}
	s->w[from].revealed = 1;
	s->revealing = 1;
out:
	sodium_memzero(&sh, sizeof(sh));
	return rc;
}

fb_err
fb_secagg_server_finish(fb_secagg_server *s)
{
	fb_err rc = FB_OK;
	uint32_t n = s->p.n, inc = 0;
	uint64_t nterms = 0;
	uint8_t *sec = NULL; /* secret || check */

	if (s->finished || s->terms != NULL) {
		return FB_EINVAL;
	}
	/* Count the terms: one per survivor, one per (survivor, dropped
	 * neighbour in U2) pair. */
	for (uint32_t j = 0; j < n; j++) {
		inc += s->w[j].in_u3;
	}
	if (inc < s->t) {
		return FB_ERANGE;
	}
	for (uint32_t j = 0; j < n; j++) {
		if (s->w[j].in_u3) {
			nterms++;
		} else if (s->w[j].in_u2) {
			if ((rc = fb_secagg_graph_neighbours(s->g, j, s->nbr)) !=
			    FB_OK) {
				return rc;
			}
			for (uint32_t q = 0; q < s->k; q++) {
				nterms += s->w[s->nbr[q]].in_u3;
			}
		}
	}
	s->terms = fb_secmem_alloc((size_t)(nterms + 1) * sizeof(*s->terms));
	sec = fb_secmem_alloc(64);
	if (s->terms == NULL || sec == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	s->nterms = 0;
	for (uint32_t j = 0; j < n; j++) {
		sworker *o = &s->w[j];
		const fb_shamir_share *sh =
		    &s->shares[(size_t)j * (s->k + 1)];
		uint32_t ninc = 0;
		if (!o->in_u2) {
			continue;
		}
		if (!o->in_u3) {
			if ((rc = fb_secagg_graph_neighbours(s->g, j, s->nbr)) !=
			    FB_OK) {
				goto out;
			}
			for (uint32_t q = 0; q < s->k; q++) {
				ninc += s->w[s->nbr[q]].in_u3;
			}
			if (ninc == 0) {
				continue; /* its masks are in nobody's input */
			}
		}
		if ((rc = fb_shamir_combine(sh, o->nshares, s->t, n, sec)) !=
		    FB_OK) {
			goto out;
		}
		if (o->in_u3) {
			fb_mask_term *tm = &s->terms[s->nterms++];
			b_commit(&s->p, j, sec, sec + 32);
			if (sodium_memcmp(sec + 32, o->commit, 32) != 0) {
				rc = FB_EAUTH;
				goto out;
			}
			memcpy(tm->seed, sec, 32);
			tm->role = FB_MASK_SELF;
			tm->sign = -1;
			continue;
		}
		/* Dropped: s_sk_j recovers the masks its neighbours added. */
		crypto_scalarmult_base(sec + 32, sec);
		if (sodium_memcmp(sec + 32, o->s_pk, 32) != 0) {
			rc = FB_EAUTH;
			goto out;
		}
		for (uint32_t q = 0; q < s->k; q++) {
			uint32_t i = s->nbr[q];
			fb_mask_term *tm;
			if (!s->w[i].in_u3) {
				continue;
			}
			tm = &s->terms[s->nterms];
			if ((rc = fb_mask_pair_seed(sec, o->s_pk, s->w[i].s_pk,
			         &s->p.run, s->p.round, tm->seed)) != FB_OK) {
				goto out;
			}
			tm->role = FB_MASK_PAIR;
			/* i added sigma_ij = +1 iff i < j; take it back. */
			tm->sign = i < j ? -1 : 1;
			s->nterms++;
		}
	}
	s->finished = 1;
out:
	if (rc != FB_OK) {
		fb_secmem_free(s->terms);
		s->terms = NULL;
		s->nterms = 0;
	}
	fb_secmem_free(sec);
	return rc;
}

uint64_t
fb_secagg_server_correction_terms(const fb_secagg_server *s)
{
	return s->nterms;
}

fb_err
fb_secagg_server_unmask_chunk(const fb_secagg_server *s, uint32_t *sum,
    uint64_t offset, uint64_t count)
{
	fb_err rc = FB_OK;
	uint64_t done = 0;

	if (!s->finished) {
		return FB_EINVAL;
	}
	/* fb_mask_apply takes up to 2^32 - 1 terms at once. */
	while (done < s->nterms && rc == FB_OK) {
		uint64_t part = s->nterms - done;
		if (part > UINT32_MAX) {
			part = UINT32_MAX;
		}
		rc = fb_mask_apply(sum, offset, count, s->terms + done,
		    (uint32_t)part, s->p.round);
		done += part;
	}
	return rc;
}

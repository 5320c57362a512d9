/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_common.h -- shared fixture of the crypto/ fuzz targets and of the
 * seed-corpus generator: a deterministic libsodium RNG (so the handshake
 * state and streams the generator writes are the ones the targets check),
 * fixed identities, run id, session keys and stream key.
 *
 * Static functions only: each target and the generator include it once.
 */
#ifndef FB_TESTS_FUZZ_COMMON_H
#define FB_TESTS_FUZZ_COMMON_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crypto/crypto.h"
#include "crypto/crypto_impl.h"

#define FZ_PROTO 3
#define FZ_WORKER_ID 0u /* index of the worker in the allowlist */
#define FZ_ROUND 1u
#define FZ_CHUNK 64      /* stream chunk length of the seeds */
#define FZ_MAX_CHUNK 256 /* what the stream target accepts */
#define FZ_NOW_MS 1000000 /* the coordinator's clock for cookies */
#define FZ_COOKIE_MS 30000

/* ---- deterministic RNG (splitmix64), installed before sodium_init ---- */

static uint64_t fz_rng_state;

static uint32_t
fz_random(void)
{
	uint64_t z = (fz_rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return (uint32_t)(z ^ (z >> 31));
}

static void
fz_buf(void *const buf, const size_t size)
{
	uint8_t *p = buf;
	for (size_t i = 0; i < size; i++) {
		p[i] = (uint8_t)fz_random();
	}
}

static const char *
fz_name(void)
{
	return "fedbox-fuzz-deterministic";
}

static void
fz_stir(void)
{
}

static uint32_t
fz_uniform(const uint32_t upper)
{
	return upper < 2 ? 0 : fz_random() % upper;
}

static int
fz_close(void)
{
	return 0;
}

static randombytes_implementation fz_rng = {
    .implementation_name = fz_name,
    .random = fz_random,
    .stir = fz_stir,
    .uniform = fz_uniform,
    .buf = fz_buf,
    .close = fz_close,
};

/* ---- the fixture ---- */

typedef struct fz_fixture {
	fb_identity *coord;
	fb_identity *worker;
	fb_pubkey coord_pk;
	fb_pubkey worker_pk;
	fb_allowlist allow;
	fb_run_id run;
	uint8_t cookie_key[FB_HS_COOKIE_KEY_LEN];
	uint8_t cookie[FB_HS_COOKIE_LEN]; /* issued at FZ_NOW_MS */
	fb_handshake *hs; /* the worker's handshake, hello in `hello` */
	uint8_t hello[FB_HS_HELLO_LEN];
	fb_session *coord_s;  /* coordinator side, fixed keys */
	fb_session *worker_s; /* worker side, the same keys mirrored */
	uint8_t stream_key[FB_STREAM_KEY_LEN];
	fb_stream_ctx ctx; /* worker update stream of round FZ_ROUND */
} fz_fixture;

static fz_fixture fz;

static void
fz_die(const char *what)
{
	(void)what;
	abort();
}

/* fz_setup builds the fixture once, always the same way. */
static const fz_fixture *
fz_setup(void)
{
	static int done;
	uint8_t seed[32], k1[32], k2[32], th[32];

	if (done) {
		return &fz;
	}
	done = 1;
	if (randombytes_set_implementation(&fz_rng) != 0 ||
	    fb_crypto_init() != FB_OK) {
		fz_die("sodium");
	}
	fz_rng_state = 42;
	memset(seed, 0xc0, sizeof(seed));
	if (fb_identity_alloc_from_seed(seed, "coord", &fz.coord) != FB_OK) {
		fz_die("coord");
	}
	memset(seed, 0x77, sizeof(seed));
	if (fb_identity_alloc_from_seed(seed, "w0", &fz.worker) != FB_OK) {
		fz_die("worker");
	}
	fb_identity_pubkey(fz.coord, &fz.coord_pk);
	fb_identity_pubkey(fz.worker, &fz.worker_pk);
	fz.allow.keys = &fz.worker_pk;
	fz.allow.count = 1;
	memset(fz.run.b, 0x5a, sizeof(fz.run.b));
	memset(fz.cookie_key, 0x66, sizeof(fz.cookie_key));
	fb_hs_cookie_make(fz.cookie_key, FZ_NOW_MS, fz.cookie);
	if (fb_handshake_start(fz.worker, &fz.coord_pk, FZ_PROTO, fz.cookie,
	        fz.hello, &fz.hs) != FB_OK) {
		fz_die("hello");
	}
	memset(k1, 0x11, sizeof(k1));
	memset(k2, 0x22, sizeof(k2));
	memset(th, 0x33, sizeof(th));
	if (fb_session_alloc_keys(k2, k1, th, &fz.run, &fz.worker_pk,
	        FB_SENDER_COORDINATOR, FZ_WORKER_ID, &fz.coord_s) != FB_OK ||
	    fb_session_alloc_keys(k1, k2, th, &fz.run, &fz.coord_pk,
	        FZ_WORKER_ID, FB_SENDER_COORDINATOR, &fz.worker_s) != FB_OK) {
		fz_die("session");
	}
	memset(fz.stream_key, 0x44, sizeof(fz.stream_key));
	fz.ctx.run = fz.run;
	fz.ctx.round = FZ_ROUND;
	fz.ctx.sender = FZ_WORKER_ID;
	return &fz;
}

static fb_hs_accept_cfg
fz_accept_cfg(void)
{
	fb_hs_accept_cfg cfg = {
	    .self = fz.coord,
	    .run = fz.run,
	    .proto_version = FZ_PROTO,
	    .lookup = fb_allowlist_lookup_cb,
	    .lookup_arg = &fz.allow,
	    .cookie_key = fz.cookie_key,
	    .now_ms = FZ_NOW_MS,
	    .cookie_ms = FZ_COOKIE_MS,
	};
	return cfg;
}

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * crypto_raw.c -- the ceiling for fedbox's encrypted payloads: raw
 * libsodium crypto_secretstream_xchacha20poly1305 push and pull throughput
 * over fixed-size chunks, the BLAKE2b pass fedbox adds per stream (its
 * signed digest), and Ed25519 sign/verify rates. One thread, in place.
 * Then the passes fedbox's chunks and masks take (crypto/bulk.c), on
 * libsodium and on libcrypto in the same run: a chunk's
 * XChaCha20-Poly1305-IETF seal and open, the ChaCha20 keystream of a
 * mask, and a FULL chunk's hash (BLAKE2b-256 before protocol 7, SHA-256
 * since). Prints a table.
 *
 *   build/bench/crypto_raw [--size MiB] [--chunk KiB] [--reps N]
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "common/util.h"
#include "crypto/crypto_impl.h"

typedef struct bench_cfg {
	size_t total; /* bytes of plaintext per pass */
	size_t chunk; /* bytes of plaintext per chunk */
	int reps;     /* passes; the best is reported */
} bench_cfg;

typedef struct stream_times {
	double push, pull, hash; /* seconds for one pass, best of reps */
} stream_times;

static double
min_d(double a, double b)
{
	return a < b ? a : b;
}

/*
 * time_stream pushes `total` bytes chunk by chunk into `ct` (all the
 * ciphertext, as a sender would hold it for sending), then pulls it back in
 * place, then hashes the ciphertext; each timed separately.
 */
static int
time_stream(const bench_cfg *cfg, uint8_t *pt, uint8_t *ct, size_t nchunks,
    stream_times *t)
{
	crypto_secretstream_xchacha20poly1305_state st;
	uint8_t key[crypto_secretstream_xchacha20poly1305_KEYBYTES];
	uint8_t hdr[crypto_secretstream_xchacha20poly1305_HEADERBYTES];
	size_t cstride =
	    cfg->chunk + crypto_secretstream_xchacha20poly1305_ABYTES;
	double t0;

	crypto_secretstream_xchacha20poly1305_keygen(key);
	t0 = fb_now_s();
	crypto_secretstream_xchacha20poly1305_init_push(&st, hdr, key);
	for (size_t i = 0; i < nchunks; i++) {
		uint8_t tag =
		    i + 1 == nchunks
		        ? crypto_secretstream_xchacha20poly1305_TAG_FINAL
		        : 0;
		crypto_secretstream_xchacha20poly1305_push(&st,
		    ct + i * cstride, NULL, pt + i * cfg->chunk, cfg->chunk,
		    NULL, 0, tag);
	}
	t->push = min_d(t->push, fb_now_s() - t0);

	t0 = fb_now_s();
	{
		crypto_generichash_state h;
		uint8_t d[32];
		crypto_generichash_init(&h, NULL, 0, 32);
		for (size_t i = 0; i < nchunks; i++) {
			crypto_generichash_update(
			    &h, ct + i * cstride, cstride);
		}
		crypto_generichash_final(&h, d, sizeof(d));
	}
	t->hash = min_d(t->hash, fb_now_s() - t0);

	t0 = fb_now_s();
	if (crypto_secretstream_xchacha20poly1305_init_pull(&st, hdr, key) !=
	    0) {
		return -1;
	}
	for (size_t i = 0; i < nchunks; i++) {
		uint8_t *c = ct + i * cstride;
		unsigned char tag;
		if (crypto_secretstream_xchacha20poly1305_pull(
		        &st, c + 1, NULL, &tag, c, cstride, NULL, 0) != 0) {
			return -1;
		}
	}
	t->pull = min_d(t->pull, fb_now_s() - t0);
	sodium_memzero(key, sizeof(key));
	return 0;
}

static void
row(const char *what, double bytes, double secs)
{
	printf("%-40s %10.3f GB/s %10.1f ms\n", what, bytes / secs / 1e9,
	    secs * 1e3);
}

/*
 * One pass of chunk seals, opens (in place) and keystreams over `pt`, on
 * libsodium (lib 0) or through bulk.c (lib 1), and a FULL chunk's hash
 * (libsodium's BLAKE2b-256, which it was, or bulk.c's SHA-256), and a
 * chunk's Poly1305 MAC (checked before a split open): seconds in t[5].
 */
static int
time_chacha(const bench_cfg *cfg, uint8_t *pt, uint8_t *ct, size_t nchunks,
    int lib, double t[5])
{
	static const uint8_t ad[29];
	uint8_t key[32], npub[24], mac[16];
	double t0;
	int bad = 0;

	randombytes_buf(key, sizeof(key));
	randombytes_buf(npub, sizeof(npub));
	t0 = fb_now_s();
	for (size_t i = 0; i < nchunks; i++) {
		uint8_t *p = pt + i * cfg->chunk;
		if (lib) {
			fb_xchacha_seal(p, mac, p, cfg->chunk, ad, sizeof(ad),
			    npub, key);
		} else {
			crypto_aead_xchacha20poly1305_ietf_encrypt_detached(p,
			    mac, NULL, p, cfg->chunk, ad, sizeof(ad), NULL,
			    npub, key);
		}
	}
	t[0] = min_d(t[0], fb_now_s() - t0);
	/* the opens: one sealed chunk (in ct), opened into every chunk of pt
	 * in turn (the same work per byte as opening each) */
	fb_xchacha_seal(ct, mac, pt, cfg->chunk, ad, sizeof(ad), npub, key);
	t0 = fb_now_s();
	for (size_t i = 0; i < nchunks; i++) {
		uint8_t *p = pt + i * cfg->chunk;
		if (lib) {
			bad |= fb_xchacha_open(p, ct, cfg->chunk, mac, ad,
			    sizeof(ad), npub, key);
		} else {
			bad |= crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
			    p, NULL, ct, cfg->chunk, mac, ad, sizeof(ad), npub,
			    key);
		}
	}
	t[1] = min_d(t[1], fb_now_s() - t0);
	t0 = fb_now_s();
	for (size_t i = 0; i < nchunks; i++) {
		uint8_t *p = pt + i * cfg->chunk;
		if (lib) {
			fb_chacha20_xor_ic(p, p, cfg->chunk, npub, 0, key);
		} else {
			crypto_stream_chacha20_ietf_xor_ic(p, p, cfg->chunk,
			    npub, 0, key);
		}
	}
	t[2] = min_d(t[2], fb_now_s() - t0);
	t0 = fb_now_s();
	for (size_t i = 0; i < nchunks; i++) {
		uint8_t *p = pt + i * cfg->chunk, l[8] = {0};
		if (lib) {
			fb_sha256_2(key, l, sizeof(l), p, cfg->chunk);
		} else {
			crypto_generichash_state h;
			crypto_generichash_init(&h, NULL, 0, 32);
			crypto_generichash_update(&h, l, sizeof(l));
			crypto_generichash_update(&h, p, cfg->chunk);
			crypto_generichash_final(&h, key, 32);
		}
	}
	t[3] = min_d(t[3], fb_now_s() - t0);
	t0 = fb_now_s();
	for (size_t i = 0; i < nchunks; i++) {
		uint8_t *p = pt + i * cfg->chunk;
		if (lib) {
			fb_poly poly;
			fb_poly_init(&poly, key, cfg->chunk);
			fb_poly_update(&poly, p, cfg->chunk);
			fb_poly_final(&poly, mac);
		} else {
			crypto_onetimeauth_poly1305(mac, p, cfg->chunk, key);
		}
	}
	t[4] = min_d(t[4], fb_now_s() - t0);
	return bad;
}

static void
bench_ed25519(void)
{
	uint8_t pk[32], sk[64], sig[64], msg[140];
	const int n = 20000;
	double t0, ts, tv;
	int bad = 0;

	crypto_sign_keypair(pk, sk);
	randombytes_buf(msg, sizeof(msg));
	t0 = fb_now_s();
	for (int i = 0; i < n; i++) {
		msg[0] = (uint8_t)i;
		crypto_sign_detached(sig, NULL, msg, sizeof(msg), sk);
	}
	ts = fb_now_s() - t0;
	t0 = fb_now_s();
	for (int i = 0; i < n; i++) {
		bad |= crypto_sign_verify_detached(sig, msg, sizeof(msg), pk);
	}
	tv = fb_now_s() - t0;
	printf("%-40s %10.0f /s   %8.1f us\n", "Ed25519 sign (140 B)", n / ts,
	    ts / n * 1e6);
	printf("%-40s %10.0f /s   %8.1f us%s\n", "Ed25519 verify (140 B)",
	    n / tv, tv / n * 1e6, bad ? "  (VERIFY FAILED)" : "");
	sodium_memzero(sk, sizeof(sk));
}

int
main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"size", required_argument, NULL, 's'},
	    {"chunk", required_argument, NULL, 'c'},
	    {"reps", required_argument, NULL, 'r'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	bench_cfg cfg = {.total = 1024u << 20, .chunk = 1u << 20, .reps = 3};
	stream_times t = {1e30, 1e30, 1e30};
	uint8_t *pt = NULL, *ct = NULL;
	size_t nchunks, cstride;
	double bytes;
	int c, rc = 1;

	while ((c = getopt_long(argc, argv, "s:c:r:h", opts, NULL)) != -1) {
		switch (c) {
		case 's':
			cfg.total = (size_t)strtoull(optarg, NULL, 10) << 20;
			break;
		case 'c':
			cfg.chunk = (size_t)strtoull(optarg, NULL, 10) << 10;
			break;
		case 'r':
			cfg.reps = atoi(optarg);
			break;
		case 'h':
			printf("usage: crypto_raw [--size MiB] [--chunk KiB] "
			       "[--reps N]\n");
			return 0;
		default:
			return 2;
		}
	}
	if (cfg.chunk == 0 || cfg.total < cfg.chunk || cfg.reps < 1) {
		fprintf(
		    stderr, "crypto_raw: need 0 < chunk <= size, reps >= 1\n");
		return 2;
	}
	if (sodium_init() < 0) {
		fprintf(stderr, "crypto_raw: libsodium init failed\n");
		return 1;
	}
	nchunks = cfg.total / cfg.chunk;
	cstride = cfg.chunk + crypto_secretstream_xchacha20poly1305_ABYTES;
	pt = fb_alloc(nchunks * cfg.chunk);
	ct = fb_alloc(nchunks * cstride);
	if (pt == NULL || ct == NULL) {
		fprintf(stderr, "crypto_raw: out of memory\n");
		goto out;
	}
	randombytes_buf(pt, nchunks * cfg.chunk);
	memset(ct, 0, nchunks * cstride);
	for (int i = 0; i < cfg.reps; i++) {
		if (time_stream(&cfg, pt, ct, nchunks, &t) != 0) {
			fprintf(stderr, "crypto_raw: pull failed\n");
			goto out;
		}
	}
	bytes = (double)nchunks * (double)cfg.chunk;
	printf("# libsodium %s, %zu MiB in %zu chunks of %zu KiB, best of "
	       "%d, one thread\n",
	    sodium_version_string(), (size_t)(bytes / (1 << 20)), nchunks,
	    cfg.chunk >> 10, cfg.reps);
	printf("%-40s %15s %13s\n", "operation", "throughput", "time");
	row("secretstream push", bytes, t.push);
	row("secretstream pull (in place)", bytes, t.pull);
	row("secretstream push+pull", bytes, t.push + t.pull);
	row("BLAKE2b over the ciphertext", bytes, t.hash);
	row("push + BLAKE2b (fedbox sender)", bytes, t.push + t.hash);
	row("pull + BLAKE2b (fedbox receiver)", bytes, t.pull + t.hash);
	row("push+pull + 2x BLAKE2b (fedbox both)", bytes,
	    t.push + t.pull + 2 * t.hash);
	bench_ed25519();
	{
		double tl[2][5] = {{1e30, 1e30, 1e30, 1e30, 1e30},
		    {1e30, 1e30, 1e30, 1e30, 1e30}};
		static const char *what[5][2] = {
		    {"chunk seal, libsodium", "chunk seal, fedbox"},
		    {"chunk open, libsodium", "chunk open, fedbox"},
		    {"keystream, libsodium", "keystream, fedbox"},
		    {"chunk hash, BLAKE2b (libsodium)",
		        "chunk hash, SHA-256 (fedbox)"},
		    {"chunk MAC, libsodium", "chunk MAC, fedbox"}};
		for (int i = 0; i < cfg.reps; i++) {
			for (int lib = 0; lib < 2; lib++) {
				if (time_chacha(&cfg, pt, ct, nchunks, lib,
				        tl[lib]) != 0) {
					fprintf(stderr, "crypto_raw: an open "
					                "failed\n");
					goto out;
				}
			}
		}
		printf("# XChaCha20-Poly1305-IETF chunks (%zu KiB), "
		       "ChaCha20 keystream, a FULL chunk's hash, Poly1305: "
		       "libsodium, "
		       "then crypto/bulk.c (on %s)\n",
		    cfg.chunk >> 10, fb_crypto_ciphers());
		for (int k = 0; k < 5; k++) {
			row(what[k][0], bytes, tl[0][k]);
			row(what[k][1], bytes, tl[1][k]);
		}
	}
	rc = 0;
out:
	fb_free(pt);
	fb_free(ct);
	return rc;
}

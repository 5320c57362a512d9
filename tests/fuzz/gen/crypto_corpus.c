/* SPDX-License-Identifier: Apache-2.0 */
/*
 * crypto_corpus.c -- writes the seed corpora of the crypto/ fuzz targets
 * (valid inputs and a few near misses) into DIR/<target>/:
 *   build/fuzz/gen/crypto_corpus tests/fuzz/corpus
 * It uses the targets' fixture, so the deterministic RNG gives the same
 * handshake state here as in the targets.
 */
#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz_common.h"

static const char *out_dir;

static void
put(const char *target, const char *name, const uint8_t *p, size_t n)
{
	char path[1024];
	FILE *fp;

	snprintf(path, sizeof(path), "%s/%s", out_dir, target);
	if (mkdir(path, 0755) != 0 && errno != EEXIST) {
		perror(path);
		exit(1);
	}
	snprintf(path, sizeof(path), "%s/%s/%s", out_dir, target, name);
	if ((fp = fopen(path, "wb")) == NULL || fwrite(p, 1, n, fp) != n ||
	    fclose(fp) != 0) {
		perror(path);
		exit(1);
	}
}

static void
gen_handshake(const fz_fixture *f)
{
	fb_hs_accept_cfg cfg = fz_accept_cfg();
	uint8_t reply[FB_HS_REPLY_LEN], bad[FB_HS_HELLO_LEN];
	fb_session *cs = NULL, *ws = NULL;
	fb_handshake *hs = NULL;
	uint8_t hello2[FB_HS_HELLO_LEN];

	put("crypto_hs_hello", "valid", f->hello, sizeof(f->hello));
	if (fb_handshake_accept(
	        &cfg, f->hello, sizeof(f->hello), reply, &cs, NULL) != FB_OK ||
	    fb_handshake_finish(f->hs, reply, sizeof(reply), &ws, NULL) !=
	        FB_OK) {
		fz_die("handshake");
	}
	put("crypto_hs_reply", "valid", reply, sizeof(reply));
	memcpy(bad, f->hello, sizeof(bad));
	bad[2] ^= 1; /* other protocol version */
	put("crypto_hs_hello", "version", bad, sizeof(bad));
	reply[4] = 0xff; /* changed worker id: bad signature */
	put("crypto_hs_reply", "badsig", reply, sizeof(reply));
	/* A hello of a key not on the allowlist. */
	if (fb_handshake_start(f->coord, &f->coord_pk, FZ_PROTO, f->cookie,
	        hello2, &hs) != FB_OK) {
		fz_die("hello2");
	}
	put("crypto_hs_hello", "unknown", hello2, sizeof(hello2));
	fb_handshake_free(hs);
	hs = NULL;
	/* A hello whose cookie another coordinator process issued: it is
	 * signed, and refused as stale. */
	{
		uint8_t other[FB_HS_COOKIE_KEY_LEN], cookie[FB_HS_COOKIE_LEN];
		memset(other, 0x67, sizeof(other));
		fb_hs_cookie_make(other, FZ_NOW_MS, cookie);
		if (fb_handshake_start(f->worker, &f->coord_pk, FZ_PROTO,
		        cookie, hello2, &hs) != FB_OK) {
			fz_die("hello3");
		}
		put("crypto_hs_hello", "stale", hello2, sizeof(hello2));
		fb_handshake_free(hs);
	}
	fb_session_free(cs);
	fb_session_free(ws);
}

static void
gen_msgs(const fz_fixture *f)
{
	uint8_t buf[1 + 512];
	size_t n;
	const char *bodies[] = {"", "join",
	    "a somewhat longer control message "
	    "body of the fuzz corpus"};
	char name[32];

	for (size_t i = 0; i < 3; i++) {
		f->worker_s->send_seq = i;
		if (fb_msg_seal(f->worker_s, (uint8_t)i, 1,
		        (const uint8_t *)bodies[i], strlen(bodies[i]), buf + 1,
		        sizeof(buf) - 1, &n) != FB_OK) {
			fz_die("seal");
		}
		buf[0] = (uint8_t)(i == 2 ? 4 : i); /* in place for the last */
		snprintf(name, sizeof(name), "valid%zu", i);
		put("crypto_msg_open", name, buf, n + 1);
	}
	buf[0] = 2; /* accept round 2 only: stale */
	put("crypto_msg_open", "stale", buf, n + 1);
}

static size_t
frame(uint8_t *out, const uint8_t *p, size_t n)
{
	out[0] = (uint8_t)n;
	out[1] = (uint8_t)(n >> 8);
	memcpy(out + 2, p, n);
	return n + 2;
}

static void
gen_stream(
    const fz_fixture *f, size_t len, fb_stream_digest mode, const char *name)
{
	uint8_t out[4096], hdr[FB_STREAM_HEADER_LEN];
	uint8_t m[FZ_CHUNK], c[FZ_CHUNK + FB_STREAM_CHUNK_OVERHEAD];
	uint8_t trailer[FB_STREAM_TRAILER_LEN];
	fb_stream_push *p = NULL;
	size_t pos = 0, off = 0, clen;

	if (fb_stream_push_alloc_key(
	        &f->ctx, FZ_CHUNK, mode, f->stream_key, hdr, &p) != FB_OK) {
		fz_die("push");
	}
	pos += frame(out + pos, hdr, sizeof(hdr));
	do {
		size_t k = len - off > FZ_CHUNK ? FZ_CHUNK : len - off;
		for (size_t i = 0; i < k; i++) {
			m[i] = (uint8_t)(off + i);
		}
		if (fb_stream_push_chunk(p, m, k, off + k == len, c, sizeof(c),
		        &clen) != FB_OK) {
			fz_die("chunk");
		}
		pos += frame(out + pos, c, clen);
		off += k;
	} while (off < len);
	if (fb_stream_push_final(p, f->worker, trailer) != FB_OK) {
		fz_die("final");
	}
	pos += frame(out + pos, trailer, sizeof(trailer));
	put("crypto_stream_pull", name, out, pos);
	fb_stream_push_free(p);
}

int
main(int argc, char **argv)
{
	const fz_fixture *f;

	if (argc != 2) {
		fprintf(stderr, "usage: crypto_corpus DIR\n");
		return 2;
	}
	out_dir = argv[1];
	f = fz_setup();
	gen_handshake(f);
	gen_msgs(f);
	gen_stream(f, 0, FB_STREAM_DIGEST_FULL, "empty");
	gen_stream(f, 10, FB_STREAM_DIGEST_FULL, "one");
	gen_stream(f, 3 * FZ_CHUNK, FB_STREAM_DIGEST_FULL, "three");
	gen_stream(f, 5 * FZ_CHUNK + 7, FB_STREAM_DIGEST_FULL, "six");
	gen_stream(f, 2 * FZ_CHUNK + 1, FB_STREAM_DIGEST_TAGS, "tags");
	gen_stream(f, 3 * FZ_CHUNK + 2, FB_STREAM_DIGEST_INDEXED_TAGS,
	    "indexed");
	return 0;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * upload_seal.c -- the rate at which a worker encrypts its update, alone:
 * a TAGS stream (what updates use) over fixed-size chunks, in place, once
 * with fb_stream_push_chunk (one thread, as the upload did before) and
 * then with each chunk's cipher pass split over a pool of T threads plus
 * the caller (fb_stream_push_open, _encrypt, _close, as worker/upload.c
 * does), for each T asked. No sockets, no masks. Prints a table, GB/s of
 * plaintext, best of the reps.
 *
 *   build/bench/upload_seal [--size MiB] [--chunk KiB] [--reps N]
 *                           [--threads 0,1,3,...]
 */
#include <getopt.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/pool.h"
#include "common/util.h"
#include "crypto/crypto.h"

#define PART_MIN (32u << 10) /* as worker/upload.c */

typedef struct part_arg {
	const fb_stream_push *p;
	uint8_t *c;
	size_t len, part;
	atomic_int rc;
} part_arg;

static void
part_piece(void *arg, uint32_t i)
{
	part_arg *a = arg;
	size_t off = (size_t)i * a->part;
	size_t n = a->len - off < a->part ? a->len - off : a->part;

	if (fb_stream_push_encrypt(a->p, a->c + 1, off, n, a->c) != FB_OK) {
		atomic_store(&a->rc, (int)FB_EINVAL);
	}
}

/* One pass over `total` bytes in chunks of `chunk` in buf (a slot of
 * chunk + overhead per chunk); pool NULL: fb_stream_push_chunk. */
static fb_err
one_pass(fb_pool *pool, uint8_t *buf, size_t total, size_t chunk,
    double *secs)
{
	fb_stream_ctx ctx = {.round = 1, .sender = 1};
	uint8_t key[FB_STREAM_KEY_LEN], header[FB_STREAM_HEADER_LEN];
	size_t stride = chunk + FB_STREAM_CHUNK_OVERHEAD, clen;
	uint32_t threads = pool != NULL ? fb_pool_threads(pool) + 1 : 1;
	fb_stream_push *p = NULL;
	fb_err rc;
	double t0;

	if ((rc = fb_stream_push_alloc(&ctx, chunk, FB_STREAM_DIGEST_TAGS, key,
	         header, &p)) != FB_OK) {
		return rc;
	}
	t0 = fb_now_s();
	for (size_t off = 0; off < total && rc == FB_OK; off += chunk) {
		size_t n = total - off < chunk ? total - off : chunk;
		uint8_t *c = buf + off / chunk * stride;
		int final = off + n == total;
		part_arg a = {.p = p, .c = c, .len = n};
		if (pool == NULL) {
			rc = fb_stream_push_chunk(
			    p, c + 1, n, final, c, stride, &clen);
			continue;
		}
		if ((rc = fb_stream_push_open(p, n, final, stride)) != FB_OK) {
			break;
		}
		a.part = (n / threads + 63) / 64 * 64;
		a.part = a.part < PART_MIN ? PART_MIN : a.part;
		atomic_init(&a.rc, FB_OK);
		fb_pool_for(pool, (uint32_t)((n + a.part - 1) / a.part),
		    part_piece, &a);
		if ((rc = (fb_err)atomic_load(&a.rc)) == FB_OK) {
			rc = fb_stream_push_close(p, c, &clen);
		}
	}
	*secs = fb_now_s() - t0;
	fb_stream_push_free(p);
	return rc;
}

/* Best of `reps` passes, GB/s. */
static fb_err
best_rate(fb_pool *pool, uint8_t *buf, size_t total, size_t chunk, int reps,
    double *gbs)
{
	double best = 0, s;
	fb_err rc;

	for (int r = 0; r < reps; r++) {
		if ((rc = one_pass(pool, buf, total, chunk, &s)) != FB_OK) {
			return rc;
		}
		if (s > 0 && (best == 0 || s < best)) {
			best = s;
		}
	}
	*gbs = best > 0 ? (double)total / best / 1e9 : 0;
	return FB_OK;
}

int
main(int argc, char **argv)
{
	size_t total = 256u << 20, chunk = 1u << 20;
	int reps = 5, rc = 1;
	const char *tlist = NULL;
	char *list = NULL, *save = NULL;
	uint8_t *buf = NULL;
	double seq = 0;
	static const struct option opts[] = {{"size", 1, NULL, 's'},
	    {"chunk", 1, NULL, 'c'}, {"reps", 1, NULL, 'r'},
	    {"threads", 1, NULL, 't'}, {"help", 0, NULL, 'h'},
	    {NULL, 0, NULL, 0}};
	int o;

	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 's': total = strtoull(optarg, NULL, 10) << 20; break;
		case 'c': chunk = strtoull(optarg, NULL, 10) << 10; break;
		case 'r': reps = atoi(optarg); break;
		case 't': tlist = optarg; break;
		case 'h':
			printf("usage: %s [--size MiB] [--chunk KiB] "
			       "[--reps N] [--threads 0,1,...]\n",
			    argv[0]);
			return 0;
		default:
			fprintf(stderr, "usage: %s [--size MiB] [--chunk KiB] "
			                "[--reps N] [--threads 0,1,...]\n",
			    argv[0]);
			return 2;
		}
	}
	if (tlist != NULL &&
	    (tlist[0] == '\0' ||
	        strspn(tlist, "0123456789,") != strlen(tlist))) {
		fprintf(stderr, "upload_seal: --threads takes counts, "
		                "e.g. 0,1,15\n");
		return 2;
	}
	if (total == 0 || chunk == 0 || chunk > FB_STREAM_CHUNK_MAX ||
	    reps < 1) {
		fprintf(stderr, "upload_seal: --size, --chunk (<= 64 MiB) and "
		                "--reps must be positive\n");
		return 2;
	}
	buf = malloc((total / chunk + 1) * (chunk + FB_STREAM_CHUNK_OVERHEAD));
	if (buf == NULL) {
		fprintf(stderr, "upload_seal: out of memory\n");
		goto out;
	}
	memset(buf, 0x5a,
	    (total / chunk + 1) * (chunk + FB_STREAM_CHUNK_OVERHEAD));
	if (best_rate(NULL, buf, total, chunk, reps, &seq) != FB_OK) {
		fprintf(stderr, "upload_seal: sequential push failed\n");
		goto out;
	}
	printf("upload_seal: %zu MiB in %zu KiB chunks, %u CPUs, "
	       "best of %d\n\n",
	    total >> 20, chunk >> 10, fb_pool_cpus(), reps);
	printf("| sealing | threads | GB/s | x sequential |\n");
	printf("|---|---|---|---|\n");
	printf("| fb_stream_push_chunk | 1 | %.2f | 1.00 |\n", seq);
	if (tlist == NULL) {
		static char dflt[16];
		snprintf(dflt, sizeof(dflt), "0,%u",
		    fb_pool_cpus() > 1 ? fb_pool_cpus() - 1 : 0);
		tlist = dflt;
	}
	if ((list = strdup(tlist)) == NULL) {
		goto out;
	}
	for (char *t = strtok_r(list, ",", &save); t != NULL;
	     t = strtok_r(NULL, ",", &save)) {
		fb_pool *pool = NULL;
		double g = 0;
		char *end = NULL;
		unsigned long n = strtoul(t, &end, 10);
		if (end == t || *end != '\0' || n > 256) {
			fprintf(stderr, "upload_seal: --threads: %s is not a "
			                "count of 0 to 256\n",
			    t);
			goto out;
		}
		if (fb_pool_alloc((uint32_t)n, &pool) != FB_OK ||
		    best_rate(pool, buf, total, chunk, reps, &g) != FB_OK) {
			fprintf(stderr, "upload_seal: parts on %s threads "
			                "failed\n",
			    t);
			fb_pool_free(pool);
			goto out;
		}
		printf("| in parts on the pool | %u | %.2f | %.2f |\n",
		    fb_pool_threads(pool) + 1, g, seq > 0 ? g / seq : 0);
		fb_pool_free(pool);
	}
	rc = 0;
out:
	free(list);
	free(buf);
	return rc;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * accum_add.c -- the coordinator's CPU per received byte of an update, on
 * one thread: fb_accum_add (aggregation/accum.c, this build) against the
 * two-pass add it replaced (a copy below, for comparison only: a scan for
 * NaN/inf and clip counts, then clamp, encode and add, after a memset of
 * the whole sum each round) and against memcpy of each chunk into a
 * model-sized buffer, what a receiver that keeps the bytes costs at least.
 *
 *   build/bench/accum_add [--count N] [--chunk ELEMS] [--updates U]
 *                         [--rounds R]
 *
 * A round adds U updates of N float32 values (weight 1/U each, clip 1,
 * values ~ N(0, 0.5^2), so about 5% are clamped) chunk by chunk into one
 * model-sized sum, as the coordinator does; each update's chunk comes from
 * one buffer of ELEMS floats that stays in cache, like a chunk just
 * received and decrypted. The sum's reset is part of a round (it is paid
 * once per round) and is also shown on its own. One untimed warm-up round
 * first; the table gives the median of R rounds, GB/s = 1e9 bytes of
 * floats added per second (4 N U bytes per round), and the ratio to
 * memcpy. The sums of the two adds are compared bit for bit at the end.
 */
#include <float.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aggregation/aggregation.h"
#include "common/util.h"

#define MAX_ROUNDS 101
#define MAX_UPDATES 64
#define CLIP 1.0

/* ---- the two-pass add before the fused one (copy of accum.c) ----------- */

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
#define BENCH_CLONES \
	__attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define BENCH_CLONES
#endif

BENCH_CLONES static int
old_scan_chunk(const float *restrict x, uint64_t n, double clip,
    uint64_t *over)
{
	uint32_t bad = 0, c = 0;
	float cf = (float)clip;
	if ((double)cf > clip) {
		cf = nextafterf(cf, -INFINITY);
	}
	for (uint64_t j = 0; j < n; j++) {
		float f = x[j];
		bad |= (uint32_t)(!(f == f) | (f > FLT_MAX) | (f < -FLT_MAX));
		c += (uint32_t)((f > cf) | (f < -cf));
	}
	*over = c;
	return bad != 0;
}

BENCH_CLONES static void
old_add_chunk(uint32_t *restrict sum, const float *restrict x, uint64_t n,
    double clip, double k)
{
	for (uint64_t j = 0; j < n; j++) {
		double v = x[j];
		v = v > clip ? clip : v;
		v = v < -clip ? -clip : v;
		double t = v * k;
		sum[j] += (uint32_t)(int32_t)(t + copysign(0.5, t));
	}
}

/* ---- the benchmark ------------------------------------------------------ */

typedef struct bench_cfg {
	uint64_t count; /* floats per update */
	uint64_t chunk; /* floats per chunk */
	int updates;
	int rounds;
} bench_cfg;

typedef struct round_times {
	double copy;      /* memcpy of every chunk of every update */
	double old_reset; /* memset of the old sum */
	double old_add;   /* the two-pass adds */
	double new_reset; /* fb_accum_reset */
	double new_add;   /* fb_accum_add */
} round_times;

static int
cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double
median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_d);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* one_round runs the three variants once each and times them. Returns the
 * number of adds fb_accum_add refused (0 expected). */
static int
one_round(const bench_cfg *cfg, float *const *src, float *dst,
    uint32_t *old_sum, fb_accum *a, uint64_t *old_clipped,
    uint64_t *new_clipped, round_times *t)
{
	uint32_t chunks = fb_accum_chunk_count(a);
	uint64_t wq = (uint64_t)floor(1.0 / cfg->updates * 0x1p32);
	double k = (double)wq / 0x1p32 * (0x1p30 / CLIP);
	double t0;
	int refused = 0;

	t0 = fb_now_s();
	for (int u = 0; u < cfg->updates; u++) {
		for (uint32_t c = 0; c < chunks; c++) {
			uint64_t n = fb_accum_chunk_len(a, c);
			memcpy(dst + (uint64_t)c * cfg->chunk, src[u],
			    n * sizeof(float));
		}
	}
	t->copy = fb_now_s() - t0;

	t0 = fb_now_s();
	memset(old_sum, 0, cfg->count * sizeof(*old_sum));
	t->old_reset = fb_now_s() - t0;
	*old_clipped = 0;
	t0 = fb_now_s();
	for (int u = 0; u < cfg->updates; u++) {
		for (uint32_t c = 0; c < chunks; c++) {
			uint64_t n = fb_accum_chunk_len(a, c), over = 0;
			if (old_scan_chunk(src[u], n, CLIP, &over)) {
				refused++;
				continue;
			}
			old_add_chunk(old_sum + (uint64_t)c * cfg->chunk,
			    src[u], n, CLIP, k);
			*old_clipped += over;
		}
	}
	t->old_add = fb_now_s() - t0;

	t0 = fb_now_s();
	fb_accum_reset(a);
	t->new_reset = fb_now_s() - t0;
	*new_clipped = 0;
	t0 = fb_now_s();
	for (int u = 0; u < cfg->updates; u++) {
		for (uint32_t c = 0; c < chunks; c++) {
			if (fb_accum_add(a, c, src[u], 1.0 / cfg->updates,
			        new_clipped) != FB_OK) {
				refused++;
			}
		}
	}
	t->new_add = fb_now_s() - t0;
	return refused;
}

static void
row(const char *name, double bytes, double s, double copy_s)
{
	printf("%-44s %8.1f ms %8.2f GB/s %7.2f\n", name, s * 1e3,
	    bytes / s / 1e9, copy_s / s);
}

int
main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"count", required_argument, NULL, 'n'},
	    {"chunk", required_argument, NULL, 'c'},
	    {"updates", required_argument, NULL, 'u'},
	    {"rounds", required_argument, NULL, 'r'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	bench_cfg cfg = {.count = 100000000, .chunk = 262144, .updates = 2,
	    .rounds = 5};
	static double copy[MAX_ROUNDS], old_reset[MAX_ROUNDS],
	    old_round[MAX_ROUNDS], old_add[MAX_ROUNDS], new_reset[MAX_ROUNDS],
	    new_add[MAX_ROUNDS], new_round[MAX_ROUNDS];
	float *src[MAX_UPDATES] = {NULL};
	float *dst = NULL;
	uint32_t *old_sum = NULL;
	fb_accum *a = NULL;
	uint64_t old_clipped = 0, new_clipped = 0;
	fb_rng rng;
	double bytes, c;
	int o, rc = 1, refused = 0, same;

	while ((o = getopt_long(argc, argv, "n:c:u:r:h", opts, NULL)) != -1) {
		switch (o) {
		case 'n':
			cfg.count = (uint64_t)strtod(optarg, NULL);
			break;
		case 'c':
			cfg.chunk = strtoull(optarg, NULL, 10);
			break;
		case 'u':
			cfg.updates = atoi(optarg);
			break;
		case 'r':
			cfg.rounds = atoi(optarg);
			break;
		case 'h':
			printf("usage: accum_add [--count N] [--chunk ELEMS] "
			       "[--updates U] [--rounds R]\n");
			return 0;
		default:
			return 2;
		}
	}
	if (cfg.chunk == 0 || cfg.count < cfg.chunk || cfg.updates < 1 ||
	    cfg.updates > MAX_UPDATES || cfg.rounds < 1 ||
	    cfg.rounds > MAX_ROUNDS) {
		fprintf(stderr, "accum_add: need 0 < chunk <= count, 1 <= "
		                "updates <= %d, 1 <= rounds <= %d\n",
		    MAX_UPDATES, MAX_ROUNDS);
		return 2;
	}
	if (fb_accum_alloc(cfg.count, cfg.chunk, CLIP, &a) != FB_OK) {
		fprintf(stderr, "accum_add: cannot make the accumulator\n");
		goto out;
	}
	dst = fb_calloc(cfg.count, sizeof(*dst));
	old_sum = fb_calloc(cfg.count, sizeof(*old_sum));
	if (dst == NULL || old_sum == NULL) {
		fprintf(stderr, "accum_add: out of memory\n");
		goto out;
	}
	fb_rng_init(&rng, 1, 0);
	for (int u = 0; u < cfg.updates; u++) {
		if ((src[u] = fb_alloc(cfg.chunk * sizeof(float))) == NULL) {
			fprintf(stderr, "accum_add: out of memory\n");
			goto out;
		}
		for (uint64_t j = 0; j < cfg.chunk; j++) {
			src[u][j] = (float)(0.5 * fb_rng_normal(&rng));
		}
	}
	{
		round_times t;
		refused += one_round(&cfg, src, dst, old_sum, a, &old_clipped,
		    &new_clipped, &t); /* warm-up: page faults, ifuncs */
	}
	for (int r = 0; r < cfg.rounds; r++) {
		round_times t;
		refused += one_round(&cfg, src, dst, old_sum, a, &old_clipped,
		    &new_clipped, &t);
		copy[r] = t.copy;
		old_reset[r] = t.old_reset;
		old_add[r] = t.old_add;
		old_round[r] = t.old_reset + t.old_add;
		new_reset[r] = t.new_reset;
		new_add[r] = t.new_add;
		new_round[r] = t.new_reset + t.new_add;
	}
	same = memcmp(old_sum, fb_accum_ring(a),
	           cfg.count * sizeof(*old_sum)) == 0 &&
	       old_clipped == new_clipped;
	bytes = 4.0 * (double)cfg.count * cfg.updates;
	c = median(copy, cfg.rounds);
	printf("# N = %llu floats, chunks of %llu, %d updates per round, "
	       "median of %d rounds, one thread\n",
	    (unsigned long long)cfg.count, (unsigned long long)cfg.chunk,
	    cfg.updates, cfg.rounds);
	printf("%-44s %11s %13s %7s\n", "per round", "time", "throughput",
	    "/memcpy");
	row("memcpy, chunk by chunk (ceiling)", bytes, c, c);
	row("two-pass add, adds only", bytes, median(old_add, cfg.rounds), c);
	row("two-pass add + memset reset", bytes,
	    median(old_round, cfg.rounds), c);
	row("fb_accum_add, adds only", bytes, median(new_add, cfg.rounds), c);
	row("fb_accum_add + fb_accum_reset", bytes,
	    median(new_round, cfg.rounds), c);
	printf("# reset alone: memset %.1f ms, fb_accum_reset %.1f ms\n",
	    median(old_reset, cfg.rounds) * 1e3,
	    median(new_reset, cfg.rounds) * 1e3);
	printf("# sums and clip counts identical: %s; refused adds: %d\n",
	    same ? "yes" : "NO", refused);
	rc = same && refused == 0 ? 0 : 1;
out:
	for (int u = 0; u < MAX_UPDATES; u++) {
		fb_free(src[u]);
	}
	fb_free(dst);
	fb_free(old_sum);
	fb_accum_free(a);
	return rc;
}

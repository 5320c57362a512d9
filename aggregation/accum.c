/* SPDX-License-Identifier: Apache-2.0 */
/*
 * accum.c -- the fixed-point streaming accumulator (see aggregation.h for
 * the encoding, the overflow argument and the quantisation bound).
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "aggregation/aggregation.h"
#include "common/util.h"

#define WEIGHT_ONE (1ULL << 32) /* weights are fixed point, 32 fraction bits */
/*
 * Concurrent adds into one chunk go part by part, each part under a lock,
 * so that several threads add different updates into different parts of
 * the same chunk at once (a model of one chunk, or more updates than
 * chunks, would otherwise queue them on one lock). A part is at least
 * 8192 elements (32 KiB of the sum: the lock costs ~1% of its add), and a
 * chunk has at most 64 parts, so the parts of one chunk never share a lock.
 */
#define PART_ELEMS_MIN 8192
#define CHUNK_PARTS_MAX 64
#define LOCKS_MAX 1024

#include "aggregation/aggregation_impl.h"

fb_err
fb_accum_alloc(uint64_t count, uint64_t chunk_elems, double clip,
    fb_accum **out)
{
	fb_accum *a;
	uint64_t chunks;

	*out = NULL;
	/* clip below 1e-30 would make S = 2^30 / clip overflow a double. */
	if (count == 0 || chunk_elems == 0 || !(clip >= 1e-30) ||
	    !isfinite(clip)) {
		return FB_EINVAL;
	}
	chunks = count / chunk_elems + (count % chunk_elems != 0);
	if (chunks > UINT32_MAX || count > SIZE_MAX / sizeof(uint32_t)) {
		return FB_EINVAL;
	}
	if ((a = calloc(1, sizeof(*a))) == NULL) {
		return FB_ENOMEM;
	}
	a->count = count;
	a->chunk_elems = chunk_elems;
	a->chunks = (uint32_t)chunks;
	a->clip = clip;
	a->scale = ldexp(1.0, 30) / clip;
	a->clip_f = (float)clip;
	if ((double)a->clip_f > clip) {
		a->clip_f = nextafterf(a->clip_f, -INFINITY);
	}
	a->part_elems = (chunk_elems + CHUNK_PARTS_MAX - 1) / CHUNK_PARTS_MAX;
	if (a->part_elems < PART_ELEMS_MIN) {
		a->part_elems = PART_ELEMS_MIN;
	}
	a->chunk_parts = (uint32_t)((chunk_elems + a->part_elems - 1) /
	    a->part_elems);
	/* Parts of one chunk never share a lock (chunk_parts <= 64). */
	a->nlocks = chunks * a->chunk_parts < LOCKS_MAX
	    ? (uint32_t)(chunks * a->chunk_parts) : LOCKS_MAX;
	a->sum = fb_calloc(count, sizeof(*a->sum));
	a->weight_q = fb_calloc(chunks, sizeof(*a->weight_q));
	a->locks = calloc(a->nlocks, sizeof(*a->locks));
	a->part_epoch = calloc(chunks * a->chunk_parts,
	    sizeof(*a->part_epoch));
	if (a->sum == NULL || a->weight_q == NULL || a->locks == NULL ||
	    a->part_epoch == NULL) {
		free(a->locks);
		a->locks = NULL;
		fb_accum_free(a);
		return FB_ENOMEM;
	}
	for (uint32_t i = 0; i < a->nlocks; i++) {
		pthread_mutex_init(&a->locks[i], NULL);
	}
	*out = a;
	return FB_OK;
}

void
fb_accum_free(fb_accum *a)
{
	if (a == NULL) {
		return;
	}
	if (a->locks != NULL) {
		for (uint32_t i = 0; i < a->nlocks; i++) {
			pthread_mutex_destroy(&a->locks[i]);
		}
		free(a->locks);
	}
	fb_free(a->sum);
	fb_free((void *)(uintptr_t)a->weight_q); /* (the _Atomic array) */
	free(a->part_epoch);
	free(a);
}

/*
 * fb_accum_reset leaves the sums where they are and starts a new epoch:
 * every part now reads as zero until its first add of the round stores
 * into it (see aggregation_impl.h). Once in 2^32 rounds the epoch wraps;
 * then the sum is cleared for real, so that no part of an old epoch can
 * look current.
 */
void
fb_accum_reset(fb_accum *a)
{
	a->scale = ldexp(1.0, 30) / a->clip;
	a->stale = true;
	if (++a->epoch == 0) {
		memset(a->sum, 0, a->count * sizeof(*a->sum));
		memset(a->part_epoch, 0, (uint64_t)a->chunks * a->chunk_parts *
		    sizeof(*a->part_epoch));
		a->stale = false;
	}
	for (uint32_t c = 0; c < a->chunks; c++) {
		atomic_store_explicit(&a->weight_q[c], 0, memory_order_relaxed);
	}
}

uint32_t
fb_accum_chunk_count(const fb_accum *a)
{
	return a->chunks;
}

uint64_t
fb_accum_chunk_len(const fb_accum *a, uint32_t chunk)
{
	uint64_t first = (uint64_t)chunk * a->chunk_elems;
	if (chunk >= a->chunks) {
		return 0;
	}
	return a->count - first < a->chunk_elems ? a->count - first
	                                         : a->chunk_elems;
}

/*
 * The loops every update goes through: on x86-64 they are also built
 * for AVX-512F and AVX2 and the best one is picked when the program starts
 * (glibc's ifunc). Without FMA (and ISO C does not contract a * b + c),
 * so the arithmetic and the sums are the same bits on every machine
 * (tests/unit/aggregation_test.c checks them against plain scalar C). The
 * device host's Xeon added 2.8 GB/s on one thread with the SSE2 build,
 * less than one ZeroMQ stream brings; on our 2-CPU AMD EPYC build machine,
 * AVX-512F adds 25-35% over AVX2 (about 10 vs 8 GB/s of floats).
 * (FB_KERNEL_CLONES, aggregation_impl.h.)
 */

/*
 * encode_one clamps f to [-clip, clip] and rounds f * k half away from
 * zero: the ring element one coordinate adds. copysign keeps the rounding
 * branch-free: with random signs a branch would be mispredicted half the
 * time. A NaN clamps to clip (!(v <= clip)), so the conversion is always
 * defined; a chunk holding one is refused and what it added is taken back
 * (add_chunk, sub_chunk), so its value never stays in the sum.
 */
static inline uint32_t
encode_one(float f, double clip, double k)
{
	double v = f;
	v = !(v <= clip) ? clip : v;
	v = v < -clip ? -clip : v;
	double t = v * k;
	return (uint32_t)(int32_t)(t + copysign(0.5, t));
}

/*
 * add_chunk adds encode_one(x[j]) into sum in the ring, and in the same
 * pass checks x: it returns whether x holds a NaN or an infinity (the sum
 * then holds the additions, which the caller takes back with sub_chunk)
 * and sets *over to the number of coordinates beyond the clip. One pass
 * instead of a scan and then an add: x is read once. Branch-free, so it
 * vectorises. clip_f is the largest float not above clip: for a float f,
 * |f| > clip exactly when |f| > clip_f, so the checks stay in float.
 */
FB_KERNEL_CLONES static int
add_chunk(uint32_t *restrict sum, const float *restrict x, uint64_t n,
    double clip, float clip_f, double k, uint32_t *over)
{
	uint32_t bad = 0, c = 0; /* a chunk has < 2^32 elements */
	for (uint64_t j = 0; j < n; j++) {
		float f = x[j];
		float m = fabsf(f);
		bad |= (uint32_t)!(m <= FLT_MAX);
		c += (uint32_t)(m > clip_f);
		sum[j] += encode_one(f, clip, k);
	}
	*over = c;
	return bad != 0;
}

/* store_chunk is add_chunk into a part that reads as zero: it stores
 * instead of adding, so the sum is not read. */
FB_KERNEL_CLONES static int
store_chunk(uint32_t *restrict sum, const float *restrict x, uint64_t n,
    double clip, float clip_f, double k, uint32_t *over)
{
	uint32_t bad = 0, c = 0;
	for (uint64_t j = 0; j < n; j++) {
		float f = x[j];
		float m = fabsf(f);
		bad |= (uint32_t)!(m <= FLT_MAX);
		c += (uint32_t)(m > clip_f);
		sum[j] = encode_one(f, clip, k);
	}
	*over = c;
	return bad != 0;
}

/* sub_chunk takes back what add_chunk added (the ring makes it exact). */
FB_KERNEL_CLONES static void
sub_chunk(uint32_t *restrict sum, const float *restrict x, uint64_t n,
    double clip, double k)
{
	for (uint64_t j = 0; j < n; j++) {
		sum[j] -= encode_one(x[j], clip, k);
	}
}

FB_KERNEL_CLONES void
fb_ring_add(uint32_t *restrict sum, const uint32_t *restrict v, uint64_t n)
{
	for (uint64_t j = 0; j < n; j++) {
		sum[j] += v[j];
	}
}

/* One add: what each part needs, and what the parts report. */
typedef struct part_job {
	fb_accum *a;
	uint32_t *sum;       /* the chunk's sum */
	const float *x;      /* floats to encode, or NULL */
	const uint32_t *v;   /* ring elements (x NULL) */
	uint64_t n;
	double k;
	uint32_t chunk, parts, start;
	_Atomic uint64_t added;   /* bit p: part p of x is in the sum */
	_Atomic uint32_t refused; /* a part of x has a NaN or infinity */
	uint32_t over[CHUNK_PARTS_MAX]; /* clamped coordinates, per part */
} part_job;

static pthread_mutex_t *
part_lock(const fb_accum *a, uint32_t chunk, uint32_t p)
{
	return &a->locks[((uint64_t)chunk * a->chunk_parts + p) % a->nlocks];
}

/*
 * Adds the i-th part of the job, counting from its start part, under
 * that part's lock (a piece for fb_par_run). A part of x with a NaN or an
 * infinity takes its own additions back before it unlocks and marks the
 * job refused; parts that start after that add nothing. The parts added
 * are recorded, so that fb_accum_add can take back exactly those.
 */
static void
part_piece(void *arg, uint32_t i)
{
	part_job *j = arg;
	const fb_accum *a = j->a;
	uint32_t p = (j->start + i) % j->parts;
	uint64_t len, off = accum_part_span(a, j->n, p, &len);
	pthread_mutex_t *mu = part_lock(a, j->chunk, p);
	uint32_t *epoch = &a->part_epoch[(uint64_t)j->chunk * a->chunk_parts +
	    p];
	uint32_t *sum = j->sum + off;
	int fresh, bad;

	if (j->x != NULL &&
	    atomic_load_explicit(&j->refused, memory_order_relaxed)) {
		return;
	}
	pthread_mutex_lock(mu);
	fresh = *epoch != a->epoch; /* the part reads as zero */
	if (j->x == NULL) {
		if (fresh) {
			memcpy(sum, j->v + off, len * sizeof(*sum));
		} else {
			fb_ring_add(sum, j->v + off, len);
		}
		*epoch = a->epoch;
		goto out;
	}
	bad = fresh ? store_chunk(sum, j->x + off, len, a->clip, a->clip_f,
	                  j->k, &j->over[p])
	            : add_chunk(sum, j->x + off, len, a->clip, a->clip_f,
	                  j->k, &j->over[p]);
	if (bad) {
		/* A fresh part stays stale: it still reads as zero. */
		if (!fresh) {
			sub_chunk(sum, j->x + off, len, a->clip, j->k);
		}
		atomic_store_explicit(&j->refused, 1, memory_order_relaxed);
		goto out;
	}
	*epoch = a->epoch;
	atomic_fetch_or_explicit(&j->added, UINT64_C(1) << p,
	    memory_order_relaxed);
out:
	pthread_mutex_unlock(mu);
}

/*
 * add_parts adds n elements into the job's chunk: the floats x (clamped
 * and encoded with factor k) or, x being NULL, the ring elements v, part by
 * part, each under its lock; with a parallel runner the parts go to it.
 * Concurrent adds start at parts spread over the chunk (Fibonacci hashing
 * of a ticket), so they seldom wait for each other. The ring sums commute,
 * so the result is the same whatever the interleaving. The caller reads
 * the job's reports once it returns (fb_par_run returns when all parts
 * are done).
 */
static void
add_parts(fb_accum *a, part_job *j)
{
	uint32_t ticket = atomic_fetch_add_explicit(&a->ticket, 1,
	    memory_order_relaxed);

	j->a = a;
	j->sum = a->sum + (uint64_t)j->chunk * a->chunk_elems;
	j->parts = (uint32_t)((j->n + a->part_elems - 1) / a->part_elems);
	j->start = (uint32_t)(((uint64_t)(ticket * 2654435769u) * j->parts) >>
	    32);
	if (a->par != NULL) {
		a->par(a->par_ctx, j->parts, part_piece, j);
		return;
	}
	for (uint32_t i = 0; i < j->parts; i++) {
		part_piece(j, i);
	}
}

/* take_back subtracts the parts of x that add_parts added (a refused
 * chunk), each under its lock: the sum is as it was without this add. */
static void
take_back(fb_accum *a, part_job *j)
{
	uint64_t added = atomic_load_explicit(&j->added, memory_order_relaxed);

	for (uint32_t p = 0; p < j->parts; p++) {
		uint64_t len, off = accum_part_span(a, j->n, p, &len);
		pthread_mutex_t *mu = part_lock(a, j->chunk, p);
		if (!(added >> p & 1)) {
			continue;
		}
		pthread_mutex_lock(mu);
		sub_chunk(j->sum + off, j->x + off, len, a->clip, j->k);
		pthread_mutex_unlock(mu);
	}
}

void
fb_accum_set_parallel(fb_accum *a, fb_par_run run, void *ctx)
{
	a->par = run;
	a->par_ctx = ctx;
}

fb_err
fb_accum_add(fb_accum *a, uint32_t chunk, const float *x, double weight,
    uint64_t *clipped)
{
	part_job j = {.x = x, .chunk = chunk};
	uint64_t wq, old, over = 0;

	if (chunk >= a->chunks || !(weight > 0) || weight > 1.0) {
		return FB_EINVAL;
	}
	j.n = fb_accum_chunk_len(a, chunk);
	/* Truncation keeps sums of weights that add to 1 from exceeding it. */
	wq = (uint64_t)floor(weight * (double)WEIGHT_ONE);
	old = atomic_load_explicit(&a->weight_q[chunk], memory_order_relaxed);
	if (wq == 0 || old + wq > WEIGHT_ONE) {
		return FB_ERANGE;
	}
	/* Take the weight (another add may take it first: then nothing is
	 * added), then check, clamp, encode and add in one pass; a NaN or an
	 * infinity refuses the whole chunk: the parts added are taken back
	 * (exactly: the sum is a ring) and so is the weight. */
	do {
		if (old + wq > WEIGHT_ONE) {
			return FB_ERANGE;
		}
	} while (!atomic_compare_exchange_weak_explicit(&a->weight_q[chunk],
	    &old, old + wq, memory_order_relaxed, memory_order_relaxed));
	j.k = (double)wq / (double)WEIGHT_ONE * a->scale;
	add_parts(a, &j);
	if (atomic_load_explicit(&j.refused, memory_order_relaxed)) {
		take_back(a, &j);
		atomic_fetch_sub_explicit(&a->weight_q[chunk], wq,
		    memory_order_relaxed);
		return FB_EINVAL;
	}
	for (uint32_t p = 0; p < j.parts; p++) {
		over += j.over[p];
	}
	if (clipped != NULL) {
		*clipped += over;
	}
	return FB_OK;
}

fb_err
fb_accum_ring_add(fb_accum *a, uint32_t chunk, const uint32_t *v,
    uint64_t n)
{
	part_job j = {.v = v, .n = n, .chunk = chunk};

	if (chunk >= a->chunks || n != fb_accum_chunk_len(a, chunk)) {
		return FB_EINVAL;
	}
	add_parts(a, &j);
	return FB_OK;
}

double
fb_accum_chunk_weight(const fb_accum *a, uint32_t chunk)
{
	if (chunk >= a->chunks) {
		return 0.0;
	}
	return (double)atomic_load_explicit(&a->weight_q[chunk],
	           memory_order_relaxed) / (double)WEIGHT_ONE;
}

double
fb_accum_resolution(const fb_accum *a)
{
	return 1.0 / a->scale;
}

fb_err
fb_fedavg_weights(const uint64_t *n, uint32_t count, double *w)
{
	double total = 0;
	if (count == 0) {
		return FB_EINVAL;
	}
	for (uint32_t i = 0; i < count; i++) {
		if (n[i] == 0) {
			return FB_EINVAL;
		}
		total += (double)n[i];
	}
	for (uint32_t i = 0; i < count; i++) {
		w[i] = (double)n[i] / total;
	}
	return FB_OK;
}

/* accum_settle zeroes every stale part and makes it current, so that the
 * whole sum can be read and written as is. Adds only make parts current,
 * so once settled the sum stays so until the next reset (the coordinator
 * asks for the ring once per chunk). */
static void
accum_settle(fb_accum *a)
{
	if (!a->stale) {
		return;
	}
	a->stale = false;
	for (uint32_t c = 0; c < a->chunks; c++) {
		uint64_t n = fb_accum_chunk_len(a, c);
		for (uint32_t p = 0; (uint64_t)p * a->part_elems < n; p++) {
			uint64_t len, off = accum_part_span(a, n, p, &len);
			if (!accum_part_stale(a, c, p)) {
				continue;
			}
			memset(a->sum + (uint64_t)c * a->chunk_elems + off, 0,
			    len * sizeof(*a->sum));
			a->part_epoch[(uint64_t)c * a->chunk_parts + p] =
			    a->epoch;
		}
	}
}

uint32_t *
fb_accum_ring(fb_accum *a)
{
	accum_settle(a);
	return a->sum;
}

fb_err
fb_accum_set_secure_sum(fb_accum *a, const fb_encoding *e, double W)
{
	uint32_t shift;
	uint64_t wq;

	if (fb_encoding_check(e) != FB_OK || !(W > 0) || !isfinite(W)) {
		return FB_EINVAL;
	}
	if (W * (double)WEIGHT_ONE >= 0x1p63) {
		return FB_ERANGE;
	}
	accum_settle(a);
	wq = (uint64_t)llround(W * (double)WEIGHT_ONE);
	if (wq == 0) {
		return FB_ERANGE;
	}
	/* Sign-extend each sum from e->bits: shift the low bits to the top
	 * and back down arithmetically (in unsigned arithmetic, then a
	 * well-defined conversion). */
	shift = 32 - e->bits;
	if (shift > 0) {
		for (uint64_t j = 0; j < a->count; j++) {
			uint32_t v = a->sum[j] << shift;
			uint32_t sign = (v >> 31) ? ~(UINT32_MAX >> shift) : 0;
			a->sum[j] = (v >> shift) | sign;
		}
	}
	for (uint32_t c = 0; c < a->chunks; c++) {
		atomic_store_explicit(&a->weight_q[c], wq,
		    memory_order_relaxed);
	}
	/* chunk_inv = 1 / (weight * scale): weight reads back as wq / 2^32. */
	a->scale = e->scale * W / ((double)wq / (double)WEIGHT_ONE);
	return FB_OK;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * partition.c -- splitting a labelled training set among N workers.
 *
 * Every worker computes the same assignment of all examples to all workers
 * from the shared seed and keeps its own part, so no coordination is needed
 * and the parts are disjoint and complete by construction. Schemes:
 *
 *   iid        shuffle, then N near-equal contiguous parts;
 *   dirichlet  per class, proportions p ~ Dir(alpha) over the workers
 *              (label skew; small alpha = few classes per worker), redrawn
 *              while some worker would get too little data;
 *   shards     sort by label, cut into N * shards_per_worker near-equal
 *              shards, deal shuffled shards out (McMahan et al. 2017).
 */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "data/data.h"

/* Stream of fb_rng reserved for partitioning, so that other users of the
 * same seed (model init, batching) draw independent numbers. */
#define PARTITION_STREAM 0x70617274u /* "part" */
/* Label-aware splits keep per-class tables of classes x workers. */
#define PARTITION_MAX_CLASSES 65536u
#define DIRICHLET_MAX_DRAWS 1000

const char *const fb_partition_scheme_names[] = {
	"iid",
	"dirichlet",
	"shards",
	NULL,
};

/* by_label is the scratch a partition works in; all fields owned. */
typedef struct by_label {
	uint32_t *order; /* count example ids, grouped by label, stable */
	uint32_t *start; /* classes + 1 offsets into order */
} by_label;

static fb_err
partition_check(const fb_label *labels, uint32_t count, uint32_t classes,
    const fb_partition_spec *spec)
{
	fb_err rc = FB_EINVAL;

	if (spec->workers < 1) {
		fb_log_error("partition: workers must be >= 1");
		goto out;
	}
	if (spec->index >= spec->workers) {
		fb_log_error("partition: worker index %u must be below the "
		             "%u workers",
		    (unsigned)spec->index, (unsigned)spec->workers);
		goto out;
	}
	if (count < spec->workers) {
		fb_log_error("partition: %u examples cannot give each of %u "
		             "workers one",
		    (unsigned)count, (unsigned)spec->workers);
		goto out;
	}
	if (classes == 0 && spec->scheme != FB_PARTITION_IID) {
		fb_log_error("partition: %s needs class labels; data without "
		             "them (regression targets) splits iid only",
		    spec->scheme == FB_PARTITION_DIRICHLET ? "dirichlet"
		                                           : "shards");
		goto out;
	}
	if (classes > PARTITION_MAX_CLASSES) {
		fb_log_error("partition: %u classes (must be 1..%u)",
		    (unsigned)classes, PARTITION_MAX_CLASSES);
		goto out;
	}
	for (uint32_t i = 0; i < count && classes > 0; i++) {
		if (labels[i].cls < 0 || (uint32_t)labels[i].cls >= classes) {
			fb_log_error("partition: label %d of example %u is "
			             "not in 0..%u",
			    (int)labels[i].cls, (unsigned)i,
			    (unsigned)classes - 1);
			goto out;
		}
	}
	switch (spec->scheme) {
	case FB_PARTITION_IID:
		break;
	case FB_PARTITION_DIRICHLET:
		if (!(spec->alpha > 0.0) || !isfinite(spec->alpha)) {
			fb_log_error("partition: dirichlet alpha %g must be "
			             "positive and finite",
			    spec->alpha);
			goto out;
		}
		break;
	case FB_PARTITION_SHARDS:
		if (spec->shards_per_worker < 1) {
			fb_log_error("partition: shards_per_worker must be "
			             ">= 1");
			goto out;
		}
		if ((uint64_t)spec->workers * spec->shards_per_worker >
		    count) {
			fb_log_error("partition: %u workers x %u shards is "
			             "more shards than the %u examples",
			    (unsigned)spec->workers,
			    (unsigned)spec->shards_per_worker,
			    (unsigned)count);
			goto out;
		}
		break;
	default:
		fb_log_error("partition: unknown scheme %d",
		    (int)spec->scheme);
		goto out;
	}
	rc = FB_OK;
out:
	return rc;
}

static fb_err
alloc_u32(size_t count, uint32_t **out)
{
	fb_err rc = FB_OK;

	if (count > SIZE_MAX / sizeof(uint32_t) ||
	    (*out = fb_alloc(count * sizeof(uint32_t))) == NULL) {
		*out = NULL;
		fb_log_error("partition: out of memory for %zu indices",
		    count);
		rc = FB_ENOMEM;
	}
	return rc;
}

/* by_label_init groups example ids by label with a stable counting sort. */
static fb_err
by_label_init(by_label *bl, const fb_label *labels, uint32_t count,
    uint32_t classes)
{
	fb_err rc = FB_OK;
	uint32_t *next = NULL;

	if ((rc = alloc_u32(count, &bl->order)) != FB_OK) {
		goto out;
	}
	bl->start = fb_calloc((size_t)classes + 1, sizeof(uint32_t));
	next = fb_calloc(classes, sizeof(uint32_t));
	if (bl->start == NULL || next == NULL) {
		fb_log_error("partition: out of memory for %u classes",
		    (unsigned)classes);
		rc = FB_ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < count; i++) {
		bl->start[labels[i].cls + 1]++;
	}
	for (uint32_t c = 0; c < classes; c++) {
		bl->start[c + 1] += bl->start[c];
		next[c] = bl->start[c];
	}
	for (uint32_t i = 0; i < count; i++) {
		bl->order[next[labels[i].cls]++] = i;
	}
out:
	fb_free(next);
	return rc;
}

static void
by_label_fini(by_label *bl)
{
	fb_free(bl->order);
	fb_free(bl->start);
	bl->order = NULL;
	bl->start = NULL;
}

static void
assign_iid(fb_rng *rng, uint32_t count, uint32_t workers, uint32_t *perm,
    uint32_t *owner)
{
	for (uint32_t i = 0; i < count; i++) {
		perm[i] = i;
	}
	fb_rng_shuffle_u32(rng, perm, count);
	/* Part w is perm[w*count/N, (w+1)*count/N): each >= 1 as count >= N. */
	for (uint32_t w = 0; w < workers; w++) {
		uint64_t lo = (uint64_t)w * count / workers;
		uint64_t hi = (uint64_t)(w + 1) * count / workers;
		for (uint64_t j = lo; j < hi; j++) {
			owner[perm[j]] = w;
		}
	}
}

static void
assign_shards(fb_rng *rng, const by_label *bl, uint32_t count,
    uint32_t workers, uint32_t spw, uint32_t *shard_ids, uint32_t *owner)
{
	uint64_t shards = (uint64_t)workers * spw; /* <= count, checked */

	for (uint32_t s = 0; s < shards; s++) {
		shard_ids[s] = s;
	}
	fb_rng_shuffle_u32(rng, shard_ids, (size_t)shards);
	for (uint64_t k = 0; k < shards; k++) {
		uint32_t s = shard_ids[k];
		uint32_t w = (uint32_t)(k / spw);
		uint64_t lo = (uint64_t)s * count / shards;
		uint64_t hi = (uint64_t)(s + 1) * count / shards;
		for (uint64_t j = lo; j < hi; j++) {
			owner[bl->order[j]] = w;
		}
	}
}

/*
 * dirichlet_draw makes one Dir(alpha) label-skewed assignment into `owner`
 * and says whether every worker got at least `min_each` examples. It
 * shuffles each class in place in bl->order; a redraw simply continues from
 * there, which is as random and still determined by the seed.
 */
static bool
dirichlet_draw(fb_rng *rng, by_label *bl, uint32_t classes, uint32_t workers,
    double alpha, uint32_t min_each, double *p, uint32_t *got,
    uint32_t *owner)
{
	memset(got, 0, (size_t)workers * sizeof(*got));
	for (uint32_t c = 0; c < classes; c++) {
		uint32_t *ids = bl->order + bl->start[c];
		uint32_t n = bl->start[c + 1] - bl->start[c];
		double sum = 0.0;
		double cum = 0.0;
		uint64_t lo = 0;

		if (n == 0) {
			continue;
		}
		for (uint32_t w = 0; w < workers; w++) {
			p[w] = fb_rng_gamma(rng, alpha);
			sum += p[w];
		}
		/* With tiny alpha every gamma can underflow to 0. */
		if (!(sum > 0.0) || !isfinite(sum)) {
			return false;
		}
		fb_rng_shuffle_u32(rng, ids, n);
		for (uint32_t w = 0; w < workers; w++) {
			uint64_t hi;
			cum += p[w] / sum;
			hi = w + 1 == workers ? n : (uint64_t)floor(cum * n);
			if (hi > n) {
				hi = n;
			}
			if (hi < lo) {
				hi = lo;
			}
			for (uint64_t j = lo; j < hi; j++) {
				owner[ids[j]] = w;
			}
			got[w] += (uint32_t)(hi - lo);
			lo = hi;
		}
	}
	for (uint32_t w = 0; w < workers; w++) {
		if (got[w] < min_each) {
			return false;
		}
	}
	return true;
}

static fb_err
assign_dirichlet(fb_rng *rng, by_label *bl, uint32_t count, uint32_t classes,
    uint32_t workers, double alpha, uint32_t *owner)
{
	fb_err rc = FB_OK;
	double *p = fb_calloc(workers, sizeof(double));
	uint32_t *got = fb_calloc(workers, sizeof(uint32_t));
	uint32_t min_each = count / workers / 10;
	int draw;

	min_each = min_each > 10 ? 10 : min_each < 1 ? 1 : min_each;
	if (p == NULL || got == NULL) {
		fb_log_error("partition: out of memory for %u workers",
		    (unsigned)workers);
		rc = FB_ENOMEM;
		goto out;
	}
	for (draw = 0; draw < DIRICHLET_MAX_DRAWS; draw++) {
		if (dirichlet_draw(rng, bl, classes, workers, alpha, min_each,
		        p, got, owner)) {
			break;
		}
	}
	if (draw == DIRICHLET_MAX_DRAWS) {
		fb_log_error("partition: dirichlet(alpha=%g) over %u workers "
		             "left some worker with fewer than %u of the %u "
		             "examples in %d draws; raise alpha or use fewer "
		             "workers",
		    alpha, (unsigned)workers, (unsigned)min_each,
		    (unsigned)count, DIRICHLET_MAX_DRAWS);
		rc = FB_EINVAL;
		goto out;
	}
	if (draw > 0) {
		fb_log_debug("partition: dirichlet needed %d redraws", draw);
	}
out:
	fb_free(p);
	fb_free(got);
	return rc;
}

fb_err
fb_partition_indices(const fb_label *labels, uint32_t count, uint32_t classes,
    const fb_partition_spec *spec, uint32_t **idx, uint32_t *n)
{
	fb_err rc = FB_OK;
	by_label bl = {NULL, NULL};
	uint32_t *owner = NULL;
	uint32_t *scratch = NULL;
	uint32_t *mine = NULL;
	uint32_t have = 0;
	fb_rng rng;

	if (idx == NULL || n == NULL) {
		fb_log_error("partition: no output");
		rc = FB_EINVAL;
		goto out;
	}
	*idx = NULL;
	*n = 0;
	if (spec == NULL || (labels == NULL && count > 0)) {
		fb_log_error("partition: no spec or no labels");
		rc = FB_EINVAL;
		goto out;
	}
	if ((rc = partition_check(labels, count, classes, spec)) != FB_OK) {
		goto out;
	}
	if ((rc = alloc_u32(count, &owner)) != FB_OK) {
		goto out;
	}
	fb_rng_init(&rng, spec->seed, PARTITION_STREAM);
	switch (spec->scheme) {
	case FB_PARTITION_IID:
		if ((rc = alloc_u32(count, &scratch)) == FB_OK) {
			assign_iid(&rng, count, spec->workers, scratch, owner);
		}
		break;
	case FB_PARTITION_DIRICHLET:
		if ((rc = by_label_init(&bl, labels, count, classes)) ==
		    FB_OK) {
			rc = assign_dirichlet(&rng, &bl, count, classes,
			    spec->workers, spec->alpha, owner);
		}
		break;
	case FB_PARTITION_SHARDS:
		if ((rc = by_label_init(&bl, labels, count, classes)) ==
		        FB_OK &&
		    (rc = alloc_u32((size_t)spec->workers *
		             spec->shards_per_worker,
		         &scratch)) == FB_OK) {
			assign_shards(&rng, &bl, count, spec->workers,
			    spec->shards_per_worker, scratch, owner);
		}
		break;
	}
	if (rc != FB_OK) {
		goto out;
	}
	/* Scanning in id order hands back this worker's ids sorted. */
	for (uint32_t i = 0; i < count; i++) {
		have += owner[i] == spec->index;
	}
	FB_ASSERT(have >= 1);
	if ((rc = alloc_u32(have, &mine)) != FB_OK) {
		goto out;
	}
	have = 0;
	for (uint32_t i = 0; i < count; i++) {
		if (owner[i] == spec->index) {
			mine[have++] = i;
		}
	}
	*idx = mine;
	*n = have;
out:
	by_label_fini(&bl);
	fb_free(owner);
	fb_free(scratch);
	return rc;
}

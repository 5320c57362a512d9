/* SPDX-License-Identifier: Apache-2.0 */
/*
 * evaluation.c -- the federated evaluation's sample-weighted means: each
 * worker's report (validation examples, mean loss, accuracy, named metrics)
 * is added as sums weighted by its example count, so that the means are
 * those over the union of the workers' validation sets (aggregation.h).
 */
#include <math.h>
#include <string.h>

#include "aggregation/aggregation.h"

void
fb_eval_tally_init(fb_eval_tally *t)
{
	memset(t, 0, sizeof(*t));
}

static int
metric_find(const fb_eval_tally *t, const char *name)
{
	for (uint32_t k = 0; k < t->metric_count; k++) {
		if (strcmp(t->name[k], name) == 0) {
			return (int)k;
		}
	}
	return -1;
}

/* The checks of a report, before anything is added. */
static fb_err
report_check(const fb_eval_tally *t, double loss, double accuracy,
    uint32_t metric_count, const char (*names)[FB_EVAL_NAME_MAX],
    const double *values)
{
	uint32_t fresh = 0;

	if (!isfinite(loss) ||
	    (!isnan(accuracy) && !(accuracy >= 0 && accuracy <= 1)) ||
	    metric_count > FB_EVAL_METRICS_MAX ||
	    (metric_count > 0 && (names == NULL || values == NULL))) {
		return FB_EINVAL;
	}
	for (uint32_t k = 0; k < metric_count; k++) {
		size_t len = strnlen(names[k], FB_EVAL_NAME_MAX);
		if (len == 0 || len == FB_EVAL_NAME_MAX ||
		    !isfinite(values[k])) {
			return FB_EINVAL;
		}
		for (uint32_t j = 0; j < k; j++) {
			if (strcmp(names[j], names[k]) == 0) {
				return FB_EINVAL;
			}
		}
		fresh += metric_find(t, names[k]) < 0;
	}
	return t->metric_count + fresh > FB_EVAL_METRICS_MAX ? FB_ERANGE
	                                                     : FB_OK;
}

fb_err
fb_eval_tally_add(fb_eval_tally *t, uint64_t examples, double loss,
    double accuracy, uint32_t metric_count,
    const char (*names)[FB_EVAL_NAME_MAX], const double *values)
{
	double n = (double)examples;
	fb_err rc;

	if (examples == 0) {
		return FB_OK;
	}
	if ((rc = report_check(
	         t, loss, accuracy, metric_count, names, values)) != FB_OK) {
		return rc;
	}
	t->reports++;
	t->examples += n;
	t->loss += n * loss;
	if (!isnan(accuracy)) {
		t->acc_examples += n;
		t->correct += n * accuracy;
	}
	for (uint32_t k = 0; k < metric_count; k++) {
		int j = metric_find(t, names[k]);
		if (j < 0) {
			j = (int)t->metric_count++;
			memcpy(t->name[j], names[k], FB_EVAL_NAME_MAX);
			t->name[j][FB_EVAL_NAME_MAX - 1] = '\0';
		}
		t->metric[j] += n * values[k];
		t->metric_examples[j] += n;
	}
	return FB_OK;
}

void
fb_eval_tally_mean(const fb_eval_tally *t, fb_eval_mean *out)
{
	memset(out, 0, sizeof(*out));
	out->loss = out->accuracy = NAN;
	if (t->reports == 0 || !(t->examples > 0)) {
		return;
	}
	out->reports = t->reports;
	out->examples = t->examples;
	out->loss = t->loss / t->examples;
	if (t->acc_examples > 0) {
		out->accuracy = t->correct / t->acc_examples;
	}
	out->metric_count = t->metric_count;
	for (uint32_t k = 0; k < t->metric_count; k++) {
		memcpy(out->name[k], t->name[k], FB_EVAL_NAME_MAX);
		out->metric[k] = t->metric[k] / t->metric_examples[k];
	}
}

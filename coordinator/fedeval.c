/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fedeval.c -- the coordinator's side of federated evaluation: each
 * worker's evaluation of the model the round started from, on its own
 * validation data, combined into sample-weighted means (aggregation.h,
 * "Federated evaluation") for the metrics line and the round line. In a
 * plain round each worker's report comes in its UpdateBegin; under secure
 * aggregation only the sums come, unmasked with the update (secagg.c).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "coordinator/coordinator_impl.h"

_Static_assert(FB_EVAL_METRICS_MAX == FB_WIRE_METRICS_MAX &&
                   FB_EVAL_NAME_MAX == FB_WIRE_METRIC_NAME,
    "the wire's and the tally's metric limits agree");

void
fedeval_clear(worker *w)
{
	w->eval_examples = 0;
	w->eval_loss = w->eval_accuracy = NAN;
	w->eval_metric_count = 0;
}

void
fedeval_record(worker *w, const fb_msg *m)
{
	uint32_t n = m->u.update_begin.eval_metric_count;

	fedeval_clear(w);
	if (m->u.update_begin.eval_examples == 0 || n > FB_WIRE_METRICS_MAX) {
		return;
	}
	w->eval_examples = m->u.update_begin.eval_examples;
	w->eval_loss = m->u.update_begin.eval_loss;
	w->eval_accuracy = m->u.update_begin.eval_accuracy;
	w->eval_metric_count = n;
	memcpy(w->eval_name, m->u.update_begin.eval_name, sizeof(w->eval_name));
	memcpy(w->eval_metric, m->u.update_begin.eval_metric,
	    sizeof(w->eval_metric));
}

void
fedeval_tally(coord *c)
{
	fb_eval_tally t;
	fb_err rc;

	fb_eval_tally_init(&t);
	for (uint32_t i = 0; i < c->reg.cap; i++) {
		const worker *w = &c->reg.workers[i];
		if (!w->used || w->state != W_DONE || w->eval_examples == 0) {
			continue;
		}
		rc = fb_eval_tally_add(&t, w->eval_examples, w->eval_loss,
		    w->eval_accuracy, w->eval_metric_count,
		    (const char(*)[FB_EVAL_NAME_MAX])w->eval_name,
		    w->eval_metric);
		if (rc != FB_OK) {
			fb_log_warn("round %u: the evaluation %s reported is "
			            "left out: %s",
			    c->rd.number, w->name,
			    rc == FB_ERANGE ? "more metric names than the "
			                      "round can hold (8)"
			                    : "a value out of range");
		}
	}
	fb_eval_tally_mean(&t, &c->rd.r.fed_eval);
}

static void
num(FILE *f, const char *key, double v)
{
	fprintf(f, "\"%s\": ", key);
	if (isfinite(v)) {
		fprintf(f, "%.6f", v);
	} else {
		fputs("null", f);
	}
}

void
fedeval_json(const coord *c, FILE *f)
{
	const fb_eval_mean *e = &c->rd.r.fed_eval;

	if (e->reports == 0) {
		return;
	}
	fprintf(f, "\"fed_eval\": {\"workers\": %u, \"examples\": %.0f, ",
	    e->reports, e->examples);
	num(f, "loss", e->loss);
	fputs(", ", f);
	num(f, "accuracy", e->accuracy);
	for (uint32_t k = 0; k < e->metric_count; k++) {
		/* names passed the wire's text check: printable, no quote
		 * check needed beyond escaping */
		fputs(", \"", f);
		for (const char *p = e->name[k]; *p != '\0'; p++) {
			if (*p == '"' || *p == '\\') {
				fputc('\\', f);
			}
			fputc(*p, f);
		}
		fputs("\": ", f);
		if (isfinite(e->metric[k])) {
			fprintf(f, "%.6g", e->metric[k]);
		} else {
			fputs("null", f);
		}
	}
	fputs("}, ", f);
}

void
fedeval_round_text(const coord *c, char *buf, size_t len)
{
	const fb_eval_mean *e = &c->rd.r.fed_eval;

	buf[0] = '\0';
	if (e->reports == 0) {
		return;
	}
	if (isfinite(e->accuracy)) {
		snprintf(buf, len, "fed %6.2f%%  ", 100.0 * e->accuracy);
	} else {
		snprintf(buf, len, "fed mse %.4g  ", e->loss);
	}
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * eval.c -- the worker's part of federated evaluation: the round's global
 * model, as received, evaluated on this box's own validation data before
 * training (by the worker for the native trainers, by the script for a
 * trainer process), and the result put where the round sends it: the
 * plain UpdateBegin, or the masked input's extra coordinates under secure
 * aggregation, so that no count of ours leaves in the clear.
 */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "common/log.h"
#include "worker/worker_impl.h"

_Static_assert(FB_TRAIN_METRICS_MAX == FB_WIRE_METRICS_MAX &&
                   FB_TRAIN_METRIC_NAME == FB_WIRE_METRIC_NAME,
    "the trainer's and the wire's metric limits agree");

void
fb_wk_evaluate(fb_wk *w)
{
	double loss = NAN, acc = NAN;
	fb_err rc;

	memset(&w->eval, 0, sizeof(w->eval));
	w->eval.loss = w->eval.accuracy = NAN;
	/* (a trainer process evaluates in the script) */
	if (w->valid.count == 0 || w->model == NULL || w->synthetic ||
	    w->has_proc) {
		return;
	}
	rc = fb_model_evaluate(w->model, w->global, w->valid.x, w->valid.y,
	    w->valid.count, &loss, &acc);
	if (rc != FB_OK || !isfinite(loss)) {
		if (!w->eval_warned) {
			fb_log_warn("round %u: cannot evaluate the model on "
			            "the validation data (%s); no federated "
			            "evaluation from this worker",
			    w->round,
			    rc != FB_OK ? fb_strerror(rc)
			                : "the loss is not finite");
			w->eval_warned = true;
		}
		return;
	}
	w->eval.examples = w->valid.count;
	w->eval.loss = loss;
	w->eval.accuracy = acc;
	fb_log_info("round %u: the global model on %u validation examples: "
	            "loss %.4f, accuracy %.2f%%",
	    w->round, w->valid.count, loss, 100.0 * acc);
}

void
fb_wk_eval_to_begin(const fb_wk *w, fb_msg *m)
{
	const fb_train_eval *e = &w->eval;

	if (e->examples == 0 || !isfinite(e->loss)) {
		return;
	}
	m->u.update_begin.eval_examples = e->examples;
	m->u.update_begin.eval_loss = e->loss;
	m->u.update_begin.eval_accuracy = e->accuracy;
	m->u.update_begin.eval_metric_count =
	    e->metric_count <= FB_WIRE_METRICS_MAX ? e->metric_count : 0;
	for (uint32_t k = 0; k < m->u.update_begin.eval_metric_count; k++) {
		memcpy(m->u.update_begin.eval_name[k], e->name[k],
		    FB_WIRE_METRIC_NAME);
		m->u.update_begin.eval_name[k][FB_WIRE_METRIC_NAME - 1] = '\0';
		m->u.update_begin.eval_metric[k] = e->value[k];
	}
}

void
fb_wk_sa_eval(const fb_wk *w, fb_secagg_eval *ev)
{
	const fb_train_eval *e = &w->eval;

	memset(ev, 0, sizeof(*ev));
	if (e->examples == 0 || !isfinite(e->loss) || w->sa_max_samples == 0) {
		return;
	}
	if (e->examples > w->sa_max_samples) {
		fb_log_warn("round %u: %" PRIu64 " validation examples, more "
		            "than the round's max_samples; the evaluation is "
		            "left out of the secure sum",
		    w->round, e->examples);
		return;
	}
	ev->v = (double)e->examples / (double)w->sa_max_samples;
	ev->loss = e->loss;
	ev->accuracy = e->accuracy;
}

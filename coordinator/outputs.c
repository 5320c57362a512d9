/* SPDX-License-Identifier: Apache-2.0 */
/*
 * outputs.c -- what a run leaves behind: OUTPUT_DIR/model.safetensors
 * (atomically replaced after every committed round), one metrics.jsonl
 * line per round (appended and fsync'd), and the round line on stdout.
 * The files are written by the job thread; the metrics line is composed
 * on the loop, which owns the roster it reads.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "coordinator/coordinator_impl.h"

fb_err
outputs_open(coord *c, bool resume, uint32_t *first)
{
	const fb_coord_config *cfg = c->cfg;
	fb_err rc;

	*first = 1;
	if ((rc = fb_mkdir_p(cfg->output_dir)) != FB_OK) {
		return rc;
	}
	snprintf(c->metrics_path, sizeof(c->metrics_path), "%s/metrics.jsonl",
	    cfg->output_dir);
	snprintf(c->model_path, sizeof(c->model_path), "%s/model.safetensors",
	    cfg->output_dir);
	if (resume) {
		uint32_t done = 0;
		rc = fb_model_load_safetensors(c->model, c->model_path, c->params,
		    &done);
		if (rc != FB_OK) {
			fb_log_error("cannot resume from %s: %s", c->model_path,
			    fb_strerror(rc));
			return rc;
		}
		*first = done + 1;
		fb_log_info("resuming after round %u from %s", done,
		    c->model_path);
		return FB_OK;
	}
	{
		FILE *f = fopen(c->metrics_path, "w");
		if (f == NULL) {
			fb_log_error("cannot create %s", c->metrics_path);
			return FB_EIO;
		}
		fclose(f);
	}
	return FB_OK;
}

fb_err
outputs_save_model(coord *c, double acc)
{
	char round[16], accs[32], run[32];
	const char *const meta[][2] = {
	    {"format", "pt"},
	    {"fedbox.round", round},
	    {"fedbox.model", c->model_desc},
	    {"fedbox.preprocessing", FB_FMNIST_PREPROCESSING},
	    {"fedbox.test_accuracy", accs},
	    {"fedbox.run_id", run},
	    {"fedbox.version", FB_VERSION},
	};

	snprintf(round, sizeof(round), "%u", c->rd.number);
	if (isnan(acc)) {
		snprintf(accs, sizeof(accs), "null");
	} else {
		snprintf(accs, sizeof(accs), "%.6f", acc);
	}
	snprintf(run, sizeof(run), "%016" PRIx64, c->run_id);
	return fb_model_save_safetensors(c->model, c->params, c->model_path,
	    meta, FB_ARRAY_LEN(meta));
}

static void
json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\') {
			fprintf(f, "\\%c", ch);
		} else if (ch < 0x20) {
			fprintf(f, "\\u%04x", ch);
		} else {
			fputc(ch, f);
		}
	}
	fputc('"', f);
}

/* A number with `digits` significant digits (%.*g) or `digits` decimals
 * (fixed), or null when it is not finite (JSON has no NaN). */
static void
json_num(FILE *f, const char *key, double v, int digits, bool fixed)
{
	fprintf(f, "\"%s\": ", key);
	if (!isfinite(v)) {
		fputs("null", f);
	} else if (fixed) {
		fprintf(f, "%.*f", digits, v);
	} else {
		fprintf(f, "%.*g", digits, v);
	}
	fputs(", ", f);
}

static void
json_time(FILE *f)
{
	struct timeval tv;
	struct tm tm;
	char buf[40];

	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
	fprintf(f, "\"time\": \"%s.%03dZ\", ", buf, (int)(tv.tv_usec / 1000));
}

static void
json_worker(coord *c, FILE *f, const worker *w)
{
	bool secure = c->sa.phase != SA_OFF;

	fprintf(f, "{\"name\": ");
	json_str(f, w->name);
	fprintf(f, ", \"status\": \"%s\"", worker_state_names[w->state]);
	if (!secure) {
		fprintf(f, ", \"assigned_steps\": %" PRIu64 ", \"steps\": %" PRIu64
		           ", \"train_seconds\": %.3f",
		    w->assigned_steps, w->steps, w->train_seconds);
	} else if (w->assigned_steps > 0) {
		/* Secure aggregation: what a worker did stays its own; its
		 * speed is known (it schedules time budgets). */
		fprintf(f, ", \"assigned_steps\": %" PRIu64, w->assigned_steps);
	}
	fprintf(f, ", \"steps_per_s\": %.3f, \"made_deadline\": %s",
	    w->round_speed,
	    w->state == W_DONE && w->done_ms <= c->rd.deadline_ms ? "true"
	                                                        : "false");
	if (fb_rule_is_fednova(c->cfg->rule) && !secure) {
		fprintf(f, ", \"a_norm\": %.6g", w->a_norm);
	}
	fprintf(f, ", \"backend\": ");
	json_str(f, w->backend);
	if (w->fail_reason != NULL) {
		fprintf(f, ", \"reason\": ");
		json_str(f, w->fail_reason);
	}
	fputc('}', f);
}

static void
json_round(coord *c, FILE *f)
{
	const round_state *rd = &c->rd;
	const round_result *r = &rd->r;

	fprintf(f, "{\"round\": %u, ", rd->number);
	json_time(f);
	fprintf(f, "\"status\": \"%s\", \"selected\": %u, "
	           "\"participants\": %u, \"partial\": %u, ",
	    round_status_names[r->status], r->selected, r->participants,
	    r->partial);
	json_num(f, "test_accuracy", r->test_accuracy, 6, true);
	json_num(f, "test_loss", r->test_loss, 6, true);
	fprintf(f, "\"rule\": \"%s\", ", fb_rule_names[c->cfg->rule]);
	json_num(f, "tau_eff", rd->tau_eff, 6, false);
	json_num(f, "train_loss", r->train_loss, 6, true);
	if (r->status != ROUND_OK && rd->why[0] != '\0') {
		fprintf(f, "\"reason\": ");
		json_str(f, rd->why);
		fprintf(f, ", ");
	}
	if (c->sa.phase != SA_OFF) {
		fprintf(f, "\"secure_aggregation\": {\"workers\": %u, "
		           "\"neighbours\": %u, \"threshold\": %u, "
		           "\"included\": %u, \"revealed\": %u}, ",
		    c->sa.n, c->sa.k, c->sa.t, sa_count(&c->sa, SA_F_INCLUDED),
		    sa_count(&c->sa, SA_F_REVEALED));
	}
	fprintf(f, "\"seconds\": %.3f, \"bytes_up\": %" PRIu64
	           ", \"bytes_down\": %" PRIu64 ", \"clipped\": %" PRIu64
	           ", \"rejected\": {",
	    r->seconds, rd->up_bytes, rd->down_bytes, rd->clipped);
	for (int i = 0; i < DROP_REASON_COUNT_; i++) {
		fprintf(f, "%s\"%s\": %" PRIu64, i ? ", " : "", drop_names[i],
		    c->g.drops[i] - c->g.drops_reported[i]);
	}
	fprintf(f, "}, \"workers\": [");
	for (uint32_t i = 0, n = 0; i < c->reg.cap; i++) {
		const worker *w = &c->reg.workers[i];
		if (w->used && w->state != W_IDLE) {
			fputs(n++ ? ", " : "", f);
			json_worker(c, f, w);
		}
	}
	fprintf(f, "]}\n");
}

fb_err
outputs_metrics_line(coord *c, char **line, size_t *len)
{
	FILE *f = open_memstream(line, len);

	if (f == NULL) {
		return FB_ENOMEM;
	}
	json_round(c, f);
	if (fclose(f) != 0) {
		free(*line);
		*line = NULL;
		return FB_ENOMEM;
	}
	memcpy(c->g.drops_reported, c->g.drops, sizeof(c->g.drops));
	return FB_OK;
}

fb_err
outputs_append_line(coord *c, const char *line, size_t len)
{
	int fd = open(c->metrics_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC,
	    0644);
	fb_err rc = FB_OK;

	if (fd < 0) {
		fb_log_error("cannot append to %s", c->metrics_path);
		return FB_EIO;
	}
	/* One write of the whole line: O_APPEND puts it at the end whole. */
	if (fb_write_all(fd, line, len) != FB_OK || fsync(fd) != 0) {
		fb_log_error("cannot write %s", c->metrics_path);
		rc = FB_EIO;
	}
	close(fd);
	return rc;
}

void
outputs_round_line(coord *c)
{
	const round_state *rd = &c->rd;
	const round_result *r = &rd->r;

	printf("round %3u/%lld  workers %u/%u%s  ", rd->number,
	    (long long)c->cfg->rounds, r->participants, r->selected,
	    r->partial ? " (+partial)" : "");
	if (isnan(r->test_accuracy)) {
		printf("acc    -     loss   -     ");
	} else {
		printf("acc %6.2f%%  loss %.4f  ", 100.0 * r->test_accuracy,
		    r->test_loss);
	}
	printf("%6.1fs  up %.1f MB  down %.1f MB", r->seconds,
	    (double)rd->up_bytes / 1e6, (double)rd->down_bytes / 1e6);
	if (r->backend[0] != '\0') {
		printf("  [%s%s]", r->backend, r->mixed ? " and others" : "");
	}
	if (r->status == ROUND_OK) {
		printf("\n");
	} else {
		printf("  %s (model unchanged): %s\n",
		    r->status == ROUND_ABORTED ? "ABORTED" : "FAILED", rd->why);
	}
	fflush(stdout);
}

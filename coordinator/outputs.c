/* SPDX-License-Identifier: Apache-2.0 */
/*
 * outputs.c -- what a run leaves behind: OUTPUT_DIR/model.safetensors
 * (the committed model, replaced atomically; checkpoint.c), one
 * metrics.jsonl line per round (appended whole and fsync'd after the
 * round's checkpoint), and the round line on stdout. The folder is locked
 * for the run; nothing in it changes before the start-up checks passed.
 * The files are written by the job thread; the metrics line is composed
 * on the loop, which owns the roster it reads.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "coordinator/coordinator_impl.h"

/* OUTPUT_DIR/.lock, held with flock for the run: a second coordinator on
 * the same folder is refused before it touches anything. A resume with
 * no checkpoint to resume is refused before anything is made. */
fb_err
outputs_lock(coord *c, fb_coord_start how)
{
	const fb_coord_config *cfg = c->cfg;
	char path[4200], pid[32];
	uint32_t round;
	int n;

	if (how == FB_START_RESUME && !checkpoint_exists(c, &round)) {
		fb_log_error("--resume: %s holds no checkpoint (checkpoint/state) "
		             "to resume from; start without --resume",
		    cfg->output_dir);
		return FB_ECONFIG;
	}
	snprintf(path, sizeof(path), "%s/checkpoint", cfg->output_dir);
	if (fb_mkdir_p(path) != FB_OK) {
		return FB_EIO;
	}
	snprintf(c->metrics_path, sizeof(c->metrics_path), "%s/metrics.jsonl",
	    cfg->output_dir);
	snprintf(c->model_path, sizeof(c->model_path), "%s/model.safetensors",
	    cfg->output_dir);
	snprintf(path, sizeof(path), "%s/.lock", cfg->output_dir);
	c->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (c->lock_fd < 0) {
		fb_log_error("cannot open %s: %s", path, strerror(errno));
		return FB_EIO;
	}
	if (flock(c->lock_fd, LOCK_EX | LOCK_NB) != 0) {
		char other[32] = "?";
		ssize_t got = pread(c->lock_fd, other, sizeof(other) - 1, 0);
		other[got > 0 ? got : 1] = '\0';
		other[strcspn(other, "\n")] = '\0';
		fb_log_error("%s is in use by another fedbox-coordinator (pid %s): "
		             "one coordinator per output_dir", cfg->output_dir,
		    other);
		close(c->lock_fd);
		c->lock_fd = -1;
		return FB_ECONFIG;
	}
	n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
	if (ftruncate(c->lock_fd, 0) != 0 ||
	    pwrite(c->lock_fd, pid, (size_t)n, 0) != n) {
		fb_log_warn("cannot write the pid into %s", path);
	}
	return FB_OK;
}

void
outputs_unlock(coord *c)
{
	if (c->lock_fd >= 0) {
		close(c->lock_fd); /* releases the flock */
		c->lock_fd = -1;
	}
}

/* Whether metrics.jsonl holds anything. */
static bool
metrics_nonempty(const coord *c)
{
	struct stat st;
	return stat(c->metrics_path, &st) == 0 && st.st_size > 0;
}

/*
 * outputs_prepare (before the coordinator listens; it changes no file)
 * reads the checkpoint for a resume (*first = the round to run next), or
 * refuses a fresh start on a folder that holds a run.
 */
fb_err
outputs_prepare(coord *c, fb_coord_start how, uint32_t *first)
{
	uint32_t round = 0;

	*first = 1;
	if (how == FB_START_RESUME) {
		return checkpoint_read(c, first);
	}
	if (how == FB_START_FRESH &&
	    (checkpoint_exists(c, &round) || metrics_nonempty(c))) {
		char what[64];
		if (round > 0) {
			snprintf(what, sizeof(what), "checkpointed after round %u",
			    round);
		} else {
			snprintf(what, sizeof(what), "no round recorded yet");
		}
		fb_log_error("%s holds a run (%s): continue it with --resume, or "
		             "start over with --force (which removes its checkpoint "
		             "and metrics)", c->cfg->output_dir, what);
		return FB_ECONFIG;
	}
	return FB_OK;
}

/* The round number a metrics line starts with ({"round": N, ...}). */
static bool
line_round(const char *line, uint32_t *round)
{
	return sscanf(line, "{\"round\": %" SCNu32, round) == 1;
}

/*
 * metrics_repair makes metrics.jsonl end at round R of the checkpoint: a
 * torn last line (a kill mid-write) goes, lines past R go, and round R's
 * line, if a kill came between the checkpoint and its line, is appended
 * from the checkpoint.
 */
static fb_err
metrics_repair(coord *c)
{
	uint8_t *b = NULL;
	size_t len = 0, keep = 0;
	uint32_t last = 0, r;
	fb_err rc = FB_OK;
	int fd;

	if (access(c->metrics_path, F_OK) == 0 &&
	    (rc = fb_file_read_all(c->metrics_path, &b, &len)) != FB_OK) {
		return rc;
	}
	for (size_t i = 0; i < len;) {
		uint8_t *nl = memchr(b + i, '\n', len - i);
		if (nl == NULL) {
			fb_log_warn("%s: a torn last line (%zu bytes) removed",
			    c->metrics_path, len - i);
			break;
		}
		*nl = '\0';
		if (line_round((const char *)b + i, &r) && r > c->rd.number) {
			fb_log_warn("%s: lines past round %u (the checkpoint's) "
			            "removed", c->metrics_path, c->rd.number);
			break;
		}
		if (line_round((const char *)b + i, &r)) {
			last = r;
		}
		i = (size_t)(nl - b) + 1;
		keep = i;
	}
	fb_free(b);
	if ((fd = open(c->metrics_path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644)) <
	        0 ||
	    ftruncate(fd, (off_t)keep) != 0 || fsync(fd) != 0) {
		fb_log_error("cannot repair %s: %s", c->metrics_path,
		    strerror(errno));
		if (fd >= 0) {
			close(fd);
		}
		return FB_EIO;
	}
	close(fd);
	if (last < c->rd.number && c->rd.resume_line_len > 0) {
		fb_log_info("%s: round %u's line restored from the checkpoint",
		    c->metrics_path, c->rd.number);
		rc = outputs_append_line(c, c->rd.resume_line,
		    c->rd.resume_line_len);
	}
	return rc;
}

/*
 * outputs_begin (once the coordinator listens: every start-up check
 * passed) removes temporary files a killed run left (and, on resume,
 * model and optimiser files of other rounds than the checkpoint's), then
 * starts the metrics afresh (fresh, force) or repairs them (resume).
 */
fb_err
outputs_begin(coord *c, fb_coord_start how)
{
	char dir[4200];
	unsigned n;

	snprintf(dir, sizeof(dir), "%s/checkpoint", c->cfg->output_dir);
	n = fb_remove_matching(dir, ".tmp.") +
	    fb_remove_matching(c->cfg->output_dir, ".tmp.");
	if (n > 0) {
		fb_log_info("removed %u temporary file%s a stopped run left in %s",
		    n, n == 1 ? "" : "s", c->cfg->output_dir);
	}
	if (how == FB_START_RESUME) {
		fb_err rc;
		if ((n = checkpoint_prune(c)) > 0) {
			fb_log_info("removed %u checkpoint file%s of rounds "
			            "other than the checkpoint's (%u) a stopped "
			            "run left", n, n == 1 ? "" : "s",
			    c->rd.model_round);
		}
		rc = metrics_repair(c);
		return rc == FB_OK ? checkpoint_export(c) : rc;
	}
	checkpoint_clear(c);
	(void)unlink(c->model_path);
	{
		int fd = open(c->metrics_path,
		    O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd < 0) {
			fb_log_error("cannot create %s: %s", c->metrics_path,
			    strerror(errno));
			return FB_EIO;
		}
		close(fd);
	}
	/* Round 0's checkpoint (the seed's model, nothing recorded): from
	 * now on --resume finds a run, however early this one is killed. */
	{
		uint32_t number = c->rd.number;
		fb_err rc;
		c->rd.number = 0;
		rc = checkpoint_write(c, false, "", 0);
		c->rd.number = number;
		return rc;
	}
}

fb_err
outputs_save_model(coord *c, double acc, const char *path)
{
	char round[16], accs[32], run[32];
	const char *const meta[][2] = {
	    {"format", "pt"},
	    {"fedbox.round", round},
	    {"fedbox.model", c->model_desc},
	    {"fedbox.preprocessing", c->preprocessing != NULL
	                                 ? c->preprocessing
	                                 : "unknown (no evaluation set)"},
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
	return fb_model_save_safetensors(c->model, c->params, path, meta,
	    FB_ARRAY_LEN(meta));
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
	bool secure = c->sa->phase != SA_OFF;

	fprintf(f, "{\"name\": ");
	json_str(f, w->name);
	fprintf(f, ", \"status\": \"%s\"", worker_state_names[w->state]);
	if (!secure) {
		fprintf(f, ", \"assigned_steps\": %" PRIu64 ", \"steps\": %" PRIu64
		           ", \"train_seconds\": %.3f, \"steps_per_s\": %.3f",
		    w->assigned_steps, w->steps, w->train_seconds,
		    w->round_speed);
	} else if (w->assigned_steps > 0 &&
	    c->cfg->local_work != FB_WORK_TIME_BUDGET) {
		/* Secure aggregation: what a worker did and how fast stays its
		 * own; only fixed work the config gives everyone is shown (a
		 * time budget's steps are the worker's choice). */
		fprintf(f, ", \"assigned_steps\": %" PRIu64, w->assigned_steps);
	}
	fprintf(f, ", \"made_deadline\": %s",
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

/* Secure async: the step's cohort and its members' model versions; what
 * each trained, how long and on how many samples stays its own. */
static void
json_cohort(coord *c, FILE *f)
{
	const async_state *as = &c->as;
	const cohort *co = c->cs.applying >= 0 ? &c->cs.co[c->cs.applying]
	                                       : NULL;

	fprintf(f, "\"cohort\": %u, \"members\": %u, \"dropped_stale\": "
	           "%" PRIu64 ", \"superseded\": %" PRIu64 ", "
	           "\"cohorts_failed\": %u, \"workers\": [",
	    co != NULL ? co->id : 0, co != NULL ? co->count : 0,
	    as->dropped_stale, as->superseded, c->cs.failed);
	for (uint32_t i = 0; co != NULL && i < as->count; i++) {
		const async_entry *e = &as->buf[i];
		fprintf(f, "%s{\"name\": ", i ? ", " : "");
		json_str(f, e->name);
		fprintf(f, ", \"status\": \"done\", \"trained_from\": %u, "
		           "\"staleness\": %u, \"staleness_weight\": %.6g, "
		           "\"input_staleness\": %u, \"input_weight\": %.6g}",
		    e->version, e->staleness, fb_staleness_weight(e->staleness),
		    e->input_staleness,
		    fb_staleness_weight(e->input_staleness));
	}
	fprintf(f, "]}\n");
}

/* round.mode async: the step, and the buffer's updates as "workers". */
static void
json_async(coord *c, FILE *f)
{
	const async_state *as = &c->as;

	fprintf(f, "\"mode\": \"async\", \"version\": %u, "
	           "\"buffer_size\": %lld, ",
	    c->rd.committed, (long long)c->cfg->buffer_size);
	json_num(f, "step_scale", as->scale, 6, false);
	if (cohorts_on(c)) {
		json_cohort(c, f);
		return;
	}
	fprintf(f, "\"dropped_stale\": %" PRIu64 ", \"superseded\": %" PRIu64
	           ", \"workers\": [",
	    as->dropped_stale, as->superseded);
	for (uint32_t i = 0; i < as->count; i++) {
		const async_entry *e = &as->buf[i];
		fprintf(f, "%s{\"name\": ", i ? ", " : "");
		json_str(f, e->name);
		fprintf(f, ", \"status\": \"done\", \"trained_from\": %u, "
		           "\"staleness\": %u, \"staleness_weight\": %.6g, "
		           "\"samples\": %" PRIu64 ", \"steps\": %" PRIu64
		           ", \"train_seconds\": %.3f, \"steps_per_s\": %.3f",
		    e->version, e->staleness,
		    fb_staleness_weight(e->staleness), e->n, e->steps,
		    e->train_seconds, e->speed);
		if (fb_rule_is_fednova(c->cfg->rule)) {
			fprintf(f, ", \"a_norm\": %.6g", e->a_norm);
		}
		fprintf(f, ", \"backend\": ");
		json_str(f, e->backend);
		fputc('}', f);
	}
	fprintf(f, "]}\n");
}

static void
json_round(coord *c, FILE *f)
{
	round_state *rd = &c->rd;
	const round_result *r = &rd->r;

	fprintf(f, "{\"round\": %u, ", rd->number);
	if (rd->final) {
		/* the run's final evaluation: no training, model unchanged */
		fprintf(f, "\"final\": true, ");
	}
	json_time(f);
	fprintf(f, "\"status\": \"%s\", \"selected\": %u, "
	           "\"participants\": %u, \"partial\": %u, ",
	    round_status_names[r->status], r->selected, r->participants,
	    r->partial);
	json_num(f, "test_accuracy", r->test_accuracy, 6, true);
	json_num(f, "test_loss", r->test_loss, 6, true);
	fprintf(f, "\"rule\": \"%s\", ", fb_rule_names[c->cfg->rule]);
	json_num(f, "tau_eff", rd->tau_eff, 6, false);
	/* the server lr this round stepped with (aggregation.server_lr_decay) */
	json_num(f, "server_lr", r->status == ROUND_OK && !rd->final
	        ? fb_server_opt_lr(c->opt) : NAN, 6, false);
	json_num(f, "train_loss", r->train_loss, 6, true);
	fedeval_json(c, f);
	if (r->status != ROUND_OK && rd->why[0] != '\0') {
		fprintf(f, "\"reason\": ");
		json_str(f, rd->why);
		fprintf(f, ", ");
	}
	if (round_sa(c)->phase != SA_OFF) {
		const sa_round *sa = round_sa(c);
		fprintf(f, "\"secure_aggregation\": {\"workers\": %u, "
		           "\"neighbours\": %u, \"threshold\": %u, "
		           "\"included\": %u, \"confirmed\": %u, "
		           "\"refused\": %u, \"revealed\": %u, "
		           "\"restarts\": %u, \"set_up_ahead\": %s}, ",
		    sa->n, sa->k, sa->t, sa_count(sa, SA_F_INCLUDED),
		    sa_count(sa, SA_F_CONFIRMED), sa_count(sa, SA_F_REFUSED),
		    sa_count(sa, SA_F_REVEALED), rd->sum_restarts,
		    rd->set_up_ahead ? "true" : "false");
	}
	fprintf(f, "\"seconds\": %.3f, \"bytes_up\": %" PRIu64
	           ", \"bytes_down\": %" PRIu64 ", \"clipped\": %" PRIu64
	           ", \"rejected\": {",
	    r->seconds, rd->up_bytes, rd->down_bytes, rd->clipped);
	for (int i = 0; i < DROP_REASON_COUNT_; i++) {
		c->rd.rejected[i] = c->g.drops[i] - c->g.drops_reported[i];
		fprintf(f, "%s\"%s\": %" PRIu64, i ? ", " : "", drop_names[i],
		    c->rd.rejected[i]);
	}
	if (c->cfg->mode == FB_MODE_ASYNC) {
		fprintf(f, "}, ");
		json_async(c, f);
		return;
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
	char fed[48];

	if (c->cfg->mode == FB_MODE_ASYNC) {
		/* a server step: its updates, and how stale the stalest was */
		uint32_t smax = 0;
		for (uint32_t i = 0; i < c->as.count; i++) {
			smax = c->as.buf[i].staleness > smax ? c->as.buf[i].staleness
			                                     : smax;
		}
		printf("step  %3u/%lld  updates %u  staleness <= %u  ", rd->number,
		    (long long)c->cfg->rounds, r->participants, smax);
	} else if (rd->final) {
		printf("final      workers %u/%u%s  ", r->participants,
		    r->selected, r->partial ? " (+partial)" : "");
	} else {
		printf("round %3u/%lld  workers %u/%u%s  ", rd->number,
		    (long long)c->cfg->rounds, r->participants, r->selected,
		    r->partial ? " (+partial)" : "");
	}
	if (!isnan(r->test_accuracy)) {
		printf("acc %6.2f%%  loss %.4f  ", 100.0 * r->test_accuracy,
		    r->test_loss);
	} else if (!isnan(r->test_loss)) {
		/* regression: the test loss is the mean squared error */
		printf("mse %.6g          ", r->test_loss);
	} else {
		printf("acc    -     loss   -     ");
	}
	fedeval_round_text(c, fed, sizeof(fed));
	fputs(fed, stdout);
	printf("%6.1fs  up %.1f MB  down %.1f MB", r->seconds,
	    (double)rd->up_bytes / 1e6, (double)rd->down_bytes / 1e6);
	if (r->backend[0] != '\0') {
		printf("  [%s%s]", r->backend, r->mixed ? " and others" : "");
	}
	if (r->worker_failed > 0) {
		/* the workers that said their round failed (RoundFailed) */
		printf("  [%s", r->failed_first);
		if (r->worker_failed > 1) {
			printf("; %u more", r->worker_failed - 1);
		}
		printf("]");
	}
	if (r->status == ROUND_OK) {
		printf("\n");
	} else {
		printf("  %s (model unchanged): %s\n",
		    r->status == ROUND_ABORTED ? "ABORTED" : "FAILED", rd->why);
	}
	fflush(stdout);
}

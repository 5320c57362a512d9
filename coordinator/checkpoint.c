/* SPDX-License-Identifier: Apache-2.0 */
/*
 * checkpoint.c -- the coordinator's whole state after each round, so that
 * --resume continues exactly where a run stopped (or was killed).
 *
 * OUTPUT_DIR/checkpoint/ holds, after round R:
 *   model-M.safetensors  the model of the last committed round M <= R
 *                        (none while M is 0: the seed's initial model)
 *   opt-M.bin            the server optimiser's state, for rules that
 *                        keep one (fedavgm, fedadam, fedyogi)
 *   state                the commit point, replaced atomically last:
 *                        round R, M, the RNG, run id, tau_eff, checksums
 *                        (BLAKE2b-256) of the model and optimiser floats,
 *                        and round R's metrics line, all under a
 *                        checksum of its own
 * OUTPUT_DIR/model.safetensors is a hard link to model-M (the export).
 * A round is committed once `state` names it; its metrics line is then
 * appended to metrics.jsonl, and a resume appends it again if a kill came
 * between the two. A kill at any other point leaves the previous state
 * whole: every file is written to a temporary name, fsync'd and renamed.
 *
 * state layout (little-endian):
 *   0:8 "FBCKPT01"  8:4 length of the whole file  12:4 reserved, 0
 *   16:16 run id  32:4 round R  36:4 model round M  40:4 rounds committed
 *   44:4 rule  48:32 RNG state  80:8 tau_eff (IEEE 754)  88:8 params
 *   96:4 optimiser vectors (0, 1 or 2)  100:4 reserved, 0
 *   104:32 checksum of the model floats  136:32 of the optimiser's
 *   168:4 metrics line length L  172:L the line  172+L:32 checksum of
 *   bytes 0..172+L
 * A float array's checksum is BLAKE2b-256 over the BLAKE2b-256 of each
 * 1 MiB block, so that the pool hashes the blocks in parallel.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "coordinator/coordinator_impl.h"

#define CK_MAGIC "FBCKPT01"
#define CK_HEAD 172
#define CK_LINE_MAX (1u << 20)
#define HASH_BLOCK ((size_t)1 << 20)
#define OPT_MAGIC "FBOPTS01"

typedef struct hash_arg {
	const uint8_t *data;
	size_t len;
	uint8_t (*blocks)[FB_HASH_LEN];
} hash_arg;

static void
hash_block(void *arg, uint32_t i)
{
	hash_arg *a = arg;
	size_t off = (size_t)i * HASH_BLOCK;
	size_t n = a->len - off < HASH_BLOCK ? a->len - off : HASH_BLOCK;

	fb_hash(a->data + off, n, a->blocks[i]);
}

/* The checksum of `len` bytes, its blocks hashed on the pool. */
static fb_err
checksum(coord *c, const void *data, size_t len, uint8_t out[FB_HASH_LEN])
{
	uint32_t nb = (uint32_t)((len + HASH_BLOCK - 1) / HASH_BLOCK);
	hash_arg a = {.data = data, .len = len};

	if ((a.blocks = calloc(nb > 0 ? nb : 1, FB_HASH_LEN)) == NULL) {
		return FB_ENOMEM;
	}
	fb_pool_for(c->pool, nb, hash_block, &a);
	fb_hash(a.blocks, (size_t)nb * FB_HASH_LEN, out);
	free(a.blocks);
	return FB_OK;
}

static void
ck_path(const coord *c, char *out, size_t cap, const char *what,
    uint32_t round)
{
	if (round == 0) {
		snprintf(out, cap, "%s/checkpoint/%s", c->cfg->output_dir, what);
	} else {
		snprintf(out, cap, "%s/checkpoint/%s-%u.%s", c->cfg->output_dir,
		    what, round, strcmp(what, "model") == 0 ? "safetensors" : "bin");
	}
}

/* The optimiser's vectors (0, 1 or 2, m first) and their floats each. */
static uint32_t
opt_vectors(coord *c, float **m, float **v)
{
	fb_server_opt_state(c->opt, m, v);
	return (*m != NULL) + (*v != NULL);
}

static fb_err
opt_checksum(coord *c, uint8_t out[FB_HASH_LEN])
{
	float *m = NULL, *v = NULL;
	uint8_t h[2][FB_HASH_LEN];
	uint32_t n = opt_vectors(c, &m, &v);
	fb_err rc = FB_OK;

	memset(out, 0, FB_HASH_LEN);
	if (n == 0) {
		return FB_OK;
	}
	memset(h, 0, sizeof(h));
	if ((rc = checksum(c, m, c->param_count * 4, h[0])) == FB_OK &&
	    v != NULL) {
		rc = checksum(c, v, c->param_count * 4, h[1]);
	}
	fb_hash(h, (size_t)n * FB_HASH_LEN, out);
	return rc;
}

/* Writes opt-M.bin: "FBOPTS01", LE32 vectors, LE32 0, LE64 count, m, v. */
static fb_err
write_opt(coord *c, uint32_t round)
{
	char path[4200];
	float *m = NULL, *v = NULL;
	uint32_t n = opt_vectors(c, &m, &v);
	uint8_t head[24];
	fb_iovec io[3] = {{head, sizeof(head)}, {m, c->param_count * 4},
	    {v, c->param_count * 4}};

	if (n == 0) {
		return FB_OK;
	}
	memcpy(head, OPT_MAGIC, 8);
	fb_store_le32(head + 8, n);
	fb_store_le32(head + 12, 0);
	fb_store_le64(head + 16, c->param_count);
	ck_path(c, path, sizeof(path), "opt", round);
	return fb_file_write_atomic(path, io, 1 + n);
}

/* The export: model.safetensors becomes the checkpoint's model file (a
 * hard link, renamed over the old one), or a copy where links fail. */
static fb_err
export_model(coord *c, const char *ck_model)
{
	char tmp[4200];

	snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", c->model_path, (long)getpid());
	(void)unlink(tmp);
	if (link(ck_model, tmp) == 0) {
		if (rename(tmp, c->model_path) == 0) {
			return FB_OK;
		}
		(void)unlink(tmp);
	}
	return outputs_save_model(c, c->rd.r.test_accuracy, c->model_path);
}

/* Builds the state file in memory. */
static fb_err
state_bytes(coord *c, const uint8_t model_hash[FB_HASH_LEN],
    const uint8_t opt_hash[FB_HASH_LEN], const char *line, size_t line_len,
    uint8_t **out, size_t *out_len)
{
	size_t len = CK_HEAD + line_len + FB_HASH_LEN;
	float *m = NULL, *v = NULL;
	uint8_t *b;

	if (line_len > CK_LINE_MAX || (b = calloc(1, len)) == NULL) {
		return FB_ENOMEM;
	}
	memcpy(b, CK_MAGIC, 8);
	fb_store_le32(b + 8, (uint32_t)len);
	memcpy(b + 16, c->run.b, FB_RUN_ID_LEN);
	fb_store_le32(b + 32, c->rd.number);
	fb_store_le32(b + 36, c->rd.model_round);
	fb_store_le32(b + 40, c->rd.committed);
	fb_store_le32(b + 44, (uint32_t)c->cfg->rule);
	for (int i = 0; i < 4; i++) {
		fb_store_le64(b + 48 + 8 * i, c->rng.s[i]);
	}
	{
		uint64_t bits;
		memcpy(&bits, &c->rd.tau_eff, sizeof(bits));
		fb_store_le64(b + 80, bits);
	}
	fb_store_le64(b + 88, c->param_count);
	fb_store_le32(b + 96, opt_vectors(c, &m, &v));
	memcpy(b + 104, model_hash, FB_HASH_LEN);
	memcpy(b + 136, opt_hash, FB_HASH_LEN);
	fb_store_le32(b + 168, (uint32_t)line_len);
	if (line_len > 0) {
		memcpy(b + CK_HEAD, line, line_len);
	}
	fb_hash(b, CK_HEAD + line_len, b + CK_HEAD + line_len);
	*out = b;
	*out_len = len;
	return FB_OK;
}

/*
 * checkpoint_write (job thread) records round c->rd.number: when it
 * committed, its model and optimiser files first; then the state, then
 * the export; the previous model's files go. `line` is the round's
 * metrics line.
 */
fb_err
checkpoint_write(coord *c, bool committed, const char *line, size_t len)
{
	uint8_t mh[FB_HASH_LEN], oh[FB_HASH_LEN];
	char ck_model[4200], old[4200], path[4200];
	uint32_t prev = c->rd.model_round;
	uint8_t *st = NULL;
	size_t st_len = 0;
	fb_err rc;

	if (committed) {
		ck_path(c, ck_model, sizeof(ck_model), "model", c->rd.number);
		if ((rc = outputs_save_model(c, c->rd.r.test_accuracy,
		         ck_model)) != FB_OK ||
		    (rc = write_opt(c, c->rd.number)) != FB_OK) {
			return rc;
		}
		c->rd.model_round = c->rd.number;
	}
	if ((rc = checksum(c, c->params, c->param_count * 4, mh)) != FB_OK ||
	    (rc = opt_checksum(c, oh)) != FB_OK ||
	    (rc = state_bytes(c, mh, oh, line, len, &st, &st_len)) != FB_OK) {
		c->rd.model_round = prev;
		return rc;
	}
	ck_path(c, path, sizeof(path), "state", 0);
	rc = fb_file_write_atomic(path, &(fb_iovec){st, st_len}, 1);
	free(st);
	if (rc != FB_OK) {
		c->rd.model_round = prev;
		return rc;
	}
	if (committed) {
		if ((rc = export_model(c, ck_model)) != FB_OK) {
			return rc;
		}
		if (prev != 0 && prev != c->rd.number) {
			ck_path(c, old, sizeof(old), "model", prev);
			(void)unlink(old);
			ck_path(c, old, sizeof(old), "opt", prev);
			(void)unlink(old);
		}
	}
	return FB_OK;
}

/* ---- reading it back ------------------------------------------------------ */

static fb_err
ck_refuse(const char *path, const char *why)
{
	fb_log_error("cannot resume from %s: %s", path, why);
	return FB_EFORMAT;
}

/* Reads the optimiser file of round M into the optimiser's state. */
static fb_err
read_opt(coord *c, uint32_t round, uint32_t vectors)
{
	char path[4200];
	float *m = NULL, *v = NULL;
	uint32_t n = opt_vectors(c, &m, &v);
	uint8_t *buf = NULL, head[24];
	size_t len = 0;
	fb_err rc;

	if (vectors != n) {
		fb_log_error("cannot resume: the checkpoint holds %u optimiser "
		             "vectors, aggregation.rule %s keeps %u (was the rule "
		             "changed?)", vectors, fb_rule_names[c->cfg->rule], n);
		return FB_EFORMAT;
	}
	if (n == 0 || round == 0) {
		/* none, or nothing committed yet: the initial state stands
		 * (the state file's checksum still checks it) */
		return FB_OK;
	}
	ck_path(c, path, sizeof(path), "opt", round);
	if ((rc = fb_file_read_all(path, &buf, &len)) != FB_OK) {
		return rc;
	}
	memcpy(head, buf, len < sizeof(head) ? len : sizeof(head));
	if (len != sizeof(head) + (size_t)n * c->param_count * 4 ||
	    memcmp(head, OPT_MAGIC, 8) != 0 || fb_load_le32(head + 8) != n ||
	    fb_load_le64(head + 16) != c->param_count) {
		fb_free(buf);
		return ck_refuse(path, "not this model's optimiser state");
	}
	memcpy(m, buf + sizeof(head), c->param_count * 4);
	if (v != NULL) {
		memcpy(v, buf + sizeof(head) + c->param_count * 4,
		    c->param_count * 4);
	}
	fb_free(buf);
	return FB_OK;
}

/* Checks the state file's frame and its own checksum. */
static fb_err
state_check(const char *path, const uint8_t *b, size_t len, coord *c)
{
	uint8_t h[FB_HASH_LEN];
	size_t line_len;

	if (len < CK_HEAD + FB_HASH_LEN || memcmp(b, CK_MAGIC, 8) != 0) {
		return ck_refuse(path, "not a fedbox checkpoint");
	}
	line_len = fb_load_le32(b + 168);
	if (fb_load_le32(b + 8) != len ||
	    line_len != len - CK_HEAD - FB_HASH_LEN) {
		return ck_refuse(path, "truncated or padded");
	}
	fb_hash(b, CK_HEAD + line_len, h);
	if (memcmp(h, b + CK_HEAD + line_len, FB_HASH_LEN) != 0) {
		return ck_refuse(path, "its checksum does not match: corrupt");
	}
	if (fb_load_le64(b + 88) != c->param_count) {
		fb_log_error("cannot resume from %s: it holds a model of %" PRIu64
		             " parameters, the config's has %" PRIu64,
		    path, fb_load_le64(b + 88), c->param_count);
		return FB_ECONFIG;
	}
	return FB_OK;
}

/* Restores the model (M > 0) and checks it against the checksum. */
static fb_err
restore_model(coord *c, uint32_t m, const uint8_t want[FB_HASH_LEN])
{
	char path[4200];
	uint8_t h[FB_HASH_LEN];
	uint32_t round = 0;
	fb_err rc;

	if (m == 0) {
		/* nothing committed yet: the seed's initial model */
		fb_model_init_params(c->model, c->params, (uint64_t)c->cfg->seed);
	} else {
		ck_path(c, path, sizeof(path), "model", m);
		if ((rc = fb_model_load_safetensors(c->model, path, c->params,
		         &round)) != FB_OK) {
			fb_log_error("cannot resume from %s: %s", path,
			    fb_strerror(rc));
			return rc;
		}
	}
	if ((rc = checksum(c, c->params, c->param_count * 4, h)) != FB_OK) {
		return rc;
	}
	if (memcmp(h, want, FB_HASH_LEN) != 0) {
		ck_path(c, path, sizeof(path), "model", m);
		return ck_refuse(path, "the model's floats do not match the "
		                       "checkpoint's checksum: corrupt");
	}
	return FB_OK;
}

/*
 * checkpoint_read restores the state after the last recorded round R:
 * model, optimiser state (checked against their checksums), RNG, run id,
 * counters; *first = R + 1. The round's metrics line is kept in
 * c->rd.resume_line for outputs_begin. Errors: FB_EIO (no checkpoint),
 * FB_EFORMAT (corrupt or not this model's, logged with the reason),
 * FB_ECONFIG (another model), FB_ENOMEM.
 */
fb_err
checkpoint_read(coord *c, uint32_t *first)
{
	char path[4200];
	uint8_t *b = NULL;
	size_t len = 0;
	uint8_t oh[FB_HASH_LEN];
	uint64_t bits;
	fb_err rc;

	ck_path(c, path, sizeof(path), "state", 0);
	if ((rc = fb_file_read_all(path, &b, &len)) != FB_OK) {
		fb_log_error("cannot resume: no checkpoint at %s", path);
		return rc;
	}
	if ((rc = state_check(path, b, len, c)) != FB_OK ||
	    (rc = restore_model(c, fb_load_le32(b + 36), b + 104)) != FB_OK ||
	    (rc = read_opt(c, fb_load_le32(b + 36), fb_load_le32(b + 96))) !=
	        FB_OK ||
	    (rc = opt_checksum(c, oh)) != FB_OK) {
		goto out;
	}
	if (memcmp(oh, b + 136, FB_HASH_LEN) != 0) {
		rc = ck_refuse(path, "the optimiser state does not match its "
		                     "checksum: corrupt");
		goto out;
	}
	memcpy(c->run.b, b + 16, FB_RUN_ID_LEN);
	memcpy(&c->run_id, c->run.b, sizeof(c->run_id));
	c->rd.number = fb_load_le32(b + 32);
	c->rd.model_round = fb_load_le32(b + 36);
	c->rd.committed = fb_load_le32(b + 40);
	for (int i = 0; i < 4; i++) {
		c->rng.s[i] = fb_load_le64(b + 48 + 8 * i);
	}
	bits = fb_load_le64(b + 80);
	memcpy(&c->rd.tau_eff, &bits, sizeof(bits));
	free(c->rd.resume_line);
	c->rd.resume_line_len = fb_load_le32(b + 168);
	if ((c->rd.resume_line = malloc(c->rd.resume_line_len + 1)) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	memcpy(c->rd.resume_line, b + CK_HEAD, c->rd.resume_line_len);
	c->rd.resume_line[c->rd.resume_line_len] = '\0';
	*first = c->rd.number + 1;
	fb_log_info("resuming after round %u (the model of round %u, %u "
	            "committed) from %s",
	    c->rd.number, c->rd.model_round, c->rd.committed, path);
out:
	free(b);
	return rc;
}

/* After a resume: model.safetensors is the checkpoint's model again (a
 * kill may have come between the state and the export). */
fb_err
checkpoint_export(coord *c)
{
	char ck_model[4200];

	if (c->rd.model_round == 0) {
		return FB_OK;
	}
	ck_path(c, ck_model, sizeof(ck_model), "model", c->rd.model_round);
	return export_model(c, ck_model);
}

/* Whether OUTPUT_DIR holds a checkpoint; *round its last round. */
bool
checkpoint_exists(const coord *c, uint32_t *round)
{
	char path[4200];
	uint8_t head[40];
	FILE *f;
	bool ok;

	*round = 0;
	ck_path(c, path, sizeof(path), "state", 0);
	if ((f = fopen(path, "rb")) == NULL) {
		return false;
	}
	ok = fread(head, 1, sizeof(head), f) == sizeof(head);
	fclose(f);
	if (ok) {
		*round = fb_load_le32(head + 32);
	}
	return true;
}

/*
 * checkpoint_prune removes the model and optimiser files of rounds other
 * than the state's (c->rd.model_round, set by checkpoint_read): a run
 * killed between writing a round's files and the state, or between the
 * state and the previous files' removal, leaves one model's worth behind
 * each time. Returns how many went.
 */
unsigned
checkpoint_prune(const coord *c)
{
	char dir[4200], path[4200 + 256];
	unsigned n = 0;
	DIR *d;
	struct dirent *e;

	snprintf(dir, sizeof(dir), "%s/checkpoint", c->cfg->output_dir);
	if ((d = opendir(dir)) == NULL) {
		return 0;
	}
	while ((e = readdir(d)) != NULL) {
		unsigned r;
		char ext[16];
		int end = 0;
		if ((sscanf(e->d_name, "model-%u.%15[a-z]%n", &r, ext, &end) !=
		            2 ||
		        strcmp(ext, "safetensors") != 0) &&
		    (sscanf(e->d_name, "opt-%u.%15[a-z]%n", &r, ext, &end) !=
		            2 ||
		        strcmp(ext, "bin") != 0)) {
			continue;
		}
		if (e->d_name[end] != '\0' || r == c->rd.model_round) {
			continue;
		}
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		n += unlink(path) == 0;
	}
	closedir(d);
	return n;
}

/* Removes a fresh start's leftovers: every checkpoint file. */
void
checkpoint_clear(const coord *c)
{
	char dir[4200];

	snprintf(dir, sizeof(dir), "%s/checkpoint", c->cfg->output_dir);
	fb_remove_matching(dir, NULL);
}

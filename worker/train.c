/* SPDX-License-Identifier: Apache-2.0 */
/*
 * train.c -- the trainer front end: picks a backend (the built-in CPU one,
 * or the CUDA one from libfedbox-cuda.so loaded at run time, so that one
 * worker binary runs on machines with and without GPUs), and the batch
 * order every backend shares.
 *
 * The CUDA library is looked for in $FEDBOX_CUDA_LIB, else next to the
 * running executable (/proc/self/exe), else in ../lib/fedbox/ from there
 * (where `make install` and the packages put it). With device "auto" any
 * failure to load or open it falls back to the CPU and says why; with
 * device "cuda" it is an error. A trainer-process config (train.command)
 * takes precedence over both: the user's program trains, on whatever
 * device it picks.
 */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "worker/trainer.h"

struct fb_trainer {
	const fb_trainer_backend *be;
	void *state; /* owned: be->open / be->close */
	void *dl;    /* owned: the CUDA library, or NULL */
};

typedef const fb_trainer_backend *(*cuda_backend_fn)(void);

/* proc_open opens the trainer-process backend on `t` per `pc`. */
static fb_err
proc_open(fb_trainer *t, const fb_model *m, const fb_dataset *shard,
    const fb_trainer_config *cfg, const fb_trainer_proc_config *pc,
    uint32_t max_batch)
{
	fb_trainer_config c = *cfg;
	char desc[256];
	fb_err rc;

	c.proc = pc;
	rc = fb_trainer_proc_backend.open(m, shard, &c, max_batch, &t->state);
	if (rc != FB_OK) {
		t->state = NULL;
		return rc;
	}
	t->be = &fb_trainer_proc_backend;
	t->be->describe(t->state, desc, sizeof(desc));
	fb_log_info("backend: %s", desc);
	return FB_OK;
}

/*
 * cuda_library_path finds where libfedbox-cuda.so is: $FEDBOX_CUDA_LIB as
 * given, else next to the running executable (a build tree), else in
 * ../lib/fedbox/ from it (an installed tree, PREFIX/bin and
 * PREFIX/lib/fedbox). Without the variable and with neither file there, it
 * writes the first place to `buf` and the places looked at to `tried`.
 */
static void
cuda_library_path(char *buf, size_t len, char *tried, size_t tried_len)
{
	const char *env = getenv("FEDBOX_CUDA_LIB");
	char exe[PATH_MAX];
	char alt[PATH_MAX + 64];
	ssize_t n;
	char *slash;

	tried[0] = '\0';
	if (env != NULL && env[0] != '\0') {
		snprintf(buf, len, "%s", env);
		return;
	}
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0) {
		snprintf(buf, len, "%s", FB_TRAINER_CUDA_LIBRARY);
		return;
	}
	exe[n] = '\0';
	slash = strrchr(exe, '/');
	if (slash != NULL) {
		*slash = '\0';
	}
	snprintf(buf, len, "%s/%s", exe, FB_TRAINER_CUDA_LIBRARY);
	if (access(buf, F_OK) == 0) {
		return;
	}
	snprintf(alt, sizeof(alt), "%s/../lib/fedbox/%s", exe,
	    FB_TRAINER_CUDA_LIBRARY);
	if (access(alt, F_OK) == 0) {
		snprintf(buf, len, "%s", alt);
		return;
	}
	snprintf(tried, tried_len, " (looked for %s and %s)", buf, alt);
}

/*
 * cuda_open loads the CUDA backend and opens it on `t`. On failure it
 * writes the reason to `why` and returns FB_ENOTSUP (no library, no
 * device) or the backend's own error.
 */
static fb_err
cuda_open(fb_trainer *t, const fb_model *m, const fb_dataset *shard,
    const fb_trainer_config *cfg, uint32_t max_batch, char *why, size_t why_len)
{
	fb_err rc = FB_OK;
	char path[PATH_MAX + 64];
	char tried[2 * PATH_MAX + 160];
	cuda_backend_fn fn;
	const fb_trainer_backend *be;
	void *dl = NULL, *sym;

	cuda_library_path(path, sizeof(path), tried, sizeof(tried));
	dlerror();
	/* Never unmapped: CUDA's runtime and libstdc++ under it keep state
	 * (atexit handlers, the exception pool) that must outlive a probe
	 * that finds no device, or the process faults or leaks at exit. */
	if ((dl = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)) ==
	    NULL) {
		if (tried[0] != '\0') {
			snprintf(why, why_len, "no CUDA backend library%s",
			    tried);
		} else {
			/* There, but it or a library it needs (CUDA's
			 * runtime) does not load. */
			snprintf(why, why_len, "cannot load the CUDA backend "
			    "%s: %s", path, dlerror());
		}
		rc = FB_ENOTSUP;
		goto out;
	}
	if ((sym = dlsym(dl, FB_TRAINER_CUDA_SYMBOL)) == NULL) {
		snprintf(why, why_len, "%s has no %s: %s", path,
		    FB_TRAINER_CUDA_SYMBOL, dlerror());
		rc = FB_ENOTSUP;
		goto out;
	}
	*(void **)&fn = sym;
	if ((be = fn()) == NULL || be->open == NULL || be->close == NULL ||
	    be->train == NULL || be->set_params == NULL ||
	    be->get_params == NULL) {
		snprintf(why, why_len, "%s returned no usable backend", path);
		rc = FB_ENOTSUP;
		goto out;
	}
	if ((rc = be->open(m, shard, cfg, max_batch, &t->state)) != FB_OK) {
		if (rc == FB_ENOTSUP) {
			snprintf(why, why_len, "no CUDA device");
		} else {
			snprintf(why, why_len,
			    "CUDA backend failed to open: "
			    "%s",
			    fb_strerror(rc));
		}
		t->state = NULL;
		goto out;
	}
	t->be = be;
	t->dl = dl;
	dl = NULL;
out:
	if (dl != NULL) {
		dlclose(dl);
	}
	return rc;
}

fb_err
fb_trainer_open(const fb_model *m, const fb_dataset *shard,
    const fb_trainer_config *cfg, uint32_t max_batch, fb_trainer **out)
{
	fb_err rc = FB_OK;
	fb_trainer *t = NULL;
	char why[PATH_MAX * 2];
	const fb_trainer_proc_config *pc = cfg->proc;

	*out = NULL;
	if (cfg->device != FB_DEVICE_AUTO && cfg->device != FB_DEVICE_CPU &&
	    cfg->device != FB_DEVICE_CUDA) {
		fb_log_error("trainer: unknown device %d", cfg->device);
		rc = FB_EINVAL;
		goto out;
	}
	if (pc != NULL && pc->argc > 0) {
		/* The model need not train here: the trainer's program does. */
		if ((t = fb_calloc(1, sizeof(*t))) == NULL) {
			rc = FB_ENOMEM;
			goto out;
		}
		rc = proc_open(t, m, shard, cfg, pc, max_batch);
		if (rc != FB_OK) {
			goto out;
		}
		goto done;
	}
	if (fb_model_get_ops(m)->forward_backward == NULL) {
		fb_log_error("trainer: model %s cannot train",
		    fb_model_get_ops(m)->name);
		rc = FB_ENOTSUP;
		goto out;
	}
	if ((t = fb_calloc(1, sizeof(*t))) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	if (cfg->device != FB_DEVICE_CPU) {
		rc = cuda_open(t, m, shard, cfg, max_batch, why, sizeof(why));
		if (rc == FB_OK) {
			char desc[256];
			t->be->describe(t->state, desc, sizeof(desc));
			fb_log_info("backend: cuda (%s)", desc);
			goto done;
		}
		if (cfg->device == FB_DEVICE_CUDA) {
			fb_log_error("trainer: device cuda requested but "
			             "unavailable: %s",
			    why);
			goto out;
		}
		fb_log_info("backend: cpu (%s)", why);
	} else {
		fb_log_info("backend: cpu (requested)");
	}
	rc = fb_trainer_cpu_backend.open(m, shard, cfg, max_batch, &t->state);
	if (rc != FB_OK) {
		t->state = NULL;
		goto out;
	}
	t->be = &fb_trainer_cpu_backend;
done:
	*out = t;
	t = NULL;
out:
	fb_trainer_close(t);
	return rc;
}

void
fb_trainer_close(fb_trainer *t)
{
	if (t == NULL) {
		return;
	}
	if (t->state != NULL) {
		t->be->close(t->state);
	}
	if (t->dl != NULL) {
		dlclose(t->dl);
	}
	fb_free(t);
}

fb_err
fb_trainer_set_params(fb_trainer *t, const float *params)
{
	return t->be->set_params(t->state, params);
}

fb_err
fb_trainer_train(fb_trainer *t, const fb_train_opts *opts,
    fb_train_stats *stats, const atomic_int *cancel)
{
	return t->be->train(t->state, opts, stats, cancel);
}

fb_err
fb_trainer_get_params(fb_trainer *t, float *params)
{
	return t->be->get_params(t->state, params);
}

const char *
fb_trainer_backend_name(const fb_trainer *t)
{
	return t->be->name;
}

void
fb_trainer_describe(const fb_trainer *t, char *buf, size_t len)
{
	if (t->be->describe != NULL) {
		t->be->describe(t->state, buf, len);
	} else {
		snprintf(buf, len, "%s", t->be->name);
	}
}

fb_err
fb_trainer_mask_apply(fb_trainer *t, uint32_t *v, uint64_t offset,
    uint64_t count, const fb_mask_term *terms, uint32_t nterms,
    uint32_t round)
{
	if (t->be->mask_apply == NULL) {
		return FB_ENOTSUP;
	}
	return t->be->mask_apply(
	    t->state, v, offset, count, terms, nterms, round);
}

bool
fb_trainer_has_mask(const fb_trainer *t)
{
	return t->be->mask_apply != NULL;
}

/* mix64 is splitmix64's finaliser: a bijection that spreads bits. */
static uint64_t
mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

void
fb_train_batch_order(uint64_t seed, uint32_t round, uint32_t worker_index,
    uint64_t epoch, uint32_t *order, uint32_t shard_count)
{
	fb_rng r;
	/* stream = f(round, worker, epoch): (round, worker) packs into 64
	 * bits exactly; epoch is mixed in through a second bijection. */
	uint64_t stream = mix64(((uint64_t)round << 32) | worker_index) ^
	                  mix64(epoch + 0x9e3779b97f4a7c15ULL);

	for (uint32_t i = 0; i < shard_count; i++) {
		order[i] = i;
	}
	fb_rng_init(&r, seed, stream);
	fb_rng_shuffle_u32(&r, order, shard_count);
}

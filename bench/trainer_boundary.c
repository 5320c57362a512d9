/* SPDX-License-Identifier: Apache-2.0 */
/*
 * trainer_boundary.c -- what the process boundary costs a round: handing
 * the model to a trainer process and taking its parameters back
 * (worker/proc/), side by side with one memcpy of the model in the same
 * run.
 *
 *   build/bench/trainer_boundary [--params N] [--rounds R] [--python PY]
 *
 * A round is what the worker's training thread does with the backend:
 * set_params (the global model into the shared memory), train (the task
 * to the trainer, its answer back, the answer checked) and get_params (the
 * parameters out of the shared memory, each value checked for NaN and
 * infinity as it is copied), with the copies on one thread and on the
 * backend's automatic count. The trainer (bench/boundary_trainer.py, the
 * real python/fedbox) does no training steps: it answers with what it was
 * given, either in place (`views`: the task's own tensors, no copy on its
 * side) or through a torch module (`module`: load_into copies the model
 * into an nn.Module, finish copies it back), which is what a CPU trainer
 * script pays on top. One untimed warm-up round per trainer (its start,
 * first touches of the shared memory). Each round times a memcpy of the
 * model (4 N bytes between two warm buffers of this process) and then one
 * round of each trainer, so that a shared machine's changing load falls on
 * all alike. The table gives medians over R rounds; the verdict is the
 * median of the per-round ratios (round trip / that round's memcpy).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "model/model.h"
#include "worker/proc/proc_impl.h"
#include "worker/trainer.h"

#define MAX_ROUNDS 101

typedef struct times {
	double set[MAX_ROUNDS], train[MAX_ROUNDS], get[MAX_ROUNDS];
	double total[MAX_ROUNDS];
} times;

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double
median(const double *v, int n)
{
	double s[MAX_ROUNDS];
	memcpy(s, v, (size_t)n * sizeof(double));
	qsort(s, (size_t)n, sizeof(double), cmp_double);
	return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

/* open_trainer starts a trainer process in `mode` with copies on
 * `threads` threads (0: the backend's choice). */
static fb_err
open_trainer(const fb_model *m, const char *python, const char *mode,
    uint32_t threads, fb_trainer **out)
{
	const char *argv[] = {python, "bench/boundary_trainer.py", mode};
	const char *env[] = {"PYTHONPATH=python"};
	fb_trainer_proc_config pc = {.argv = argv,
	    .argc = 3,
	    .env = env,
	    .env_count = 1,
	    .start_timeout_ms = 120000,
	    .task_timeout_ms = 600000,
	    .copy_threads = threads};
	fb_trainer_config cfg = {
	    .device = FB_DEVICE_CPU, .throttle = 1, .proc = &pc};

	/* The backend copies what it needs of pc before returning. */
	return fb_trainer_open(m, NULL, &cfg, 1, out);
}

/* one_round times one round of trainer `tr`; index r < 0 is a warm-up. */
static fb_err
one_round(fb_trainer *tr, const float *global, float *local, int r, times *t)
{
	fb_train_opts o = {.steps = 1, .batch = 1, .lr = 0.1f};
	fb_train_stats st;
	atomic_int cancel = 0;
	double t0 = fb_now_s(), t1, t2, t3;
	fb_err rc;

	o.round = (uint32_t)(r + 2);
	if ((rc = fb_trainer_set_params(tr, global)) != FB_OK) {
		return rc;
	}
	t1 = fb_now_s();
	if ((rc = fb_trainer_train(tr, &o, &st, &cancel)) != FB_OK) {
		return rc;
	}
	t2 = fb_now_s();
	if ((rc = fb_trainer_get_params(tr, local)) != FB_OK) {
		return rc;
	}
	t3 = fb_now_s();
	if (r >= 0) {
		t->set[r] = t1 - t0;
		t->train[r] = t2 - t1;
		t->get[r] = t3 - t2;
		t->total[r] = t3 - t0;
	}
	return FB_OK;
}

static void
row(const char *what, double s, double base)
{
	printf("| %s | %.1f | %.2f |\n", what, s * 1e3, s / base);
}

int
main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"params", required_argument, NULL, 'n'},
	    {"rounds", required_argument, NULL, 'r'},
	    {"python", required_argument, NULL, 'p'},
	    {"threads", required_argument, NULL, 't'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	uint64_t n = 100000000;
	int rounds = 7, ch;
	uint32_t threads = 0;
	const char *python = "/usr/bin/python3";
	double copy[MAX_ROUNDS], base, ratio[3][MAX_ROUNDS];
	double shm_copy[MAX_ROUNDS], priv_checked[MAX_ROUNDS];
	float *shm;
	int shm_fd;
	fb_trainer *tr[3] = {NULL, NULL, NULL};
	uint32_t auto_threads;
	fb_model_spec spec;
	fb_model *m = NULL;
	float *global, *local;
	fb_rng rng;
	times t[3];

	fb_log_init("trainer_boundary", FB_LOG_WARN);
	while ((ch = getopt_long(argc, argv, "n:r:p:t:h", opts, NULL)) != -1) {
		switch (ch) {
		case 'n':
			n = (uint64_t)strtod(optarg, NULL);
			break;
		case 'r':
			rounds = atoi(optarg);
			break;
		case 'p':
			python = optarg;
			break;
		case 't':
			threads = (uint32_t)atoi(optarg);
			break;
		case 'h':
			printf(
			    "usage: build/bench/trainer_boundary [--params N] "
			    "[--rounds R] [--python PY]\n"
			    "Run from the repository root: the trainer is "
			    "bench/boundary_trainer.py.\n");
			return 0;
		default:
			return 2;
		}
	}
	if (n < 1 || rounds < 1 || rounds > MAX_ROUNDS) {
		fprintf(stderr, "--params >= 1, --rounds 1..%d\n", MAX_ROUNDS);
		return 2;
	}
	memset(&spec, 0, sizeof(spec));
	strcpy(spec.arch, "synthetic");
	spec.synthetic_params = n;
	if (fb_model_open(&spec, &m) != FB_OK) {
		return 1;
	}
	global = fb_alloc(n * sizeof(float));
	local = fb_alloc(n * sizeof(float));
	if (global == NULL || local == NULL) {
		fprintf(stderr, "out of memory for 2 x %llu floats\n",
		    (unsigned long long)n);
		return 1;
	}
	fb_rng_init(&rng, 1, 2);
	for (uint64_t i = 0; i < n; i++) {
		global[i] = (float)fb_rng_normal(&rng);
	}
	memset(local, 0, n * sizeof(float));
	for (int k = 0; k < 3; k++) {
		if (open_trainer(m, python, k == 2 ? "module" : "views",
		        k == 0 ? 1 : threads, &tr[k]) != FB_OK) {
			fprintf(stderr, "cannot start trainer %d\n", k);
			return 1;
		}
	}
	/* Interleaved: each round a memcpy, then each trainer, so that a
	 * shared machine's changing load falls on all of them alike; the
	 * ratios are taken per round. */
	shm_fd = memfd_create("bench", MFD_CLOEXEC);
	if (shm_fd < 0 || ftruncate(shm_fd, (off_t)(n * sizeof(float))) != 0 ||
	    (shm = mmap(NULL, n * sizeof(float), PROT_READ | PROT_WRITE,
	         MAP_SHARED, shm_fd, 0)) == MAP_FAILED) {
		fprintf(stderr, "no shared memory for the comparison\n");
		return 1;
	}
	(void)madvise(shm, n * sizeof(float), MADV_HUGEPAGE);
	for (int r = -1; r < rounds; r++) {
		double t0 = fb_now_s();
		memcpy(local, global, n * sizeof(float));
		if (r >= 0) {
			copy[r] = fb_now_s() - t0;
		}
		for (int k = 0; k < 3; k++) {
			if (one_round(tr[k], global, local, r, &t[k]) !=
			    FB_OK) {
				fprintf(
				    stderr, "trainer %d: a round failed\n", k);
				return 1;
			}
			/* The trainers answer with what they got. */
			if (memcmp(global, local, n * sizeof(float)) != 0) {
				fprintf(stderr,
				    "trainer %d: parameters changed "
				    "on the way\n",
				    k);
				return 1;
			}
		}
		if (r >= 0) {
			for (int k = 0; k < 3; k++) {
				ratio[k][r] = t[k].total[r] / copy[r];
			}
		}
		/* Where the copies' time goes: memory of the kind the trainer
		 * shares, and the checked copy between private buffers. */
		t0 = fb_now_s();
		memcpy(shm, global, n * sizeof(float));
		memcpy(local, shm, n * sizeof(float));
		if (r >= 0) {
			shm_copy[r] = (fb_now_s() - t0) / 2 / copy[r];
		}
		t0 = fb_now_s();
		(void)fb_proc_copy_checked(local, global, n);
		if (r >= 0) {
			priv_checked[r] = (fb_now_s() - t0) / copy[r];
		}
	}
	for (int k = 0; k < 3; k++) {
		fb_trainer_close(tr[k]);
	}
	base = median(copy, rounds);
	auto_threads = fb_proc_copy_threads(n, threads);
	printf("N = %llu float32 parameters (%.0f MB), median of %d rounds; "
	       "%ld CPUs here, copies on 1 thread, then on %u\n\n",
	    (unsigned long long)n, (double)n * 4 / 1e6, rounds,
	    sysconf(_SC_NPROCESSORS_ONLN), auto_threads);
	printf("| step | ms | x memcpy |\n|---|---|---|\n");
	row("memcpy of the model, one thread (the yardstick)", base, base);
	for (int k = 0; k < 2; k++) {
		char what[160];
		char th[32];
		snprintf(th, sizeof(th), "%u thread%s",
		    k == 0 ? 1 : auto_threads,
		    k == 0 || auto_threads == 1 ? "" : "s");
		snprintf(what, sizeof(what),
		    "set_params: into the shared "
		    "memory (%s)",
		    th);
		row(what, median(t[k].set, rounds), base);
		snprintf(what, sizeof(what),
		    "train: task out, answer back, "
		    "checked (trainer answers in place)");
		row(what, median(t[k].train, rounds), base);
		snprintf(what, sizeof(what),
		    "get_params: checked copy out "
		    "(%s)",
		    th);
		row(what, median(t[k].get, rounds), base);
		snprintf(what, sizeof(what),
		    "**the boundary, one round "
		    "trip, %s**",
		    th);
		row(what, median(t[k].total, rounds), base);
	}
	row("train with a torch module in the trainer (load_into and "
	    "finish copy)",
	    median(t[2].train, rounds), base);
	row("round trip with a torch module in the trainer (2nd copy setting)",
	    median(t[2].total, rounds), base);
	printf("\nper-round ratio of the round trip to that round's memcpy, "
	       "median [min, max]:\n");
	for (int k = 0; k < 3; k++) {
		double lo = ratio[k][0], hi = ratio[k][0];
		for (int r = 1; r < rounds; r++) {
			lo = ratio[k][r] < lo ? ratio[k][r] : lo;
			hi = ratio[k][r] > hi ? ratio[k][r] : hi;
		}
		printf("- %s: %.2f [%.2f, %.2f]\n",
		    k == 0   ? "in place, copies on 1 thread"
		    : k == 1 ? "in place, copies on the 2nd setting"
		             : "torch module in the trainer",
		    median(ratio[k], rounds), lo, hi);
	}
	printf("- for comparison, memcpy into and out of a memfd like the "
	       "trainer's: %.2f per copy\n",
	    median(shm_copy, rounds));
	printf("- for comparison, the checked copy between two private "
	       "buffers: %.2f\n",
	    median(priv_checked, rounds));
	for (int k = 0; k < 2; k++) {
		double x = median(ratio[k], rounds);
		printf("%sverdict, copies on %u thread(s): the boundary costs "
		       "%.2fx one memcpy of the model (target: at most 2x): "
		       "%s\n",
		    k == 0 ? "\n" : "", k == 0 ? 1 : auto_threads, x,
		    x <= 2.0 ? "held" : "NOT held");
	}
	munmap(shm, n * sizeof(float));
	close(shm_fd);
	fb_free(global);
	fb_free(local);
	fb_model_close(m);
	return 0;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * aggregation.h -- streaming weighted sums in fixed point.
 *
 * The coordinator adds every update into ONE accumulator as its chunks
 * arrive, so its memory is O(model) whatever the number of workers. Values
 * are encoded in the ring Z_2^32 (the same ring secure aggregation masks
 * in): a coordinate x of an update with weight w becomes
 *     q = round_half_away(w_q * clamp(x, -clip, clip) * S),  S = 2^30 / clip,
 * where w_q is w rounded down to a multiple of 2^-32. Integer addition commutes,
 * so the sum (and the model) does not depend on the order in which updates
 * arrive.
 *
 * No overflow, by construction: the weights added into any chunk sum to at
 * most 1 (the accumulator refuses more, FB_ERANGE), so the exact sum is at
 * most 2^30 in magnitude, plus at most 1/2 per update from rounding; with
 * fewer than 2^29 updates this stays below 2^31.
 *
 * Quantisation bound: each added value is within 1/2 of its exact w_q*x*S,
 * which puts a chunk's mean (sum / (W_q*S)) within K * clip / (2^31 * W)
 * of the weighted mean under the truncated weights w_q; truncating each
 * weight by less than 2^-32 moves that mean by at most another
 * K * 2^-32 * 2 * clip / W. Together: the mean is within
 *     K * clip / (2^30 * W)
 * of the exact weighted mean of the clamped values, W the chunk's weight
 * sum and K the number of updates added (plus the float32 rounding of the
 * result). With clip 16, W = 1 and K = 8 that is 1.2e-7.
 *
 * An update interrupted mid-stream (worker lost, deadline, bad chunk) keeps
 * the chunks already added: each chunk remembers its own weight sum, and
 * each coordinate is averaged over the updates that contributed to it.
 */
#ifndef FB_AGGREGATION_AGGREGATION_H
#define FB_AGGREGATION_AGGREGATION_H

#include <stdint.h>

#include "common/err.h"

typedef struct fb_accum fb_accum;
typedef struct fb_encoding fb_encoding;

/*
 * fb_accum_alloc makes an accumulator for vectors of `count` floats split in
 * chunks of `chunk_count_elems` elements (the last may be shorter), values
 * clamped to [-clip, clip] (1e-30 <= clip, finite). Errors: FB_EINVAL,
 * FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_accum_alloc(uint64_t count, uint64_t chunk_elems,
    double clip, fb_accum **out);

/* fb_accum_free releases it; NULL is a no-op. */
void fb_accum_free(fb_accum *a);

/* fb_accum_reset zeroes the sums and weights for a new round. It does not
 * touch the sums' memory: each part of a chunk reads as zero until its
 * first add of the round, which stores instead of adding. O(chunks). */
void fb_accum_reset(fb_accum *a);

uint32_t fb_accum_chunk_count(const fb_accum *a);
/* fb_accum_chunk_len returns the number of elements in chunk `chunk`. */
uint64_t fb_accum_chunk_len(const fb_accum *a, uint32_t chunk);

/*
 * fb_accum_add adds weight * x, x being chunk `chunk` of one update
 * (fb_accum_chunk_len(a, chunk) floats). A NaN or infinity in the chunk
 * is FB_EINVAL and leaves the sum and the chunk's weight as they were (the
 * add checks as it adds, then takes back what it added, exactly: the sum
 * is a ring; meanwhile the chunk's weight counts `weight`, so an add into
 * the same chunk at the same time may be refused with FB_ERANGE that would
 * have fitted without it); a weight that would bring the chunk's weight
 * sum above 1 is FB_ERANGE, nothing added. `weight` is
 * in (0, 1]; a weight below 2^-32 rounds to nothing and is FB_ERANGE.
 * *clipped (if non-NULL) is increased by the number of
 * coordinates that had to be clamped.
 *
 * Threads: fb_accum_add and fb_accum_ring_add may run at the same time on
 * any chunks, the same one included (they lock parts of the chunk; the sum
 * is the same bits whatever the interleaving), but not at the same time as
 * any other function on the accumulator.
 */
FB_MUST_CHECK fb_err fb_accum_add(fb_accum *a, uint32_t chunk, const float *x,
    double weight, uint64_t *clipped);

/* fb_accum_chunk_weight returns the weight sum added into `chunk`. */
double fb_accum_chunk_weight(const fb_accum *a, uint32_t chunk);

/*
 * Secure aggregation reuses the accumulator's ring: the coordinator adds
 * masked inputs (fb_encode_chunk + masks, crypto.h) with fb_accum_ring_add,
 * removes the masks there, and then fb_accum_set_secure_sum declares what
 * the ring now holds: sum_i q_i under encoding e (reduced mod 2^e->bits),
 * with total weight W = sum_i w_i (W > 0, finite). It sign-extends every
 * element from e->bits and sets each chunk's weight to W and the scale to
 * e->scale, so that fb_accum_mean_chunk and fb_server_opt_step
 * read sum / (W S), the weighted mean. fb_accum_reset undoes it. Errors:
 * FB_EINVAL (W or e), FB_ERANGE (W too large for the weight format).
 */
uint32_t *fb_accum_ring(fb_accum *a);

/*
 * fb_par_run runs fn(arg, i) for every i in [0, n), possibly several at
 * once on other threads, and returns when all are done (e.g. the
 * coordinator's ingest pool, fb_ingest_parallel).
 */
typedef void (*fb_par_run)(void *ctx, uint32_t n,
    void (*fn)(void *arg, uint32_t i), void *arg);

/*
 * fb_accum_set_parallel lets fb_accum_add and fb_accum_ring_add hand the
 * parts of a chunk to `run` (NULL: the calling thread adds them all).
 */
void fb_accum_set_parallel(fb_accum *a, fb_par_run run, void *ctx);

/*
 * fb_accum_ring_add adds a masked input's chunk `chunk` (n ring elements,
 * n = fb_accum_chunk_len(a, chunk)) into the ring, mod 2^32; threads as
 * fb_accum_add. Errors: FB_EINVAL (no such chunk, or n is not its length).
 */
FB_MUST_CHECK fb_err fb_accum_ring_add(fb_accum *a, uint32_t chunk,
    const uint32_t *v, uint64_t n);
FB_MUST_CHECK fb_err fb_accum_set_secure_sum(fb_accum *a,
    const fb_encoding *e, double W);

/* fb_ring_add adds n ring elements: sum[j] += v[j] mod 2^32. The arrays
 * must not overlap. */
void fb_ring_add(uint32_t *restrict sum, const uint32_t *restrict v,
    uint64_t n);

/* fb_accum_resolution returns 1/S, the value of one unit of the ring. */
double fb_accum_resolution(const fb_accum *a);

/*
 * fb_fedavg_weights fills w[i] = n[i] / sum(n) for `count` sample counts
 * (each > 0). Errors: FB_EINVAL (a zero count or count == 0).
 */
FB_MUST_CHECK fb_err fb_fedavg_weights(const uint64_t *n, uint32_t count,
    double *w);

/*
 * fb_staleness_weight is asynchronous aggregation's discount of an update
 * trained from a model `staleness` server steps old: 1 / sqrt(1 + s)
 * (FedBuff's polynomial weight with exponent 1/2), 1 for a fresh one.
 * Pure; never fails.
 */
double fb_staleness_weight(uint64_t staleness);

/*
 * fb_fedbuff_weights turns one buffer of `count` updates (sample counts
 * n[i] > 0, staleness[i] server steps each) into the accumulator's mixing
 * weights w[i] = n_i g(s_i) / sum_j n_j g(s_j) (summing to 1) and the step's
 * scale sum_j n_j g(s_j) / sum_j n_j (<= 1), so that scale times the
 * weighted mean is D = sum_i n_i g(s_i) update_i / sum_i n_i: a fresh
 * buffer is plain FedAvg, stale updates shrink the step as well as their
 * share. Errors: FB_EINVAL (count == 0 or a zero n; *scale = 0).
 */
FB_MUST_CHECK fb_err fb_fedbuff_weights(const uint64_t *n,
    const uint64_t *staleness, uint32_t count, double *w, double *scale);

/* ======================================================================== */
/*
 * Aggregation rules (rules.c): FedNova normalisation and server optimisers.
 *
 * Sign convention: a worker's update is x_global - x_local (it points
 * uphill), and the round's aggregated update is
 *     D = scale * mean,   mean = the accumulator's per-chunk weighted mean,
 * scale = 1 for FedAvg-style weighting and tau_eff for FedNova. A server
 * optimiser then moves the model against D (Reddi et al. 2021, "Adaptive
 * Federated Optimization", Algorithm 2, with their D negated):
 *     sgd  (FedAvg, FedNova)  x -= lr * D
 *     avgm (FedAvgM)          m = beta1 * m + D;                x -= lr * m
 *     adam (FedAdam)          m = beta1 * m + (1 - beta1) * D;
 *                             v = beta2 * v + (1 - beta2) * D^2;
 *                             x -= lr * m / (sqrt(v) + tau)
 *     yogi (FedYogi)          m as adam;
 *                             v = v - (1 - beta2) * D^2 * sign(v - D^2);
 *                             x -= lr * m / (sqrt(v) + tau)
 * State starts at m = 0 and v = tau^2 (the paper's v_{-1} >= tau^2, taken
 * with equality); there is no bias correction (the paper has none). A chunk
 * that received no weight this round leaves its coordinates of x, m and v
 * untouched (momentum does not decay where nobody reported).
 *
 * FedNova (Wang et al. 2020, "Tackling the Objective Inconsistency Problem
 * in Heterogeneous Federated Optimization"): worker i runs tau_i local steps
 * of SGD with PyTorch momentum rho (v = rho v + g; x -= lr v; v = 0 at round
 * start) on its loss plus an optional FedProx term mu/2 ||x - x_global||^2
 * (Li et al. 2020). Its update is then lr * sum_s a_s g_s (g_s the loss
 * gradients), with a_s depending only on tau_i - s:
 *     plain SGD       a_s = 1                            ||a||_1 = tau
 *     momentum        a_s = (1 - rho^(tau-s)) / (1 - rho)
 *                     ||a||_1 = (tau - rho (1 - rho^tau) / (1 - rho))
 *                               / (1 - rho)
 *     proximal        a_s = (1 - lr mu)^(tau-1-s)
 *                     ||a||_1 = (1 - (1 - lr mu)^tau) / (lr mu)
 *     both            a_s = -e_(tau-s) / lr, e_j the first component of
 *                     M^(j-1) (-lr, 1)^T, M = [[1 - lr mu, -lr rho],
 *                     [mu, rho]] (the local step as a linear map of
 *                     (x - x_global, velocity)); ||a||_1 = sum |a_s|.
 * The worker sends d_i = update_i / ||a_i||_1 with weight p_i = n_i / sum n;
 * the server steps with scale tau_eff = sum p_i ||a_i||_1 / sum p_i over the
 * updates included, i.e. x -= lr * tau_eff * mean(d) for sgd.
 */

#include <stdbool.h>

/*
 * fb_accum_mean_chunk writes chunk `chunk`'s weighted mean (0 everywhere if
 * it received no weight) into `out` (fb_accum_chunk_len(a, chunk) floats).
 * Errors: FB_EINVAL (no such chunk). Not thread-safe against fb_accum_add.
 */
FB_MUST_CHECK fb_err fb_accum_mean_chunk(const fb_accum *a, uint32_t chunk,
    float *out);

/*
 * fb_fednova_a_norm computes ||a||_1 for tau local steps (>= 1) with
 * momentum in [0, 1), local learning rate lr and proximal coefficient
 * prox_mu >= 0 (lr > 0 and lr * prox_mu < 1 when prox_mu > 0; lr is not
 * used otherwise), as above. O(1) without both momentum and prox_mu,
 * otherwise O(min(tau, steps until the impulse response underflows)).
 * *norm is 0 on error. Errors: FB_EINVAL.
 */
FB_MUST_CHECK fb_err fb_fednova_a_norm(uint64_t tau, double momentum,
    double lr, double prox_mu, double *norm);

/*
 * fb_fednova_normalise divides the `count` floats of an update by a_norm
 * (> 0, finite, from fb_fednova_a_norm) in place: the worker's d_i.
 * Errors: FB_EINVAL, update untouched.
 */
FB_MUST_CHECK fb_err fb_fednova_normalise(float *update, uint64_t count,
    double a_norm);

/*
 * fb_fednova_tau_eff computes sum p_i a_norm_i / sum p_i over `count`
 * updates (p_i > 0, a_norm_i > 0, all finite). In secure mode the
 * coordinator cannot see the terms: workers put a_norm_i / A (A a public
 * bound keeping it within the clip) in an extra coordinate of the masked
 * vector, whose accumulated mean is then tau_eff / A. Errors: FB_EINVAL
 * (*tau_eff = 0).
 */
FB_MUST_CHECK fb_err fb_fednova_tau_eff(const double *p, const double *a_norm,
    uint32_t count, double *tau_eff);

typedef enum fb_server_opt_kind {
	FB_SERVER_SGD = 0, /* x -= lr * D: FedAvg, FedNova */
	FB_SERVER_AVGM,    /* server momentum: FedAvgM */
	FB_SERVER_ADAM,    /* FedAdam */
	FB_SERVER_YOGI,    /* FedYogi */
	FB_SERVER_KIND_COUNT_
} fb_server_opt_kind;

/*
 * The server learning rate's schedule over the run's rounds t = 1 .. R:
 *     none    lr_t = lr
 *     cosine  lr_t = lr * (f + (1 - f) * (1 + cos(pi * (t - 1) / R)) / 2)
 * with f = lr_final, the fraction of lr the schedule falls to (cosine
 * annealing, Loshchilov and Hutter 2017, one cycle, no restart). Round 1
 * steps with lr; round R with lr * (f + (1 - f) * (1 - cos(pi / R)) / 2),
 * just above lr * f; rounds past R keep lr * f. Under label skew the
 * workers' updates disagree from round to round, and a server step of
 * constant size keeps the model moving among them; the decay lets the last
 * rounds settle, so that the final model is a good one rather than the
 * latest swing.
 */
typedef enum fb_server_lr_decay {
	FB_LR_DECAY_NONE = 0,
	FB_LR_DECAY_COSINE,
	FB_LR_DECAY_COUNT_
} fb_server_lr_decay;

/* fb_server_lr_decay_names: "none", "cosine", NULL-terminated, in enum
 * order (config names). */
extern const char *const fb_server_lr_decay_names[];

typedef struct fb_server_opt_params {
	fb_server_opt_kind kind;
	double lr;    /* server learning rate, > 0 */
	double beta1; /* avgm: momentum; adam, yogi: first moment; [0, 1) */
	double beta2; /* adam, yogi: second moment decay, [0, 1) */
	double tau;   /* adam, yogi: adaptivity (epsilon), > 0 */
	fb_server_lr_decay decay; /* the lr's schedule over `rounds` */
	double lr_final;  /* cosine: the fraction of lr it ends at, [0, 1] */
	uint64_t rounds;  /* cosine: the schedule's length R, >= 1 */
} fb_server_opt_params;

/*
 * fb_server_lr_at returns the scheduled server learning rate of round
 * `round` (1-based; 0 reads as 1) for params `p` (as above; p->lr for
 * FB_LR_DECAY_NONE). Pure; does not check p (fb_server_opt_alloc does).
 */
double fb_server_lr_at(const fb_server_opt_params *p, uint64_t round);

/*
 * fb_server_opt_params_default fills the defaults for `kind`: lr 1 (sgd,
 * avgm) or 0.01 (adam, yogi; Reddi et al. tune it in 10^-3 .. 10^0), beta1
 * 0.9, beta2 0.99, tau 1e-3 (the paper's defaults), no decay (lr_final 0,
 * rounds 1). With avgm the step on a steady D is lr / (1 - beta1) times D.
 */
void fb_server_opt_params_default(fb_server_opt_params *p,
    fb_server_opt_kind kind);

typedef struct fb_server_opt fb_server_opt;

/*
 * fb_server_opt_alloc makes an optimiser for models of `count` floats; it
 * keeps m (avgm, adam, yogi) and v (adam, yogi), count floats each, and
 * nothing else of model size. The parameters are copied. Errors:
 * FB_EINVAL (bad params or count == 0), FB_ENOMEM.
 */
FB_MUST_CHECK fb_err fb_server_opt_alloc(const fb_server_opt_params *p,
    uint64_t count, fb_server_opt **out);

/* fb_server_opt_free releases it; NULL is a no-op. */
void fb_server_opt_free(fb_server_opt *opt);

/* fb_server_opt_reset puts the state back to m = 0, v = tau^2. */
void fb_server_opt_reset(fb_server_opt *opt);

/*
 * fb_server_opt_set_round makes the next steps use round `round`'s
 * learning rate, fb_server_lr_at(params, round) (1-based); until it is
 * called they use round 1's. Not thread-safe against a step in progress:
 * call it before the round's fb_server_opt_step_chunks calls start.
 */
void fb_server_opt_set_round(fb_server_opt *opt, uint64_t round);

/* fb_server_opt_lr returns the learning rate the next step uses. */
double fb_server_opt_lr(const fb_server_opt *opt);

/*
 * fb_server_opt_state gives the state vectors (count floats each; NULL for
 * those the kind does not keep), owned by opt, so that a checkpoint can
 * save them and a resume restore them.
 */
void fb_server_opt_state(fb_server_opt *opt, float **m, float **v);

/*
 * fb_server_opt_step applies one round: D = scale * (chunk mean of `a`),
 * then the optimiser's update of its state and of params (count floats) in
 * place, chunk by chunk, straight from the accumulator's sums (no buffer).
 * scale is tau_eff for FedNova and 1 otherwise (> 0, finite). Chunks with
 * no weight are skipped. Errors: FB_EINVAL (bad scale, or `a` not of the
 * optimiser's count), nothing changed. Not thread-safe; does not block.
 */
FB_MUST_CHECK fb_err fb_server_opt_step(fb_server_opt *opt, const fb_accum *a,
    float *params, double scale);

/*
 * fb_server_opt_step_chunks is fb_server_opt_step over the chunks
 * first_chunk .. first_chunk + chunks - 1 only. Calls over disjoint chunk
 * ranges may run at the same time (each touches only its chunks of params
 * and of the state); one round's step is the union of such calls.
 * Errors: as fb_server_opt_step, and FB_EINVAL for a range past the end.
 */
FB_MUST_CHECK fb_err fb_server_opt_step_chunks(fb_server_opt *opt,
    const fb_accum *a, float *params, double scale, uint32_t first_chunk,
    uint32_t chunks);

/* The rules a config names (coordinator `rule:`); see fb_rule_names. */
typedef enum fb_rule {
	FB_RULE_FEDAVG = 0, /* sgd, scale 1 */
	FB_RULE_FEDNOVA,    /* sgd, workers normalise, scale tau_eff */
	FB_RULE_FEDAVGM,    /* avgm, scale 1 */
	FB_RULE_FEDADAM,    /* adam, scale 1 */
	FB_RULE_FEDYOGI,    /* yogi, scale 1 */
	FB_RULE_COUNT_
} fb_rule;

/* fb_rule_names lists the config names, NULL-terminated, in fb_rule
 * order: "fedavg", "fednova", "fedavgm", "fedadam", "fedyogi". */
extern const char *const fb_rule_names[];

/* fb_rule_parse maps a name of fb_rule_names to its rule (exact match).
 * Errors: FB_EINVAL (unknown or NULL; *rule left FB_RULE_FEDAVG). */
FB_MUST_CHECK fb_err fb_rule_parse(const char *name, fb_rule *rule);

/* fb_rule_server_kind returns the server optimiser `rule` uses. */
fb_server_opt_kind fb_rule_server_kind(fb_rule rule);

/* fb_rule_is_fednova says whether workers normalise by ||a_i||_1 and the
 * server scales by tau_eff. */
bool fb_rule_is_fednova(fb_rule rule);

/* ======================================================================== */
/*
 * Secure-aggregation encoding (encode.c, issue 4): what a worker puts into
 * the masked vector, and how the coordinator reads the unmasked sum.
 *
 * A coordinate x of an update with weight w in [0, w_max] becomes
 *     q = floor(w * clamp(x, -clip, clip) * S + u)  mod 2^bits,
 * u uniform in [0, 1) (stochastic rounding: E[q] = w * clamp(x) * S, up to
 * 2^-31 of a unit), from a counter-based generator keyed by a 64-bit seed
 * and the coordinate's index, so a chunk encodes the same whatever the
 * chunking. The seed should be fresh per worker and round (e.g. from
 * randombytes); the rounding noise only has to be unbiased and independent
 * of the data, not secret. Weights are public-bound fractions such as
 * n_i / N_bound (N_bound a public bound on a worker's sample count), so
 * w_max = 1 by default.
 *
 * No overflow, by construction: |q| <= w_max * clip * S + 1 for each
 * summand, so a sum of at most K_max summands has magnitude at most
 *     K_max * w_max * clip * S + K_max  <  2^(bits-1),
 * which fb_encoding_check demands (with a relative margin of 2^-40 that
 * covers the floating-point rounding of w * x * S + u). Every true sum is
 * then one residue in (-2^(bits-1), 2^(bits-1)), and decoding (the low
 * `bits` bits read as two's complement, divided by S) is exact. Each worker
 * enforces its own |x| <= clip and w <= w_max, so the bound holds whatever
 * the others send; the masked arithmetic mod 2^32 (crypto.h) cancels
 * exactly, and masked sums may wrap around the ring any number of times.
 * fb_encoding_init picks the largest power of two S that passes.
 *
 * Quantisation bound: each summand is within 1 unit (+2^-21 for the double
 * arithmetic) of w * clamp(x) * S, so the decoded sum of K summands is
 * within
 *     K * (1 + 2^-20) / S                   (fb_encoding_bound)
 * of sum_i w_i clamp(x_i); the error has mean 0 and standard deviation at
 * most sqrt(K) / (2 S). Example, bits 32, K_max 128, clip 16, w_max 1:
 * S = 2^19, bound 128 / 2^19 = 2.4e-4 on the weighted sum.
 *
 * Extra coordinates (the weight itself, a FedNova normaliser, ...) use
 * their own fb_encoding in the same ring with clip = the scalar's public
 * bound: the weight is encoded as x = 1 with weight w (clip 1, so S_w is
 * about 2^(bits-1) / K_max / w_max), a scalar a in [-A, A] as x = a with
 * weight w and clip A. The coordinator only ever sees their sums, and
 * computes the weighted mean as decode(sum x) / decode(sum w).
 */

/* Extra coordinates of a masked input after the model's P coordinates:
 * P + 0 the weight w (x = 1, clip 1), P + 1 w * train loss (clip
 * FB_SECAGG_LOSS_BOUND), P + 2 w * FedNova ||a||_1 (clip: the round's
 * public bound); then the federated evaluation of the round's global model,
 * weighted by v = validation examples / max_samples: P + 3 v (x = 1, clip
 * 1), P + 4 v * validation loss (clip FB_SECAGG_LOSS_BOUND), P + 5 v *
 * validation accuracy (clip 1). A worker without validation data sends
 * v = 0 there. */
#define FB_SECAGG_EXTRA 6
#define FB_SECAGG_EVAL_FIRST 3 /* index of v among the extras */
#define FB_SECAGG_LOSS_BOUND 1000.0

#define FB_ENCODE_BITS_MIN 16
#define FB_ENCODE_BITS_MAX 32

struct fb_encoding {
	uint32_t bits;        /* ring Z_2^bits, 16..32 (default 32) */
	uint32_t max_workers; /* K_max >= 1: the most summands in one sum */
	double clip;          /* values are clamped to [-clip, clip]; > 0 */
	double w_max;         /* weights lie in [0, w_max]; > 0 (default 1) */
	double scale;         /* S > 0: one unit of the ring is 1 / S */
};

/*
 * fb_encoding_check verifies that e is well formed and that no sum of
 * K_max encoded values can overflow (the condition above). Errors:
 * FB_EINVAL (a field out of its range, NaN), FB_ERANGE (overflow possible).
 */
FB_MUST_CHECK fb_err fb_encoding_check(const fb_encoding *e);

/*
 * fb_encoding_init fills e with the given bounds and the largest power of
 * two S that passes fb_encoding_check. Errors as fb_encoding_check
 * (FB_ERANGE when no S > 0 is safe: K_max >= 2^(bits-1)); e zeroed then.
 */
FB_MUST_CHECK fb_err fb_encoding_init(fb_encoding *e, uint32_t bits,
    uint32_t max_workers, double clip, double w_max);

/*
 * fb_encoding_bound returns the largest possible distance between the
 * decoded sum of k encoded values and their exact weighted sum:
 * k * (1 + 2^-20) / S.
 */
double fb_encoding_bound(const fb_encoding *e, uint32_t k);

/*
 * fb_encode_chunk encodes x[0..count) (coordinates offset.. of an update)
 * with weight w into out[0..count) as ring elements in [0, 2^bits).
 * *clipped (if non-NULL) grows by the number of clamped coordinates.
 * Errors: FB_EINVAL (NaN or infinity in x, or a bad e; nothing written),
 * FB_ERANGE (w outside [0, w_max], or NaN). Thread-safe.
 */
FB_MUST_CHECK fb_err fb_encode_chunk(const fb_encoding *e, const float *x,
    uint64_t count, double w, uint64_t offset, uint64_t seed, uint32_t *out,
    uint64_t *clipped);

/*
 * fb_encode_scalar encodes one extra coordinate (value v, weight w) at
 * index `index` of the seed's stream (use an index outside the model's
 * range, e.g. the model's count + i). Errors as fb_encode_chunk.
 */
FB_MUST_CHECK fb_err fb_encode_scalar(const fb_encoding *e, double v, double w,
    uint64_t index, uint64_t seed, uint32_t *out);

/* fb_decode_value reads an (unmasked) sum: its low `bits` bits as a two's
 * complement integer, divided by S. */
double fb_decode_value(const fb_encoding *e, uint32_t sum);

/* fb_decode_chunk decodes sum[0..count) into out[0..count). */
void fb_decode_chunk(const fb_encoding *e, const uint32_t *sum,
    uint64_t count, double *out);

/*
 * The encodings of one secure round's masked vector, which the coordinator
 * and every worker derive the same way from the round's public parameters
 * (K_max = n workers, w_max = 1): the update's (clip), and those of the
 * FB_SECAGG_EXTRA extra coordinates after it: the weight (x = 1, clip 1),
 * weight x train loss (clip FB_SECAGG_LOSS_BOUND) and weight x FedNova's
 * ||a||_1 (clip a_bound). Errors as fb_encoding_init.
 */
typedef struct fb_secagg_encodings {
	fb_encoding x, w, loss, a;
	fb_encoding ev_w, ev_loss, ev_acc; /* the evaluation's (P + 3..5) */
} fb_secagg_encodings;

FB_MUST_CHECK fb_err fb_secagg_encodings_init(fb_secagg_encodings *e,
    uint32_t bits, uint32_t n, double clip, double a_bound);

/* What a worker's federated evaluation puts into the extra coordinates:
 * v = its validation examples / max_samples in [0, 1] (0: no evaluation),
 * the mean validation loss and the accuracy (NaN for regression: sent as
 * 0). */
typedef struct fb_secagg_eval {
	double v;
	double loss;
	double accuracy;
} fb_secagg_eval;

/* fb_secagg_encode_extras writes the extra coordinates of a worker with
 * weight w, train loss `loss` (a non-finite loss counts as the bound),
 * normaliser a_norm and evaluation `ev` (NULL: none, v = 0), at indices
 * first.. of the rounding stream (first = the model's parameter count).
 * Errors as fb_encode_scalar (FB_ERANGE: ev->v outside [0, 1]). */
FB_MUST_CHECK fb_err fb_secagg_encode_extras(const fb_secagg_encodings *e,
    double w, double loss, double a_norm, const fb_secagg_eval *ev,
    uint64_t first, uint64_t seed, uint32_t out[FB_SECAGG_EXTRA]);

/* fb_secagg_decode_extras reads the unmasked sums of the extra coordinates:
 * *W = sum of weights, *loss and *a_norm the weighted means. Errors:
 * FB_ERANGE (the weights sum to zero or less; outputs zeroed). */
FB_MUST_CHECK fb_err fb_secagg_decode_extras(const fb_secagg_encodings *e,
    const uint32_t sum[FB_SECAGG_EXTRA], double *W, double *loss,
    double *a_norm);

/* ---- Federated evaluation ------------------------------------------------
 *
 * Each worker evaluates the round's global model on its own validation data
 * and reports n_i examples, the mean loss l_i, the accuracy a_i (NaN for
 * regression) and named scalar metrics m_ik. The round's federated
 * evaluation is the sample-weighted mean over the reports,
 *     loss = sum n_i l_i / sum n_i,  accuracy = sum n_i a_i / sum n_i,
 * which is the loss and accuracy over the union of the validation sets. A
 * metric is averaged over the reports that carry it (weights n_i of those).
 * Under secure aggregation the coordinator sees only the sums, through the
 * extra coordinates above (fb_secagg_decode_eval), and no named metric.
 */
#define FB_EVAL_METRICS_MAX 8 /* named metrics per report and per round */
#define FB_EVAL_NAME_MAX 32   /* bytes of a metric's name, NUL included */

typedef struct fb_eval_tally {
	uint32_t reports;     /* reports added */
	double examples;      /* sum n_i */
	double loss;          /* sum n_i l_i */
	double acc_examples;  /* sum n_i over the reports with an accuracy */
	double correct;       /* sum n_i a_i over those */
	uint32_t metric_count;
	char name[FB_EVAL_METRICS_MAX][FB_EVAL_NAME_MAX];
	double metric[FB_EVAL_METRICS_MAX];          /* sum n_i m_ik */
	double metric_examples[FB_EVAL_METRICS_MAX]; /* sum n_i */
} fb_eval_tally;

/* The weighted means; NaN where no report carried a value. */
typedef struct fb_eval_mean {
	uint32_t reports; /* 0: no federated evaluation this round */
	double examples;  /* sum n_i (an estimate under secure aggregation) */
	double loss;
	double accuracy;
	uint32_t metric_count;
	char name[FB_EVAL_METRICS_MAX][FB_EVAL_NAME_MAX];
	double metric[FB_EVAL_METRICS_MAX];
} fb_eval_mean;

/* fb_eval_tally_init empties t. */
void fb_eval_tally_init(fb_eval_tally *t);

/*
 * fb_eval_tally_add adds one worker's report: `examples` > 0, a finite
 * `loss`, `accuracy` in [0, 1] or NaN (none), and `metric_count` named
 * metrics (names non-empty, shorter than FB_EVAL_NAME_MAX, no two alike;
 * values finite). A report with 0 examples adds nothing and is FB_OK.
 * Errors (t unchanged): FB_EINVAL (a value or name out of range),
 * FB_ERANGE (the round would hold more than FB_EVAL_METRICS_MAX names).
 */
FB_MUST_CHECK fb_err fb_eval_tally_add(fb_eval_tally *t, uint64_t examples,
    double loss, double accuracy, uint32_t metric_count,
    const char (*names)[FB_EVAL_NAME_MAX], const double *values);

/* fb_eval_tally_mean writes t's weighted means to *out (out->reports 0 and
 * NaNs when t is empty). */
void fb_eval_tally_mean(const fb_eval_tally *t, fb_eval_mean *out);

/*
 * fb_secagg_decode_eval reads the evaluation's unmasked sums (the extras
 * from FB_SECAGG_EVAL_FIRST) into *out: examples = max_samples * sum v
 * (rounded), loss and accuracy = sum v x / sum v, reports = `included`
 * (the inputs summed), no metric. When sum v is below half an example,
 * *out says no evaluation (reports 0). Errors: FB_ERANGE (sum v negative
 * or a mean outside what honest inputs give; *out emptied).
 */
FB_MUST_CHECK fb_err fb_secagg_decode_eval(const fb_secagg_encodings *e,
    const uint32_t sum[FB_SECAGG_EXTRA], uint64_t max_samples,
    uint32_t included, fb_eval_mean *out);

#endif

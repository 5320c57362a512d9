/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mask.c -- the CUDA backend's secure-aggregation masks: fb_mask_apply
 * (crypto/mask.c, the reference, on libsodium) computed on the GPU, for
 * the backend's mask_apply op (worker/trainer.h).
 *
 * A call checks what fb_mask_apply checks, in the same order, then moves
 * v's range to the GPU in slices of SLICE_WORDS, runs the kernel (mask.cu)
 * with every term on each slice and copies the slice back. SLOTS slices are
 * in flight at once, each on its own stream, so that the copy to the
 * device of one, the kernel of another and the copy back of a third
 * overlap. When v is page-locked (cudaHostRegister or cudaHostAlloc
 * memory), the copies go to and from v itself; otherwise through pinned
 * stage buffers, the host copying each slice in while earlier slices are
 * on the GPU. Buffers are made at the first call, grown when a call needs
 * more, and kept until fb_cuda_mask_free. Only the vector crosses the bus:
 * the keystream exists only in the kernel's registers. The terms' seeds
 * go to the device in a small buffer that is zeroed, with its pinned host
 * copy, before the call returns.
 */
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "common/err.h"
#include "common/log.h"
#include "crypto/crypto.h"
#include "worker/cuda/cuda_impl.h"
#include "worker/cuda/mask_impl.h"

#define SLICE_WORDS (UINT64_C(1) << 20) /* 4 MiB of the vector per copy */
#define SLOTS 3                         /* slices in flight */

struct fb_cuda_mask {
	int dev;                    /* O5: every buffer below is on it */
	cudaStream_t stream[SLOTS]; /* one per slot, non-blocking */
	cudaEvent_t done[SLOTS];    /* a staged slot's copy back ended */
	uint32_t *dbuf;             /* device, SLOTS x slot_words */
	uint64_t slot_words;        /* 0 until first use; multiple of 16 */
	uint32_t *stage;            /* pinned, SLOTS x stage_words, or NULL */
	uint64_t stage_words;
	fb_cuda_mask_key *dkeys; /* device, keys_cap (zeroed between calls) */
	fb_cuda_mask_key *hkeys; /* pinned, keys_cap (zeroed between calls) */
	uint32_t keys_cap;
	fb_cuda_mask_stats stats;
};

/* A staged slice on its way back: where its words go in v. */
typedef struct pending {
	int live;
	uint64_t at;  /* index into v */
	uint64_t len; /* words */
} pending;

static uint32_t
le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

/* crypto.h's nonce "fbm" || role || LE32 round || 4 zero bytes, as the
 * three little-endian words ChaCha20 reads. */
static void
key_fill(fb_cuda_mask_key *k, const fb_mask_term *t, uint32_t round)
{
	for (int i = 0; i < 8; i++) {
		k->key[i] = le32(t->seed + 4 * i);
	}
	k->nonce[0] = (uint32_t)'f' | (uint32_t)'b' << 8 |
	              (uint32_t)'m' << 16 | (uint32_t)t->role << 24;
	k->nonce[1] = round;
	k->nonce[2] = 0;
	k->neg = t->sign < 0;
}

fb_err
fb_cuda_mask_alloc(int dev, fb_cuda_mask **out)
{
	fb_err rc = FB_OK;
	fb_cuda_mask *m;

	*out = NULL;
	if ((m = calloc(1, sizeof(*m))) == NULL) {
		return FB_ENOMEM;
	}
	m->dev = dev;
	FB_CUDA_TRY(cudaSetDevice(dev), rc, out);
	for (int s = 0; s < SLOTS; s++) {
		FB_CUDA_TRY(cudaStreamCreateWithFlags(&m->stream[s],
		    cudaStreamNonBlocking), rc, out);
		FB_CUDA_TRY(cudaEventCreateWithFlags(&m->done[s],
		    cudaEventDisableTiming), rc, out);
	}
	*out = m;
	m = NULL;
out:
	fb_cuda_mask_free(m);
	return rc;
}

/* Zeroes the key buffers (device, then host); best effort on a broken
 * context, where the device memory is out of reach anyway. */
static void
keys_wipe(fb_cuda_mask *m, uint32_t n)
{
	if (n == 0 || m->keys_cap == 0) {
		return;
	}
	n = n > m->keys_cap ? m->keys_cap : n;
	if (cudaMemsetAsync(m->dkeys, 0, (size_t)n * sizeof(*m->dkeys),
	        m->stream[0]) != cudaSuccess ||
	    cudaStreamSynchronize(m->stream[0]) != cudaSuccess) {
		fb_log_warn("cuda: the mask seeds could not be zeroed on the "
		            "device: %s",
		    cudaGetErrorString(cudaGetLastError()));
	}
	explicit_bzero(m->hkeys, (size_t)n * sizeof(*m->hkeys));
}

void
fb_cuda_mask_free(fb_cuda_mask *m)
{
	if (m == NULL) {
		return;
	}
	if (cudaSetDevice(m->dev) == cudaSuccess) {
		for (int s = 0; s < SLOTS; s++) {
			if (m->stream[s] != NULL) {
				cudaStreamSynchronize(m->stream[s]);
			}
		}
		keys_wipe(m, m->keys_cap);
		cudaFree(m->dkeys);
		cudaFreeHost(m->hkeys);
		cudaFree(m->dbuf);
		cudaFreeHost(m->stage);
		for (int s = 0; s < SLOTS; s++) {
			if (m->done[s] != NULL) {
				cudaEventDestroy(m->done[s]);
			}
			if (m->stream[s] != NULL) {
				cudaStreamDestroy(m->stream[s]);
			}
		}
	}
	free(m);
}

static fb_err
keys_reserve(fb_cuda_mask *m, uint32_t n)
{
	fb_err rc = FB_OK;

	if (n <= m->keys_cap) {
		return FB_OK;
	}
	/* (the old buffers were zeroed at the end of the last call) */
	cudaFree(m->dkeys);
	cudaFreeHost(m->hkeys);
	m->dkeys = NULL;
	m->hkeys = NULL;
	m->keys_cap = 0;
	FB_CUDA_TRY(cudaMalloc((void **)&m->dkeys, (size_t)n *
	    sizeof(*m->dkeys)), rc, out);
	FB_CUDA_TRY(cudaHostAlloc((void **)&m->hkeys, (size_t)n *
	    sizeof(*m->hkeys), cudaHostAllocDefault), rc, out);
	m->keys_cap = n;
out:
	if (rc != FB_OK) {
		cudaFree(m->dkeys);
		cudaFreeHost(m->hkeys);
		m->dkeys = NULL;
		m->hkeys = NULL;
	}
	return rc;
}

static fb_err
slots_reserve(fb_cuda_mask *m, uint64_t words)
{
	fb_err rc = FB_OK;

	if (words <= m->slot_words) {
		return FB_OK;
	}
	cudaFree(m->dbuf);
	m->dbuf = NULL;
	m->slot_words = 0;
	FB_CUDA_TRY(cudaMalloc((void **)&m->dbuf, (size_t)(SLOTS * words) *
	    sizeof(uint32_t)), rc, out);
	m->slot_words = words;
out:
	return rc;
}

static fb_err
stage_reserve(fb_cuda_mask *m, uint64_t words)
{
	fb_err rc = FB_OK;

	if (words <= m->stage_words) {
		return FB_OK;
	}
	cudaFreeHost(m->stage);
	m->stage = NULL;
	m->stage_words = 0;
	FB_CUDA_TRY(cudaHostAlloc((void **)&m->stage, (size_t)(SLOTS * words) *
	    sizeof(uint32_t), cudaHostAllocDefault), rc, out);
	m->stage_words = words;
out:
	return rc;
}

/* Whether the CUDA runtime knows [p, p + len) as page-locked host memory
 * (both ends: a range is registered or allocated in one piece). */
static int
page_locked(const void *p, size_t len)
{
	const char *end = (const char *)p + len - 1;
	struct cudaPointerAttributes a;

	for (int i = 0; i < 2; i++) {
		if (cudaPointerGetAttributes(&a, i == 0 ? p : end) !=
		    cudaSuccess) {
			(void)cudaGetLastError(); /* not an error: unknown */
			return 0;
		}
		if (a.type != cudaMemoryTypeHost) {
			return 0;
		}
	}
	return 1;
}

/* The slice that starts at mask element `a` (< end): it ends at the end or
 * SLICE_WORDS after the block that holds `a`, so that later slices start on
 * a block and each fits a slot. */
static void
slice_at(uint64_t a, uint64_t end, uint32_t *head, uint64_t *len,
    uint32_t *block0)
{
	uint64_t start = a & ~UINT64_C(15);
	uint64_t b = end - start < SLICE_WORDS ? end : start + SLICE_WORDS;

	*head = (uint32_t)(a - start);
	*len = b - a;
	*block0 = (uint32_t)(start / 16);
}

fb_err
fb_cuda_mask_check(uint64_t offset, uint64_t count, const fb_mask_term *terms,
    uint32_t nterms)
{
	/* fb_mask_apply's checks, in its order: range, then the terms. */
	if (offset > FB_MASK_MAX_ELEMS || count > FB_MASK_MAX_ELEMS - offset) {
		return FB_ERANGE;
	}
	if (nterms > 0 && terms == NULL) {
		return FB_EINVAL;
	}
	for (uint32_t t = 0; t < nterms; t++) {
		if (terms[t].role < FB_MASK_SELF ||
		    terms[t].role > FB_MASK_GRAPH ||
		    (terms[t].sign != 1 && terms[t].sign != -1)) {
			return FB_EINVAL;
		}
	}
	return FB_OK;
}

fb_err
fb_cuda_mask_apply(fb_cuda_mask *m, uint32_t *v, uint64_t offset,
    uint64_t count, const fb_mask_term *terms, uint32_t nterms,
    uint32_t round)
{
	fb_err rc = FB_OK;
	pending pend[SLOTS];
	uint64_t end, a, need;
	uint32_t i = 0;
	int direct;

	if ((rc = fb_cuda_mask_check(offset, count, terms, nterms)) != FB_OK ||
	    count == 0 || nterms == 0) {
		return rc;
	}
	if (v == NULL) {
		return FB_EINVAL;
	}
	memset(pend, 0, sizeof(pend));
	end = offset + count;
	need = ((offset & 15) + count + 15) & ~UINT64_C(15);
	need = need < SLICE_WORDS ? need : SLICE_WORDS;
	FB_CUDA_TRY(cudaSetDevice(m->dev), rc, out);
	if ((rc = keys_reserve(m, nterms)) != FB_OK ||
	    (rc = slots_reserve(m, need)) != FB_OK) {
		goto out;
	}
	direct = page_locked(v, (size_t)count * sizeof(uint32_t));
	if (!direct && (rc = stage_reserve(m, need)) != FB_OK) {
		goto out;
	}
	for (uint32_t t = 0; t < nterms; t++) {
		key_fill(&m->hkeys[t], &terms[t], round);
	}
	FB_CUDA_TRY(cudaMemcpyAsync(m->dkeys, m->hkeys, (size_t)nterms *
	    sizeof(*m->dkeys), cudaMemcpyHostToDevice, m->stream[0]), rc, out);
	/* every slot's kernel reads the keys: have them in place first */
	FB_CUDA_TRY(cudaStreamSynchronize(m->stream[0]), rc, out);

	for (a = offset; a < end; i++) {
		uint32_t s = i % SLOTS;
		uint32_t *d = m->dbuf + (size_t)s * m->slot_words;
		uint32_t *src;
		uint64_t len, at = a - offset;
		uint32_t head, block0;

		slice_at(a, end, &head, &len, &block0);
		if (direct) {
			src = v + at;
			m->stats.direct_slices++;
		} else {
			src = m->stage + (size_t)s * m->stage_words;
			if (pend[s].live) {
				FB_CUDA_TRY(cudaEventSynchronize(m->done[s]),
				    rc, out);
				memcpy(v + pend[s].at, src,
				    pend[s].len * sizeof(uint32_t));
				pend[s].live = 0;
			}
			memcpy(src, v + at, len * sizeof(uint32_t));
			m->stats.staged_slices++;
		}
		FB_CUDA_TRY(cudaMemcpyAsync(d + head, src, len *
		    sizeof(uint32_t), cudaMemcpyHostToDevice, m->stream[s]),
		    rc, out);
		FB_CUDA_TRY(fb_cuda_mask_expand(d, head, len, block0, m->dkeys,
		    nterms, m->stream[s]), rc, out);
		FB_CUDA_TRY(cudaMemcpyAsync(src, d + head, len *
		    sizeof(uint32_t), cudaMemcpyDeviceToHost, m->stream[s]),
		    rc, out);
		if (!direct) {
			FB_CUDA_TRY(cudaEventRecord(m->done[s], m->stream[s]),
			    rc, out);
		}
		pend[s].live = !direct;
		pend[s].at = at;
		pend[s].len = len;
		a += len;
	}
	for (uint32_t s = 0; s < SLOTS; s++) {
		FB_CUDA_TRY(cudaStreamSynchronize(m->stream[s]), rc, out);
		if (pend[s].live) {
			memcpy(v + pend[s].at,
			    m->stage + (size_t)s * m->stage_words,
			    pend[s].len * sizeof(uint32_t));
			pend[s].live = 0;
		}
	}
out:
	if (rc != FB_OK) {
		/* Nothing half-done stays in flight; what the stage and the
		 * slots hold (inputs not yet masked) is zeroed. */
		for (uint32_t s = 0; s < SLOTS; s++) {
			if (m->stream[s] != NULL) {
				(void)cudaStreamSynchronize(m->stream[s]);
			}
		}
		if (m->stage != NULL) {
			explicit_bzero(m->stage, (size_t)(SLOTS *
			    m->stage_words) * sizeof(uint32_t));
		}
		if (m->dbuf != NULL) {
			(void)cudaMemset(m->dbuf, 0, (size_t)(SLOTS *
			    m->slot_words) * sizeof(uint32_t));
		}
		(void)cudaGetLastError();
	}
	keys_wipe(m, nterms);
	return rc;
}

void
fb_cuda_mask_get_stats(const fb_cuda_mask *m, fb_cuda_mask_stats *out)
{
	memset(out, 0, sizeof(*out));
	if (m != NULL) {
		*out = m->stats;
	}
}

fb_err
fb_cuda_mask_time_kernel(fb_cuda_mask *m, uint64_t count, uint32_t nterms,
    uint32_t iters, double *seconds)
{
	fb_err rc = FB_OK;
	uint32_t *d = NULL;
	cudaEvent_t ev[2] = {NULL, NULL};
	uint64_t words = (count + 15) & ~UINT64_C(15);
	float ms = 0.0f;

	*seconds = 0.0;
	if (count == 0 || count > FB_MASK_MAX_ELEMS || nterms == 0 ||
	    iters == 0) {
		return FB_EINVAL;
	}
	FB_CUDA_TRY(cudaSetDevice(m->dev), rc, out);
	if ((rc = keys_reserve(m, nterms)) != FB_OK) {
		goto out;
	}
	/* Made-up terms (a benchmark's, not secret), both signs. */
	for (uint32_t t = 0; t < nterms; t++) {
		fb_mask_term term;
		for (int b = 0; b < FB_MASK_SEED_LEN; b++) {
			term.seed[b] =
			    (uint8_t)(t * 37u + (uint32_t)b * 11u + 1u);
		}
		term.role = t == 0 ? FB_MASK_SELF : FB_MASK_PAIR;
		term.sign = t % 2 == 0 ? 1 : -1;
		key_fill(&m->hkeys[t], &term, 1);
	}
	FB_CUDA_TRY(cudaMalloc((void **)&d, (size_t)words * sizeof(uint32_t)),
	    rc, out);
	FB_CUDA_TRY(cudaMemsetAsync(d, 0, (size_t)words * sizeof(uint32_t),
	    m->stream[0]), rc, out);
	FB_CUDA_TRY(cudaMemcpyAsync(m->dkeys, m->hkeys, (size_t)nterms *
	    sizeof(*m->dkeys), cudaMemcpyHostToDevice, m->stream[0]), rc, out);
	FB_CUDA_TRY(cudaEventCreate(&ev[0]), rc, out);
	FB_CUDA_TRY(cudaEventCreate(&ev[1]), rc, out);
	FB_CUDA_TRY(fb_cuda_mask_expand(d, 0, count, 0, m->dkeys, nterms,
	    m->stream[0]), rc, out);
	FB_CUDA_TRY(cudaEventRecord(ev[0], m->stream[0]), rc, out);
	for (uint32_t k = 0; k < iters; k++) {
		FB_CUDA_TRY(fb_cuda_mask_expand(d, 0, count, 0, m->dkeys,
		    nterms, m->stream[0]), rc, out);
	}
	FB_CUDA_TRY(cudaEventRecord(ev[1], m->stream[0]), rc, out);
	FB_CUDA_TRY(cudaEventSynchronize(ev[1]), rc, out);
	FB_CUDA_TRY(cudaEventElapsedTime(&ms, ev[0], ev[1]), rc, out);
	*seconds = (double)ms * 1e-3 / iters;
out:
	if (m->stream[0] != NULL) {
		(void)cudaStreamSynchronize(m->stream[0]);
	}
	for (int k = 0; k < 2; k++) {
		if (ev[k] != NULL) {
			cudaEventDestroy(ev[k]);
		}
	}
	cudaFree(d);
	keys_wipe(m, nterms);
	return rc;
}

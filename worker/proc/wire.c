/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wire.c -- the messages between a worker and its trainer process (format
 * in proc_impl.h): building them, reading them with bounds checked on every
 * field, comparing a trainer's layout with the model's, and the checked
 * copy that takes the trainer's parameters back.
 *
 * Everything a trainer sends is untrusted: lengths are checked before they
 * are used, nothing is allocated from a count it chose, and a layout is
 * compared in place without being materialised.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "common/util.h"
#include "worker/proc/proc_impl.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the trainer protocol is little-endian; so is this code"
#endif

/* Copies of at least this many bytes bypass the caches (as memcpy does). */
#define NT_MIN_BYTES ((size_t)4 << 20)

static void
buf_grow(fb_proc_buf *b, size_t more)
{
	size_t cap;
	uint8_t *p;

	if (b->oom) {
		return;
	}
	if (more > SIZE_MAX / 2 - b->len) {
		b->oom = true;
		return;
	}
	if (b->len + more <= b->cap) {
		return;
	}
	cap = b->cap < 256 ? 256 : b->cap;
	while (cap < b->len + more) {
		cap *= 2;
	}
	if ((p = fb_alloc(cap)) == NULL) {
		b->oom = true;
		return;
	}
	if (b->len > 0) {
		memcpy(p, b->p, b->len);
	}
	fb_free(b->p);
	b->p = p;
	b->cap = cap;
}

void
fb_proc_buf_bytes(fb_proc_buf *b, const void *p, size_t len)
{
	buf_grow(b, len);
	if (b->oom || len == 0) {
		return;
	}
	memcpy(b->p + b->len, p, len);
	b->len += len;
}

void
fb_proc_buf_u8(fb_proc_buf *b, uint8_t v)
{
	fb_proc_buf_bytes(b, &v, 1);
}

void
fb_proc_buf_u32(fb_proc_buf *b, uint32_t v)
{
	fb_proc_buf_bytes(b, &v, 4);
}

void
fb_proc_buf_u64(fb_proc_buf *b, uint64_t v)
{
	fb_proc_buf_bytes(b, &v, 8);
}

void
fb_proc_buf_f64(fb_proc_buf *b, double v)
{
	fb_proc_buf_bytes(b, &v, 8);
}

void
fb_proc_buf_str(fb_proc_buf *b, const char *s)
{
	size_t n = strlen(s);
	uint16_t len16;

	if (n > UINT16_MAX) {
		b->oom = true; /* never for our own strings; refuse, not cut */
		return;
	}
	len16 = (uint16_t)n;
	fb_proc_buf_bytes(b, &len16, 2);
	fb_proc_buf_bytes(b, s, n);
}

void
fb_proc_buf_fini(fb_proc_buf *b)
{
	fb_free(b->p);
	memset(b, 0, sizeof(*b));
}

void
fb_proc_msg_begin(fb_proc_buf *b, fb_proc_type type)
{
	b->len = 0;
	b->oom = false;
	fb_proc_buf_u32(b, 0); /* the length, filled in by msg_end */
	fb_proc_buf_u32(b, (uint32_t)type);
}

fb_err
fb_proc_msg_end(fb_proc_buf *b)
{
	uint32_t body;

	if (b->oom) {
		return FB_ENOMEM;
	}
	if (b->len - 4 > FB_PROC_MSG_MAX) {
		return FB_ERANGE;
	}
	body = (uint32_t)(b->len - 4);
	memcpy(b->p, &body, 4);
	return FB_OK;
}

void
fb_proc_layout_pack(fb_proc_buf *b, const fb_model *m)
{
	uint32_t n = fb_model_tensor_count(m);
	fb_tensor_info ti;

	fb_proc_buf_u32(b, n);
	for (uint32_t i = 0; i < n; i++) {
		fb_model_tensor_info(m, i, &ti);
		fb_proc_buf_str(b, ti.name);
		fb_proc_buf_u8(b, FB_PROC_F32);
		fb_proc_buf_u8(b, (uint8_t)ti.ndim);
		for (uint32_t d = 0; d < ti.ndim; d++) {
			fb_proc_buf_u64(b, ti.shape[d]);
		}
		fb_proc_buf_u64(b, ti.offset);
	}
}

fb_err
fb_proc_task_pack(fb_proc_buf *b, const fb_proc_task *t)
{
	fb_proc_msg_begin(b, FB_PROC_TASK);
	fb_proc_buf_u64(b, t->id);
	fb_proc_buf_u32(b, t->kind);
	fb_proc_buf_u32(b, t->round);
	fb_proc_buf_u64(b, t->steps);
	fb_proc_buf_u32(b, t->batch);
	fb_proc_buf_f64(b, t->lr);
	fb_proc_buf_f64(b, t->momentum);
	fb_proc_buf_f64(b, t->weight_decay);
	fb_proc_buf_f64(b, t->prox_mu);
	fb_proc_buf_u64(b, t->seed);
	fb_proc_buf_u32(b, t->worker_index);
	return fb_proc_msg_end(b);
}

void
fb_proc_rd_bytes(fb_proc_rd *r, void *out, size_t len)
{
	if (r->bad || r->left < len) {
		r->bad = true;
		memset(out, 0, len);
		return;
	}
	memcpy(out, r->p, len);
	r->p += len;
	r->left -= len;
}

uint8_t
fb_proc_rd_u8(fb_proc_rd *r)
{
	uint8_t v;
	fb_proc_rd_bytes(r, &v, 1);
	return v;
}

uint32_t
fb_proc_rd_u32(fb_proc_rd *r)
{
	uint32_t v;
	fb_proc_rd_bytes(r, &v, 4);
	return v;
}

uint64_t
fb_proc_rd_u64(fb_proc_rd *r)
{
	uint64_t v;
	fb_proc_rd_bytes(r, &v, 8);
	return v;
}

double
fb_proc_rd_f64(fb_proc_rd *r)
{
	double v;
	fb_proc_rd_bytes(r, &v, 8);
	return v;
}

void
fb_proc_rd_str(fb_proc_rd *r, char *out, size_t cap)
{
	uint16_t len;

	out[0] = '\0';
	fb_proc_rd_bytes(r, &len, 2);
	if (r->bad || len >= cap || r->left < len ||
	    memchr(r->p, '\0', len) != NULL) {
		r->bad = true;
		return;
	}
	memcpy(out, r->p, len);
	out[len] = '\0';
	r->p += len;
	r->left -= len;
}

fb_err
fb_proc_msg_type(
    const uint8_t *body, size_t body_len, fb_proc_rd *r, uint32_t *type)
{
	r->p = body;
	r->left = body_len;
	r->bad = false;
	*type = fb_proc_rd_u32(r);
	return r->bad ? FB_EPROTO : FB_OK;
}

fb_err
fb_proc_hello_unpack(fb_proc_rd *r, fb_proc_hello *h)
{
	memset(h, 0, sizeof(*h));
	h->magic = fb_proc_rd_u32(r);
	h->version = fb_proc_rd_u32(r);
	fb_proc_rd_bytes(r, h->token, sizeof(h->token));
	h->pid = fb_proc_rd_u32(r);
	h->world = fb_proc_rd_u32(r);
	h->examples = fb_proc_rd_u64(r);
	return r->bad || r->left != 0 ? FB_EPROTO : FB_OK;
}

fb_err
fb_proc_result_unpack(fb_proc_rd *r, fb_proc_result *out)
{
	memset(out, 0, sizeof(*out));
	out->id = fb_proc_rd_u64(r);
	out->examples = fb_proc_rd_u64(r);
	out->steps = fb_proc_rd_u64(r);
	out->loss = fb_proc_rd_f64(r);
	out->a_norm = fb_proc_rd_f64(r);
	out->seconds = fb_proc_rd_f64(r);
	out->param_count = fb_proc_rd_u64(r);
	if (r->bad) {
		return FB_EPROTO;
	}
	out->layout = *r;
	return FB_OK;
}

fb_err
fb_proc_eval_unpack(fb_proc_rd *r, uint64_t *task_id, fb_train_eval *ev,
    char *why, size_t why_len)
{
	uint32_t n;

	memset(ev, 0, sizeof(*ev));
	why[0] = '\0';
	*task_id = fb_proc_rd_u64(r);
	ev->examples = fb_proc_rd_u64(r);
	ev->loss = fb_proc_rd_f64(r);
	ev->accuracy = fb_proc_rd_f64(r);
	n = fb_proc_rd_u32(r);
	if (!r->bad && n > FB_TRAIN_METRICS_MAX) {
		snprintf(why, why_len, "%u metrics (at most %d)", n,
		    FB_TRAIN_METRICS_MAX);
		memset(ev, 0, sizeof(*ev));
		return FB_EINVAL;
	}
	for (uint32_t k = 0; k < n && !r->bad; k++) {
		fb_proc_rd_str(r, ev->name[k], FB_TRAIN_METRIC_NAME);
		ev->value[k] = fb_proc_rd_f64(r);
	}
	if (r->bad || r->left != 0) {
		snprintf(why, why_len, "malformed (truncated, a metric name "
		                       "over %d bytes, or trailing bytes)",
		    FB_TRAIN_METRIC_NAME - 1);
		memset(ev, 0, sizeof(*ev));
		return FB_EPROTO;
	}
	ev->metric_count = n;
	if (ev->examples == 0 || !isfinite(ev->loss) ||
	    !(isnan(ev->accuracy) ||
	        (ev->accuracy >= 0 && ev->accuracy <= 1))) {
		snprintf(why, why_len,
		    "%" PRIu64 " examples, loss %g, accuracy %g (examples "
		    ">= 1, the loss finite, the accuracy in [0, 1] or none)",
		    ev->examples, ev->loss, ev->accuracy);
		memset(ev, 0, sizeof(*ev));
		return FB_EINVAL;
	}
	for (uint32_t k = 0; k < n; k++) {
		bool ok = ev->name[k][0] != '\0' && isfinite(ev->value[k]);
		for (const char *c = ev->name[k]; ok && *c != '\0'; c++) {
			ok = (unsigned char)*c >= 0x20 && *c != 0x7f &&
			     *c != '"' && *c != '\\';
		}
		for (uint32_t j = 0; ok && j < k; j++) {
			ok = strcmp(ev->name[j], ev->name[k]) != 0;
		}
		if (!ok) {
			snprintf(why, why_len,
			    "metric %u (\"%s\" = %g): a name must be "
			    "printable, without quotes or backslashes, and "
			    "unique; a value finite",
			    k, ev->name[k], ev->value[k]);
			memset(ev, 0, sizeof(*ev));
			return FB_EINVAL;
		}
	}
	return FB_OK;
}

fb_err
fb_proc_fail_unpack(
    fb_proc_rd *r, uint64_t *task_id, bool *fatal, char *reason, size_t cap)
{
	uint16_t len;
	size_t keep;

	reason[0] = '\0';
	*task_id = fb_proc_rd_u64(r);
	*fatal = fb_proc_rd_u8(r) != 0;
	fb_proc_rd_bytes(r, &len, 2);
	if (r->bad || r->left != len) {
		return FB_EPROTO;
	}
	keep = len < cap - 1 ? len : cap - 1;
	for (size_t i = 0; i < keep; i++) {
		unsigned char ch = r->p[i];
		/* One log line: newlines and other controls become '?'. */
		reason[i] = ch < 0x20 || ch == 0x7f ? '?' : (char)ch;
	}
	reason[keep] = '\0';
	return FB_OK;
}

/* shape_text writes "[a, b, c]". */
static void
shape_text(const uint64_t *shape, uint32_t ndim, char *buf, size_t len)
{
	size_t at = 0;
	int n;

	buf[0] = '\0';
	n = snprintf(buf, len, "[");
	for (uint32_t d = 0; d < ndim && n >= 0 && (size_t)n < len - at; d++) {
		at += (size_t)n;
		n = snprintf(
		    buf + at, len - at, "%s%" PRIu64, d ? ", " : "", shape[d]);
	}
	if (n >= 0 && (size_t)n < len - at) {
		at += (size_t)n;
		snprintf(buf + at, len - at, "]");
	}
}

static const char *
dtype_name(uint8_t dt)
{
	switch (dt) {
	case FB_PROC_F32:
		return "F32";
	case FB_PROC_U8:
		return "U8";
	case FB_PROC_I32:
		return "I32";
	default:
		return "an unknown dtype";
	}
}

fb_err
fb_proc_layout_check(
    fb_proc_rd *r, const fb_model *m, char *why, size_t why_len)
{
	uint32_t n = fb_proc_rd_u32(r);
	uint32_t have = fb_model_tensor_count(m);
	char name[FB_TENSOR_NAME_MAX];
	char s_ours[128], s_theirs[128];
	uint64_t shape[4];
	fb_tensor_info ti;

	why[0] = '\0';
	if (r->bad || n > FB_PROC_TENSORS_MAX) {
		snprintf(why, why_len, "its layout table is malformed");
		return FB_EPROTO;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint8_t dt, ndim;
		uint64_t off;

		fb_proc_rd_str(r, name, sizeof(name));
		dt = fb_proc_rd_u8(r);
		ndim = fb_proc_rd_u8(r);
		if (r->bad || ndim < 1 || ndim > 4) {
			snprintf(why, why_len,
			    "its layout table is malformed at tensor %u", i);
			return FB_EPROTO;
		}
		for (uint32_t d = 0; d < ndim; d++) {
			shape[d] = fb_proc_rd_u64(r);
		}
		off = fb_proc_rd_u64(r);
		if (r->bad) {
			snprintf(why, why_len,
			    "its layout table is malformed at tensor %u", i);
			return FB_EPROTO;
		}
		shape_text(shape, ndim, s_theirs, sizeof(s_theirs));
		if (i >= have) {
			snprintf(why, why_len,
			    "it has a tensor the model does not: \"%s\" %s "
			    "(tensor %u; the model has %u)",
			    name, s_theirs, i, have);
			return FB_EPROTO;
		}
		fb_model_tensor_info(m, i, &ti);
		shape_text(ti.shape, ti.ndim, s_ours, sizeof(s_ours));
		if (strcmp(name, ti.name) != 0 || ndim != ti.ndim ||
		    memcmp(shape, ti.shape, ndim * sizeof(uint64_t)) != 0) {
			snprintf(why, why_len,
			    "tensor %u is \"%s\" %s in the model but \"%s\" %s "
			    "in the trainer's",
			    i, ti.name, s_ours, name, s_theirs);
			return FB_EPROTO;
		}
		if (dt != FB_PROC_F32) {
			snprintf(why, why_len,
			    "tensor \"%s\" is %s in the trainer's layout; "
			    "parameters travel as F32",
			    name, dtype_name(dt));
			return FB_EPROTO;
		}
		if (off != ti.offset) {
			snprintf(why, why_len,
			    "tensor \"%s\" starts at element %" PRIu64
			    " in the trainer's layout, %" PRIu64 " in the "
			    "model's",
			    name, off, ti.offset);
			return FB_EPROTO;
		}
	}
	if (r->left != 0) {
		snprintf(
		    why, why_len, "%zu bytes follow its layout table", r->left);
		return FB_EPROTO;
	}
	if (n < have) {
		fb_model_tensor_info(m, n, &ti);
		shape_text(ti.shape, ti.ndim, s_ours, sizeof(s_ours));
		snprintf(why, why_len,
		    "tensor \"%s\" %s is missing from it (it has %u tensors, "
		    "the model %u)",
		    ti.name, s_ours, n, have);
		return FB_EPROTO;
	}
	return FB_OK;
}

/* copy_scalar copies src[i..end) to dst one value at a time, stopping at
 * the first non-finite one: it returns that index, or end. The vector
 * loops below use it for their unaligned heads and their tails. */
static inline uint64_t
copy_scalar(float *dst, const float *src, uint64_t i, uint64_t end)
{
	for (; i < end; i++) {
		float v = src[i];
		if (!isfinite(v)) {
			return i;
		}
		dst[i] = v;
	}
	return end;
}

/* first_bad returns the index of the first non-finite of `v` (n values),
 * or n. */
static uint32_t
first_bad(const float *v, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		if (!isfinite(v[i])) {
			return i;
		}
	}
	return n;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1

/* copy_avx2 is the loop below with 32-byte vectors, for CPUs that have
 * them (picked at run time): it keeps pace with memcpy, the SSE2 loop
 * does not quite. */
__attribute__((target("avx2"))) static uint64_t
copy_avx2(float *dst, const float *src, uint64_t count, bool nt)
{
	const __m256 absmask =
	    _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
	const __m256 inf = _mm256_set1_ps(INFINITY);
	uint64_t i = 0, head = 0;

	/* Scalar until dst is 32-byte aligned (the stores below need it). */
	while (head < count && ((uintptr_t)(dst + head) & 31) != 0) {
		head++;
	}
	if ((i = copy_scalar(dst, src, 0, head)) < head) {
		return i;
	}
	for (; i + 32 <= count; i += 32) {
		__m256 a = _mm256_loadu_ps(src + i);
		__m256 b = _mm256_loadu_ps(src + i + 8);
		__m256 c = _mm256_loadu_ps(src + i + 16);
		__m256 d = _mm256_loadu_ps(src + i + 24);
		__m256 ok = _mm256_and_ps(
		    _mm256_and_ps(_mm256_cmp_ps(_mm256_and_ps(a, absmask), inf,
		                      _CMP_LT_OQ),
		        _mm256_cmp_ps(
		            _mm256_and_ps(b, absmask), inf, _CMP_LT_OQ)),
		    _mm256_and_ps(_mm256_cmp_ps(_mm256_and_ps(c, absmask), inf,
		                      _CMP_LT_OQ),
		        _mm256_cmp_ps(
		            _mm256_and_ps(d, absmask), inf, _CMP_LT_OQ)));
		if (_mm256_movemask_ps(ok) != 0xff) {
			float v[32];
			_mm256_storeu_ps(v, a);
			_mm256_storeu_ps(v + 8, b);
			_mm256_storeu_ps(v + 16, c);
			_mm256_storeu_ps(v + 24, d);
			if (nt) {
				_mm_sfence();
			}
			return i + first_bad(v, 32);
		}
		if (nt) {
			_mm256_stream_ps(dst + i, a);
			_mm256_stream_ps(dst + i + 8, b);
			_mm256_stream_ps(dst + i + 16, c);
			_mm256_stream_ps(dst + i + 24, d);
		} else {
			_mm256_store_ps(dst + i, a);
			_mm256_store_ps(dst + i + 8, b);
			_mm256_store_ps(dst + i + 16, c);
			_mm256_store_ps(dst + i + 24, d);
		}
	}
	if (nt) {
		_mm_sfence();
	}
	return copy_scalar(dst, src, i, count);
}
#endif

uint64_t
fb_proc_copy_checked(float *dst, const float *src, uint64_t count)
{
#ifdef HAVE_AVX2_PATH
	if (__builtin_cpu_supports("avx2")) {
		return copy_avx2(
		    dst, src, count, count * sizeof(float) >= NT_MIN_BYTES);
	}
#endif
	return fb_proc_copy_checked_base(dst, src, count);
}

uint64_t
fb_proc_copy_checked_base(float *dst, const float *src, uint64_t count)
{
	uint64_t i = 0;

#ifdef __SSE2__
	const __m128 absmask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
	const __m128 inf = _mm_set1_ps(INFINITY);
	bool nt = count * sizeof(float) >= NT_MIN_BYTES;
	uint64_t head = 0;

	/* Scalar until dst is 16-byte aligned (non-temporal stores need it). */
	while (head < count && ((uintptr_t)(dst + head) & 15) != 0) {
		head++;
	}
	if ((i = copy_scalar(dst, src, 0, head)) < head) {
		return i;
	}
	for (; i + 16 <= count; i += 16) {
		/* Each value is loaded once; the check and the store both use
		 * the register, so a concurrent writer cannot slip past. */
		__m128 a = _mm_loadu_ps(src + i);
		__m128 b = _mm_loadu_ps(src + i + 4);
		__m128 c = _mm_loadu_ps(src + i + 8);
		__m128 d = _mm_loadu_ps(src + i + 12);
		__m128 ok = _mm_and_ps(
		    _mm_and_ps(_mm_cmplt_ps(_mm_and_ps(a, absmask), inf),
		        _mm_cmplt_ps(_mm_and_ps(b, absmask), inf)),
		    _mm_and_ps(_mm_cmplt_ps(_mm_and_ps(c, absmask), inf),
		        _mm_cmplt_ps(_mm_and_ps(d, absmask), inf)));
		if (_mm_movemask_ps(ok) != 0xf) {
			float v[16];
			_mm_storeu_ps(v, a);
			_mm_storeu_ps(v + 4, b);
			_mm_storeu_ps(v + 8, c);
			_mm_storeu_ps(v + 12, d);
			if (nt) {
				_mm_sfence();
			}
			return i + first_bad(v, 16);
		}
		if (nt) {
			_mm_stream_ps(dst + i, a);
			_mm_stream_ps(dst + i + 4, b);
			_mm_stream_ps(dst + i + 8, c);
			_mm_stream_ps(dst + i + 12, d);
		} else {
			_mm_store_ps(dst + i, a);
			_mm_store_ps(dst + i + 4, b);
			_mm_store_ps(dst + i + 8, c);
			_mm_store_ps(dst + i + 12, d);
		}
	}
	if (nt) {
		_mm_sfence();
	}
#endif
	return copy_scalar(dst, src, i, count);
}

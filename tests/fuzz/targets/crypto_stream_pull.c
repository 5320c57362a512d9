/* SPDX-License-Identifier: Apache-2.0 */
/*
 * crypto_stream_pull.c -- libFuzzer target: receiving a payload stream
 * (fb_stream_pull_alloc/_chunk/_final) under the fixture's key and context,
 * signed by the fixture worker, in the digest mode its header names (byte
 * 2, modulo the three modes). Input: frames of [u16 LE length][bytes]: the
 * stream header, the chunks, and last the trailer. Chunks are pulled in
 * place (plaintext at c + 1), every other one of a TAGS or INDEXED_TAGS
 * stream in parts (fb_stream_pull_chunk_par, pieces last first), and the
 * trailer is checked only after the last frame, as a receiver would.
 */
#include "tests/fuzz/fuzz_common.h"

#define MAX_FRAMES 64

/* fb_stream_pull_chunk_par's runner: the pieces last first, here. */
static void
run_rev(void *ctx, uint32_t n, void (*fn)(void *arg, uint32_t i), void *arg)
{
	(void)ctx;
	for (uint32_t i = n; i-- > 0;) {
		fn(arg, i);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const fz_fixture *f = fz_setup();
	const uint8_t *frame[MAX_FRAMES];
	size_t len[MAX_FRAMES], n = 0, pos = 0;
	fb_stream_pull *p = NULL;
	fb_reject why = FB_REJECT_NONE;
	fb_err rc;
	uint64_t total = 0, seen = 0;
	int final = 0;

	while (n < MAX_FRAMES && pos + 2 <= size) {
		size_t l = (size_t)data[pos] | ((size_t)data[pos + 1] << 8);
		pos += 2;
		if (l > size - pos) {
			l = size - pos;
		}
		frame[n] = data + pos;
		len[n] = l;
		n++;
		pos += l;
	}
	if (n == 0) {
		return 0;
	}
	/* Require the digest mode the header names, so all get fuzzed. */
	rc = fb_stream_pull_alloc(&f->ctx,
	    len[0] > 2 ? (fb_stream_digest)(frame[0][2] % 3)
	               : FB_STREAM_DIGEST_FULL,
	    f->stream_key, frame[0], len[0], FZ_MAX_CHUNK, &p, &why);
	if ((rc == FB_OK) != (p != NULL) ||
	    (rc == FB_OK) != (why == FB_REJECT_NONE)) {
		abort();
	}
	if (rc != FB_OK) {
		return 0;
	}
	for (size_t i = 1; i + 1 < n; i++) {
		uint8_t *buf = malloc(len[i] > 0 ? len[i] : 1);
		size_t mlen = 0;
		if (buf == NULL) {
			break;
		}
		memcpy(buf, frame[i], len[i]);
		if (i % 2 == 0 && frame[0][2] % 3 != FB_STREAM_DIGEST_FULL) {
			rc = fb_stream_pull_chunk_par(p, buf, len[i],
			    len[i] > 0 ? buf + 1 : buf,
			    len[i] > 0 ? len[i] - 1 : 0, &mlen, &final, &why,
			    run_rev, NULL);
		} else {
			rc = fb_stream_pull_chunk(p, buf, len[i],
			    len[i] > 0 ? buf + 1 : buf,
			    len[i] > 0 ? len[i] - 1 : 0, &mlen, &final, &why);
		}
		free(buf);
		if (rc != FB_OK) {
			if (why == FB_REJECT_NONE || mlen != 0) {
				abort();
			}
			break;
		}
		seen += mlen;
	}
	if (n >= 2) {
		rc = fb_stream_pull_final(
		    p, &f->worker_pk, frame[n - 1], len[n - 1], &total, &why);
		if ((rc == FB_OK) != (why == FB_REJECT_NONE)) {
			abort();
		}
		if (rc == FB_OK && (total != seen || !final)) {
			abort();
		}
	}
	fb_stream_pull_free(p);
	return 0;
}

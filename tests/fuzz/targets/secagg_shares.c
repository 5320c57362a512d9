/* SPDX-License-Identifier: Apache-2.0 */
/*
 * secagg_shares.c -- libFuzzer target: sealed share messages, as the
 * coordinator checks a worker's batch before relaying it
 * (fb_secagg_server_add_shares, fb_secagg_share_msg_peek) and as worker 0
 * opens the ones addressed to it (fb_secagg_worker_add_share). Input: byte
 * 0 = the sending slot (mod 4), then the batch. A message worker 0 takes
 * twice is refused the second time; a batch the coordinator takes has the
 * size of one message per neighbour.
 */
#include "tests/fuzz/secagg_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const sa_fixture *f = sa_setup();
	fb_secagg_server *s = NULL;
	fb_secagg_worker *w = NULL;
	uint8_t *m;
	uint32_t from;
	fb_err rc;

	if (size < 1) {
		return 0;
	}
	from = data[0] % SA_N;
	if ((m = sa_copy(data + 1, size - 1)) == NULL) {
		return 0;
	}
	size--;
	sa_server_to(0, &s);
	rc = fb_secagg_server_add_shares(s, from, m, size);
	if (rc == FB_OK && size != SA_BATCH) {
		abort();
	}
	sa_worker_to(0, f->rng0, 1, &w);
	for (size_t off = 0; off < size; off += FB_SECAGG_SHARE_MSG_LEN) {
		size_t n = size - off < FB_SECAGG_SHARE_MSG_LEN
		               ? size - off
		               : FB_SECAGG_SHARE_MSG_LEN;
		uint32_t pf, pt;
		uint8_t *one = sa_copy(m + off, n);
		if (one == NULL) {
			break;
		}
		(void)fb_secagg_share_msg_peek(one, n, &pf, &pt);
		if (fb_secagg_worker_add_share(w, one, n) == FB_OK &&
		    (n != FB_SECAGG_SHARE_MSG_LEN || pt != 0 || pf == 0 ||
		        fb_secagg_worker_add_share(w, one, n) != FB_EPROTO)) {
			abort();
		}
		free(one);
	}
	fb_secagg_worker_free(w);
	fb_secagg_server_free(s);
	free(m);
	return 0;
}

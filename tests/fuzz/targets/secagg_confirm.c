/* SPDX-License-Identifier: Apache-2.0 */
/*
 * secagg_confirm.c -- libFuzzer target: a confirmation of the included
 * set (the consistency check), as the coordinator checks it against its
 * own set (fb_secagg_server_add_confirm) and as worker 0, having signed
 * the full set, checks a neighbour's (fb_secagg_worker_add_confirm).
 * Input: the confirmation bytes, from the slot they name (bytes 24..28;
 * slot 1 when out of range). The two sides must agree on a neighbour's,
 * and a confirmation counts once.
 */
#include "tests/fuzz/secagg_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const sa_fixture *f = sa_setup();
	fb_secagg_server *s = NULL;
	fb_secagg_worker *w = NULL;
	uint8_t *m = sa_copy(data, size);
	uint32_t from = sa_index(data, size, 24, 1);
	fb_err srv, wrk;

	if (m == NULL) {
		return 0;
	}
	sa_server_to(2, &s);
	srv = fb_secagg_server_add_confirm(s, from, m, size);
	sa_worker_to(0, f->rng0, 3, &w);
	wrk = fb_secagg_worker_add_confirm(w, m, size);
	if (from != 0 && (srv == FB_OK) != (wrk == FB_OK)) {
		abort();
	}
	if (srv == FB_OK &&
	    fb_secagg_server_add_confirm(s, from, m, size) != FB_EPROTO) {
		abort();
	}
	if (wrk == FB_OK &&
	    (fb_secagg_worker_confirmations(w) != 2 ||
	        fb_secagg_worker_add_confirm(w, m, size) != FB_EPROTO)) {
		abort();
	}
	fb_secagg_worker_free(w);
	fb_secagg_server_free(s);
	free(m);
	return 0;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * secagg_advert.c -- libFuzzer target: a SecAgg+ key advert as the
 * coordinator checks it (fb_secagg_server_add_advert) and as worker 0
 * checks a neighbour's (fb_secagg_worker_add_advert). Input: the advert
 * bytes, checked against the identity key of the slot it names (bytes
 * 24..28; slot 1 when out of range). Both sides must agree on a neighbour's
 * advert; an accepted one is refused the second time, and a different
 * slot's copy is refused under the same key (one identity, one slot).
 * A neighbour's advert with the worker's own keys in it the worker alone
 * can refuse.
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
	uint32_t slot = sa_index(data, size, 24, 1);
	uint8_t own[FB_SECAGG_ADV_LEN];
	fb_err srv, wrk;

	if (m == NULL) {
		return 0;
	}
	sa_check(fb_secagg_server_alloc(&f->p, &s), "server");
	fz_rng_state = f->rng0;
	sa_check(fb_secagg_worker_alloc(&f->p, 0, &w), "worker");
	sa_check(fb_secagg_worker_advertise(w, f->ids[0], own), "advertise");
	srv = fb_secagg_server_add_advert(s, slot, &f->pks[slot], m, size);
	wrk = fb_secagg_worker_add_advert(w, &f->pks[slot], m, size);
	/* slot 0 is the worker itself: checked, then ignored. A neighbour's
	 * advert carrying the worker's own c_pk or s_pk (a replay of its
	 * keys) only the worker can tell: the server, which has not seen
	 * them, takes it, and the worker must refuse it. */
	if (slot != 0 && size == FB_SECAGG_ADV_LEN &&
	    (memcmp(m + 28, own + 28, 32) == 0 ||
	        memcmp(m + 60, own + 60, 32) == 0)) {
		if (wrk == FB_OK) {
			abort();
		}
	} else if (slot != 0 && (srv == FB_OK) != (wrk == FB_OK)) {
		abort();
	}
	if (srv == FB_OK) {
		if (size != FB_SECAGG_ADV_LEN ||
		    fb_secagg_server_add_advert(
		        s, slot, &f->pks[slot], m, size) != FB_EPROTO) {
			abort();
		}
		/* the same identity key for another slot: refused */
		if (fb_secagg_server_add_advert(s, (slot + 1) % SA_N,
		        &f->pks[slot], f->adv[(slot + 1) % SA_N],
		        FB_SECAGG_ADV_LEN) == FB_OK) {
			abort();
		}
	}
	if (wrk == FB_OK && slot != 0 &&
	    fb_secagg_worker_add_advert(w, &f->pks[slot], m, size) !=
	        FB_EPROTO) {
		abort();
	}
	fb_secagg_worker_free(w);
	fb_secagg_server_free(s);
	free(m);
	return 0;
}

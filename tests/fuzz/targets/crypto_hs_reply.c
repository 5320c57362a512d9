/* SPDX-License-Identifier: Apache-2.0 */
/*
 * crypto_hs_reply.c -- libFuzzer target: the worker parsing and verifying
 * the coordinator's reply (fb_handshake_finish) to the fixture's hello.
 * Input: the reply bytes.
 */
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const fz_fixture *f = fz_setup();
	fb_session *s = NULL;
	fb_reject why = FB_REJECT_NONE;
	fb_err rc;

	rc = fb_handshake_finish(f->hs, data, size, &s, &why);
	if ((rc == FB_OK) != (why == FB_REJECT_NONE) ||
	    (rc == FB_OK) != (s != NULL)) {
		abort();
	}
	if (rc == FB_OK && fb_session_worker_id(s) == FB_SENDER_COORDINATOR) {
		abort();
	}
	fb_session_free(s);
	return 0;
}

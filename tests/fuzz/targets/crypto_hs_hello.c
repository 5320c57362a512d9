/* SPDX-License-Identifier: Apache-2.0 */
/*
 * crypto_hs_hello.c -- libFuzzer target: the coordinator parsing and
 * verifying a worker hello (fb_handshake_accept), its cookie included.
 * Input: the hello bytes. A valid hello must yield a session, and a
 * refusal must say why.
 */
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const fz_fixture *f = fz_setup();
	fb_hs_accept_cfg cfg = fz_accept_cfg();
	uint8_t reply[FB_HS_REPLY_LEN];
	fb_session *s = NULL;
	fb_reject why = FB_REJECT_NONE;
	fb_err rc;

	(void)f;
	rc = fb_handshake_accept(&cfg, data, size, reply, &s, &why);
	if ((rc == FB_OK) != (why == FB_REJECT_NONE) ||
	    (rc == FB_OK) != (s != NULL)) {
		abort();
	}
	if (rc == FB_OK && (fb_session_worker_id(s) != FZ_WORKER_ID ||
	                       size != FB_HS_HELLO_LEN)) {
		abort();
	}
	fb_session_free(s);
	return 0;
}

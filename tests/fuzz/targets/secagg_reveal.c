/* SPDX-License-Identifier: Apache-2.0 */
/*
 * secagg_reveal.c -- libFuzzer target: an unmasking reveal as the
 * coordinator checks and keeps it (fb_secagg_server_add_reveal), then
 * reconstructs with it (fb_secagg_server_finish) next to the honest
 * reveals of the others. Input: byte 0 = the revealing slot (mod 4), byte
 * 1 bit 0 = add the honest reveals before (else after) it, then the
 * reveal. Whatever the bytes, an unmask that finishes must give back the
 * sum of the plain inputs exactly: a share that changed a secret and still
 * passed its commitment would be caught here.
 */
#include "tests/fuzz/secagg_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
honest(fb_secagg_server *s, uint32_t skip)
{
	for (uint32_t i = 0; i < SA_N; i++) {
		if (i != skip) {
			(void)fb_secagg_server_add_reveal(
			    s, i, sa.reveal[i], sa.reveal_len[i]);
		}
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const sa_fixture *f = sa_setup();
	fb_secagg_server *s = NULL;
	uint32_t from, sum[SA_LEN];
	uint8_t *m;
	int before;
	fb_err rc;

	if (size < 2) {
		return 0;
	}
	from = data[0] % SA_N;
	before = data[1] & 1;
	if ((m = sa_copy(data + 2, size - 2)) == NULL) {
		return 0;
	}
	size -= 2;
	sa_server_to(3, &s);
	if (before) {
		honest(s, from);
	}
	rc = fb_secagg_server_add_reveal(s, from, m, size);
	if (rc == FB_OK &&
	    fb_secagg_server_add_reveal(s, from, m, size) != FB_EPROTO) {
		abort();
	}
	if (!before) {
		honest(s, from);
	}
	if (fb_secagg_server_finish(s) == FB_OK) {
		memcpy(sum, f->masked, sizeof(sum));
		if (fb_secagg_server_unmask_chunk(s, sum, 0, SA_LEN) != FB_OK ||
		    memcmp(sum, f->plain, sizeof(sum)) != 0) {
			abort();
		}
	}
	fb_secagg_server_free(s);
	free(m);
	return 0;
}

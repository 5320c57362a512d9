/* SPDX-License-Identifier: Apache-2.0 */
/*
 * crypto_msg_open.c -- libFuzzer target: opening a sealed message on the
 * coordinator's session (fb_msg_open, fb_msg_peek). Input: one selector
 * byte (bits 0-1: round to accept, any/1/2/3; bit 2: open in place), then
 * the sealed message. The replay window is reset per input so that runs
 * are reproducible.
 */
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const fz_fixture *f = fz_setup();
	static const uint32_t rounds[4] = {FB_ROUND_ANY, 1, 2, 3};
	uint8_t *copy = NULL, *body = NULL;
	size_t body_len = 1, cap;
	fb_msg_info info, peek;
	fb_reject why = FB_REJECT_NONE;
	fb_err rc;
	uint8_t sel;

	if (size < 1) {
		return 0;
	}
	sel = data[0];
	data++;
	size--;
	f->coord_s->recv_seq = 0;
	/* An exact-size heap copy so ASan sees any overread. */
	copy = malloc(size > 0 ? size : 1);
	if (copy == NULL) {
		return 0;
	}
	memcpy(copy, data, size);
	if (sel & 4) {
		cap = size > FB_MSG_HEADER_LEN ? size - FB_MSG_HEADER_LEN : 0;
		body = copy + FB_MSG_HEADER_LEN;
	} else {
		cap = size;
		body = malloc(cap > 0 ? cap : 1);
		if (body == NULL) {
			free(copy);
			return 0;
		}
	}
	rc = fb_msg_open(f->coord_s, rounds[sel & 3], copy, size,
	    cap > 0 ? body : NULL, cap, &body_len, &info, &why);
	if ((rc == FB_OK) != (why == FB_REJECT_NONE) ||
	    (rc != FB_OK && body_len != 0)) {
		abort();
	}
	if (rc == FB_OK) {
		if (body_len + FB_MSG_OVERHEAD != size ||
		    info.sender != FZ_WORKER_ID ||
		    fb_msg_peek(data, size, &peek) != FB_OK ||
		    peek.seq != info.seq) {
			abort();
		}
	}
	if (!(sel & 4)) {
		free(body);
	}
	free(copy);
	return 0;
}

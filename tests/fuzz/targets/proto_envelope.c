/* SPDX-License-Identifier: Apache-2.0 */
/*
 * proto_envelope.c -- libFuzzer target: fb_msg_unpack_envelope, the decoder
 * that runs on the body of a sealed frame once its MAC checked out. Input:
 * one byte whose bit 0 is the frame's payload flag (with_payload), then the
 * bare Envelope. Same invariants as proto_frame (proto_check.h).
 */
#include "common/log.h"
#include "tests/fuzz/proto_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int init;
	static fb_msg m;
	const char *why = NULL;
	uint8_t *copy;
	bool with_payload;
	fb_err rc;

	if (!init) {
		fb_log_init("fuzz", FB_LOG_ERROR);
		init = 1;
	}
	if (size < 1) {
		return 0;
	}
	with_payload = (data[0] & 1) != 0;
	data++;
	size--;
	copy = malloc(size > 0 ? size : 1); /* exact size, for ASan */
	if (copy == NULL) {
		return 0;
	}
	if (size > 0) {
		memcpy(copy, data, size);
	}
	memset(&m, 0xa5, sizeof(m));
	rc = fb_msg_unpack_envelope(copy, size, with_payload, &m, &why);
	if (rc == FB_OK) {
		if (size + FB_WIRE_PREFIX_LEN > FB_MAX_CONTROL_LEN) {
			abort();
		}
		pc_check_msg(&m, with_payload);
	} else {
		pc_check_reject(rc, &m, why);
	}
	free(copy);
	return 0;
}

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * proto_frame.c -- libFuzzer target: fb_msg_unpack on a whole frame 0 as
 * it comes off the socket (4-byte prefix, then a protobuf Envelope). Input:
 * the frame, nothing else. An accepted message must pass proto_check.h's
 * invariants (fields in range, pack -> unpack round trip); a refused one
 * must come back zeroed, with a reason.
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
	fb_err rc;

	if (!init) {
		fb_log_init("fuzz", FB_LOG_ERROR);
		init = 1;
	}
	/* An exact-size heap copy so ASan sees any overread. */
	copy = malloc(size > 0 ? size : 1);
	if (copy == NULL) {
		return 0;
	}
	if (size > 0) {
		memcpy(copy, data, size);
	}
	memset(&m, 0xa5, sizeof(m)); /* unpack must overwrite all of it */
	rc = fb_msg_unpack(copy, size, &m, &why);
	if (rc == FB_OK) {
		if (size < FB_WIRE_PREFIX_LEN || size > FB_MAX_CONTROL_LEN ||
		    (copy[3] & FB_WIRE_SEALED) != 0) {
			abort();
		}
		pc_check_msg(&m, (copy[3] & FB_WIRE_PAYLOAD) != 0);
	} else {
		pc_check_reject(rc, &m, why);
	}
	free(copy);
	return 0;
}

/* SPDX-License-Identifier: Apache-2.0 */
/* err.c -- names of error codes, and the panic used by FB_ASSERT. */
#include <stdio.h>
#include <stdlib.h>

#include "common/err.h"

static const char *const err_names[FB_ERR_COUNT_] = {
	[FB_OK] = "success",
	[FB_ENOMEM] = "out of memory",
	[FB_EINVAL] = "invalid argument",
	[FB_ETIMEDOUT] = "timed out",
	[FB_EPROTO] = "protocol error",
	[FB_EAUTH] = "authentication failed",
	[FB_ESTALE] = "stale round",
	[FB_EIO] = "input/output error",
	[FB_ECONFIG] = "configuration error",
	[FB_EFORMAT] = "corrupt or truncated data",
	[FB_ECLOSED] = "closed",
	[FB_ERANGE] = "value out of range",
	[FB_ENOTSUP] = "not supported",
	[FB_EZMQ] = "ZeroMQ error",
	[FB_ECUDA] = "CUDA error",
	[FB_ENCCL] = "NCCL error",
	[FB_EAGAIN] = "peer queue full",
};

const char *
fb_strerror(fb_err err)
{
	if ((unsigned)err >= FB_ERR_COUNT_ || err_names[err] == NULL) {
		return "unknown error";
	}
	return err_names[err];
}

void
fb_panic(const char *file, int line, const char *what)
{
	fprintf(stderr, "fedbox: internal error at %s:%d: assertion '%s' "
	    "failed\n", file, line, what);
	abort();
}

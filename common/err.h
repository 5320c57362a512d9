/* SPDX-License-Identifier: Apache-2.0 */
/*
 * err.h -- the one error type of fedbox.
 *
 * Every fallible function returns an fb_err; 0 is success. Foreign errors
 * (errno, zmq, protobuf-c, CUDA, NCCL, libyaml) are translated where they
 * enter and their detail is logged there, so callers only branch on the code.
 */
#ifndef FB_COMMON_ERR_H
#define FB_COMMON_ERR_H

typedef enum fb_err {
	FB_OK = 0,
	FB_ENOMEM,    /* allocation failed */
	FB_EINVAL,    /* bad argument or bad value from a user */
	FB_ETIMEDOUT, /* a wait ran out of time */
	FB_EPROTO,    /* malformed or unexpected frame */
	FB_EAUTH,     /* MAC or signature check failed */
	FB_ESTALE,    /* message for a closed round */
	FB_EIO,       /* file or system call failed */
	FB_ECONFIG,   /* configuration error (already reported) */
	FB_EFORMAT,   /* corrupt or truncated file */
	FB_ECLOSED,   /* peer or program is shutting down */
	FB_ERANGE,    /* value outside the representable range */
	FB_ENOTSUP,   /* not supported by this build or peer */
	FB_EZMQ,      /* ZeroMQ call failed */
	FB_ECUDA,     /* CUDA runtime or cuBLAS call failed */
	FB_ENCCL,     /* NCCL call failed */
	FB_EAGAIN,    /* would block: the peer's queue is full, try later */
	FB_ERR_COUNT_
} fb_err;

/* fb_strerror returns a static, human-readable name for `err`. */
const char *fb_strerror(fb_err err);

#define FB_MUST_CHECK __attribute__((warn_unused_result))

/* FB_ASSERT aborts on a programmer bug; never use it on peer or user input. */
#define FB_ASSERT(cond)                                                  \
	do {                                                             \
		if (!(cond)) {                                           \
			fb_panic(__FILE__, __LINE__, #cond);             \
		}                                                        \
	} while (0)

_Noreturn void fb_panic(const char *file, int line, const char *what);

#endif

/* SPDX-License-Identifier: Apache-2.0 */
/*
 * io.c -- whole messages over the trainer's non-blocking Unix socket, with
 * deadlines: a trainer that stops reading or stops halfway through a
 * message costs the worker its deadline, never a stuck thread, and a length
 * over the limit is refused before anything is allocated for it.
 */
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

#include "common/log.h"
#include "common/util.h"
#include "worker/proc/proc_impl.h"

#define SLICE_MS 50 /* longest wait between looks at cancel and stop_cb */

/* wait_fd polls `fd` for `events` for at most min(deadline, a slice).
 * Returns 1 ready, 0 not yet, -1 past the deadline. */
static int
wait_fd(int fd, short events, int64_t deadline_ms)
{
	struct pollfd p = {.fd = fd, .events = events};
	int64_t left = deadline_ms - fb_now_ms();
	int rc;

	if (left <= 0) {
		return -1;
	}
	rc = poll(&p, 1, (int)(left < SLICE_MS ? left : SLICE_MS));
	if (rc < 0 && errno != EINTR) {
		return 1; /* let the read or write report the error */
	}
	return rc > 0 ? 1 : 0;
}

fb_err
fb_proc_send(int fd, const fb_proc_buf *b, const int *fds, int n_fds,
    int64_t deadline_ms)
{
	size_t at = 0;
	int r;

	FB_ASSERT(n_fds >= 0 && n_fds <= 4);
	while (at < b->len) {
		struct iovec iov = {
		    .iov_base = b->p + at, .iov_len = b->len - at};
		union {
			char buf[CMSG_SPACE(4 * sizeof(int))];
			struct cmsghdr align;
		} ctl;
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
		ssize_t n;

		if (at == 0 && n_fds > 0) {
			struct cmsghdr *cm;
			memset(&ctl, 0, sizeof(ctl));
			mh.msg_control = ctl.buf;
			mh.msg_controllen = CMSG_SPACE(n_fds * sizeof(int));
			cm = CMSG_FIRSTHDR(&mh);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(n_fds * sizeof(int));
			memcpy(CMSG_DATA(cm), fds, n_fds * sizeof(int));
		}
		n = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (n > 0) {
			at += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR) {
			continue;
		}
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
			fb_log_debug(
			    "trainer socket: send: %s", strerror(errno));
			return FB_EIO;
		}
		while ((r = wait_fd(fd, POLLOUT, deadline_ms)) == 0) {
		}
		if (r < 0) {
			return FB_ETIMEDOUT;
		}
	}
	return FB_OK;
}

/*
 * read_some reads into buf[*at..want). Returns FB_OK when complete,
 * FB_EAGAIN to wait, FB_EIO when the peer closed or failed.
 */
static fb_err
read_some(int fd, uint8_t *buf, size_t want, size_t *at)
{
	while (*at < want) {
		ssize_t n = recv(fd, buf + *at, want - *at, 0);
		if (n > 0) {
			*at += (size_t)n;
			continue;
		}
		if (n == 0) {
			return FB_EIO;
		}
		if (errno == EINTR) {
			continue;
		}
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			return FB_EAGAIN;
		}
		fb_log_debug("trainer socket: recv: %s", strerror(errno));
		return FB_EIO;
	}
	return FB_OK;
}

fb_err
fb_proc_recv(int fd, uint8_t **body, size_t *cap, size_t *body_len,
    int64_t deadline_ms, fb_proc_cancel *cancel, fb_proc_stop_cb stop_cb,
    void *stop_arg)
{
	uint8_t head[4];
	size_t at = 0;
	uint32_t len = 0;
	bool have_len = false;
	fb_err rc;
	int r;

	*body_len = 0;
	for (;;) {
		if (!have_len) {
			rc = read_some(fd, head, sizeof(head), &at);
			if (rc == FB_OK) {
				memcpy(&len, head, 4);
				if (len > FB_PROC_MSG_MAX) {
					fb_log_warn("trainer sent a message of "
					            "%u bytes (at most %u)",
					    len, FB_PROC_MSG_MAX);
					return FB_EPROTO;
				}
				if (len > *cap) {
					uint8_t *p = fb_alloc(len);
					if (p == NULL) {
						return FB_ENOMEM;
					}
					fb_free(*body);
					*body = p;
					*cap = len;
				}
				have_len = true;
				at = 0;
				continue;
			}
		} else {
			rc = read_some(fd, *body, len, &at);
			if (rc == FB_OK) {
				*body_len = len;
				return FB_OK;
			}
		}
		if (rc != FB_EAGAIN) {
			return rc;
		}
		while ((r = wait_fd(fd, POLLIN, deadline_ms)) == 0) {
			if (fb_proc_cancelled(cancel)) {
				return FB_ECLOSED;
			}
			if (stop_cb != NULL && stop_cb(stop_arg)) {
				return FB_EAGAIN;
			}
		}
		if (r < 0) {
			return FB_ETIMEDOUT;
		}
	}
}

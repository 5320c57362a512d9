/* SPDX-License-Identifier: Apache-2.0 */
/*
 * child.c -- the trainer's process: where it listens, how it starts and
 * stops, and who may talk to the worker as its trainer.
 *
 * Each worker makes one private folder (mkdtemp: mode 0700, ours) and, per
 * trainer it starts, a listening Unix socket in it and a fresh 32-byte
 * token, both passed in the trainer's environment. A connection counts as
 * the trainer's only when (1) the kernel says (SO_PEERCRED) that the peer
 * runs under our uid as the trainer's first process or one of its
 * descendants (torchrun's rank 0 is a child of torchrun), and (2) it then
 * presents the token. The first connection that passes closes and removes
 * the listening socket and spends the token, so nothing else can connect
 * until the next trainer starts. Other users cannot reach the socket at all
 * (the folder is 0700); our own other processes fail (1).
 *
 * Trainers are forked by one long-lived thread of ours: the kernel's
 * parent-death signal (SIGKILL, armed in the child) follows the thread that
 * forked, and the rounds' training threads come and go. Each trainer runs in
 * a process group of its own, which stop() signals as a whole (torchrun
 * and its ranks), and only while its first process is not yet reaped, so
 * that the group's id cannot have been reused.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "worker/proc/proc_impl.h"
#include "worker/trainer.h"

extern char **environ;

#define SOCK_NAME "trainer.sock"

typedef enum spawn_phase {
	SPAWN_IDLE = 0,
	SPAWN_ASKED,
	SPAWN_DONE,
	SPAWN_QUIT,
} spawn_phase;

struct fb_proc_child {
	char *exe;   /* owned: the program's path */
	char **argv; /* owned: argc + 1, NULL-terminated */
	uint32_t argc;
	char **extra; /* owned: NAME=VALUE added to the environment */
	uint32_t extra_count;
	char *workdir; /* owned, or NULL */
	char sock[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int lfd;     /* listening socket, or -1 */
	pid_t pid;   /* the trainer's first process, or 0 */
	bool exited; /* it has ended (seen with WNOWAIT; not reaped) */
	int status;  /* its wait status once exited */
	uint8_t token[FB_PROC_TOKEN_LEN];
	bool token_live; /* not spent yet */
	/* the fork thread */
	pthread_t thread;
	bool thread_live;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	spawn_phase phase;
	char **envp; /* for the fork asked for */
	pid_t spawned;
	int spawn_errno;
};

/* ---- finding the program ---- */

static bool
is_exec_file(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 && S_ISREG(st.st_mode) &&
	       access(path, X_OK) == 0;
}

/* Resolved now, so that a typo is an error when the worker starts rather
 * than a trainer that never comes; a path with a slash is taken relative
 * to `workdir` (where it will run). */
fb_err
fb_trainer_proc_find(const char *argv0, const char *workdir, char **out)
{
	const char *path = getenv("PATH");
	char buf[PATH_MAX];

	*out = NULL;
	if (argv0[0] == '\0') {
		fb_log_error("train.command: the program name is empty");
		return FB_EINVAL;
	}
	if (strchr(argv0, '/') != NULL) {
		if (argv0[0] != '/' && workdir != NULL && workdir[0] != '\0') {
			snprintf(buf, sizeof(buf), "%s/%s", workdir, argv0);
		} else {
			snprintf(buf, sizeof(buf), "%s", argv0);
		}
		if (!is_exec_file(buf)) {
			fb_log_error("train.command: %s is not an executable "
			             "file",
			    buf);
			return FB_EINVAL;
		}
		*out = strdup(buf);
		return *out == NULL ? FB_ENOMEM : FB_OK;
	}
	if (path == NULL || path[0] == '\0') {
		path = "/usr/local/bin:/usr/bin:/bin";
	}
	while (*path != '\0') {
		const char *end = strchr(path, ':');
		size_t n = end != NULL ? (size_t)(end - path) : strlen(path);
		if (n == 0) {
			snprintf(buf, sizeof(buf), "./%s", argv0);
		} else {
			snprintf(
			    buf, sizeof(buf), "%.*s/%s", (int)n, path, argv0);
		}
		if (is_exec_file(buf)) {
			*out = strdup(buf);
			return *out == NULL ? FB_ENOMEM : FB_OK;
		}
		path += n;
		if (*path == ':') {
			path++;
		}
	}
	fb_log_error("train.command: %s is not found in PATH (%s)", argv0,
	    getenv("PATH") != NULL ? getenv("PATH") : "unset");
	return FB_EINVAL;
}

/* ---- the fork thread ---- */

/*
 * child_exec runs in the forked child: only async-signal-safe calls until
 * execve. `errfd` (close-on-exec) carries errno back if exec fails.
 */
static _Noreturn void
child_exec(const fb_proc_child *c, char **envp, pid_t parent, int errfd)
{
	sigset_t none;
	struct sigaction dfl;
	int e, devnull;

	setpgid(0, 0);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent) {
		_exit(127); /* the worker is already gone */
	}
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	memset(&dfl, 0, sizeof(dfl));
	dfl.sa_handler = SIG_DFL;
	sigaction(SIGPIPE, &dfl, NULL); /* ignored in the worker */
	sigaction(SIGINT, &dfl, NULL);
	sigaction(SIGTERM, &dfl, NULL);
	if ((devnull = open("/dev/null", O_RDONLY)) >= 0) {
		dup2(devnull, 0);
	}
	/* errfd to 3, then nothing else of the worker's stays open. */
	if (errfd != 3) {
		dup2(errfd, 3);
	}
	fcntl(3, F_SETFD, FD_CLOEXEC);
	syscall(SYS_close_range, 4u, ~0u, 0u);
	if (c->workdir != NULL && chdir(c->workdir) != 0) {
		e = errno;
		if (write(3, &e, sizeof(e)) < 0) {
			/* nothing more to say */
		}
		_exit(127);
	}
	execve(c->exe, c->argv, envp);
	e = errno;
	if (write(3, &e, sizeof(e)) < 0) {
		/* nothing more to say */
	}
	_exit(127);
}

/* spawn_one forks and execs; sets c->spawned or c->spawn_errno. */
static void
spawn_one(fb_proc_child *c, char **envp)
{
	int p[2];
	pid_t pid, self = getpid();
	int e = 0;
	ssize_t n;

	c->spawned = 0;
	c->spawn_errno = 0;
	if (pipe2(p, O_CLOEXEC) != 0) {
		c->spawn_errno = errno;
		return;
	}
	pid = fork();
	if (pid < 0) {
		c->spawn_errno = errno;
		close(p[0]);
		close(p[1]);
		return;
	}
	if (pid == 0) {
		close(p[0]);
		child_exec(c, envp, self, p[1]);
	}
	close(p[1]);
	setpgid(pid, pid); /* also here: no window where it has none */
	do {
		n = read(p[0], &e, sizeof(e));
	} while (n < 0 && errno == EINTR);
	close(p[0]);
	if (n == (ssize_t)sizeof(e)) {
		/* exec failed: reap it here, it never ran our program */
		waitpid(pid, NULL, 0);
		c->spawn_errno = e != 0 ? e : ENOEXEC;
		return;
	}
	c->spawned = pid;
}

static void *
spawn_main(void *arg)
{
	fb_proc_child *c = arg;

	pthread_mutex_lock(&c->mu);
	for (;;) {
		while (c->phase != SPAWN_ASKED && c->phase != SPAWN_QUIT) {
			pthread_cond_wait(&c->cv, &c->mu);
		}
		if (c->phase == SPAWN_QUIT) {
			break;
		}
		spawn_one(c, c->envp);
		c->phase = SPAWN_DONE;
		pthread_cond_broadcast(&c->cv);
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

/* ---- alloc / free ---- */

fb_err
fb_proc_child_alloc(const char *const *argv, uint32_t argc,
    const char *const *env, uint32_t env_count, const char *workdir,
    fb_proc_child **out)
{
	fb_err rc = FB_OK;
	fb_proc_child *c = NULL;
	const char *tmp = getenv("TMPDIR");
	char tmpl[PATH_MAX];

	*out = NULL;
	if (argc < 1) {
		fb_log_error("train.command is empty");
		return FB_EINVAL;
	}
	if ((c = fb_calloc(1, sizeof(*c))) == NULL) {
		return FB_ENOMEM;
	}
	c->lfd = -1;
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	if (workdir != NULL && workdir[0] != '\0' &&
	    (c->workdir = strdup(workdir)) == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	if ((rc = fb_trainer_proc_find(argv[0], c->workdir, &c->exe)) !=
	    FB_OK) {
		goto out;
	}
	c->argv = fb_calloc(argc + 1, sizeof(char *));
	c->extra = fb_calloc(env_count + 1, sizeof(char *));
	if (c->argv == NULL || c->extra == NULL) {
		rc = FB_ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < argc; i++) {
		if ((c->argv[i] = strdup(argv[i])) == NULL) {
			rc = FB_ENOMEM;
			goto out;
		}
		c->argc = i + 1;
	}
	for (uint32_t i = 0; i < env_count; i++) {
		if (strchr(env[i], '=') == NULL || env[i][0] == '=') {
			fb_log_error(
			    "train.env: \"%s\" is not NAME=VALUE", env[i]);
			rc = FB_EINVAL;
			goto out;
		}
		if ((c->extra[i] = strdup(env[i])) == NULL) {
			rc = FB_ENOMEM;
			goto out;
		}
		c->extra_count = i + 1;
	}
	/* A short base keeps the socket path within sun_path (108 bytes). */
	if (tmp == NULL || tmp[0] != '/' ||
	    strlen(tmp) + sizeof("/fedbox-trainer.XXXXXX/" SOCK_NAME) >
	        sizeof(c->sock)) {
		tmp = "/tmp";
	}
	snprintf(tmpl, sizeof(tmpl), "%s/fedbox-trainer.XXXXXX", tmp);
	if (mkdtemp(tmpl) == NULL) {
		fb_log_error("trainer: cannot make a private folder in %s: %s",
		    tmp, strerror(errno));
		rc = FB_EIO;
		goto out;
	}
	/* tmp's length was checked: both fit. */
	memcpy(c->dir, tmpl, strlen(tmpl) + 1);
	memcpy(c->sock, tmpl, strlen(tmpl));
	memcpy(c->sock + strlen(tmpl), "/" SOCK_NAME, sizeof("/" SOCK_NAME));
	if (pthread_create(&c->thread, NULL, spawn_main, c) != 0) {
		fb_log_error("trainer: cannot start the fork thread");
		rc = FB_EIO;
		goto out;
	}
	c->thread_live = true;
	*out = c;
	c = NULL;
out:
	fb_proc_child_free(c);
	return rc;
}

static void
free_strv(char **v, uint32_t n)
{
	if (v == NULL) {
		return;
	}
	for (uint32_t i = 0; i < n; i++) {
		free(v[i]);
	}
	fb_free(v);
}

void
fb_proc_child_free(fb_proc_child *c)
{
	if (c == NULL) {
		return;
	}
	fb_proc_child_stop(c, 0, 0);
	if (c->thread_live) {
		pthread_mutex_lock(&c->mu);
		c->phase = SPAWN_QUIT;
		pthread_cond_broadcast(&c->cv);
		pthread_mutex_unlock(&c->mu);
		pthread_join(c->thread, NULL);
	}
	if (c->dir[0] != '\0') {
		unlink(c->sock);
		if (rmdir(c->dir) != 0) {
			fb_log_warn("trainer: cannot remove %s: %s", c->dir,
			    strerror(errno));
		}
	}
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->cv);
	free(c->exe);
	free(c->workdir);
	free_strv(c->argv, c->argc);
	free_strv(c->extra, c->extra_count);
	fb_free(c);
}

/* ---- start / stop ---- */

static bool
env_name_in(const char *entry, char *const *list, uint32_t n)
{
	size_t len = strcspn(entry, "=");
	for (uint32_t i = 0; i < n; i++) {
		if (strncmp(entry, list[i], len) == 0 && list[i][len] == '=') {
			return true;
		}
	}
	return false;
}

/*
 * build_envp: our environment, minus names that `extra` or the trainer's
 * own variables set, plus those. The strings in `own` (2) are the caller's.
 */
static fb_err
build_envp(const fb_proc_child *c, char *own[2], char ***out)
{
	size_t n = 0, at = 0;
	char **e;

	for (char **p = environ; p != NULL && *p != NULL; p++) {
		n++;
	}
	if ((e = fb_calloc(n + c->extra_count + 3, sizeof(char *))) == NULL) {
		return FB_ENOMEM;
	}
	for (char **p = environ; p != NULL && *p != NULL; p++) {
		if (env_name_in(*p, c->extra, c->extra_count) ||
		    env_name_in(*p, own, 2)) {
			continue;
		}
		e[at++] = *p;
	}
	for (uint32_t i = 0; i < c->extra_count; i++) {
		e[at++] = c->extra[i];
	}
	e[at++] = own[0];
	e[at++] = own[1];
	e[at] = NULL;
	*out = e;
	return FB_OK;
}

static fb_err
listen_fresh(fb_proc_child *c)
{
	struct sockaddr_un sa;
	int fd;

	unlink(c->sock);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		fb_log_error("trainer socket: %s", strerror(errno));
		return FB_EIO;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", c->sock);
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
	    chmod(c->sock, 0600) != 0 || listen(fd, 8) != 0) {
		fb_log_error("trainer socket %s: %s", c->sock, strerror(errno));
		close(fd);
		unlink(c->sock);
		return FB_EIO;
	}
	c->lfd = fd;
	return FB_OK;
}

static void
close_listener(fb_proc_child *c)
{
	if (c->lfd >= 0) {
		close(c->lfd);
		c->lfd = -1;
		unlink(c->sock);
	}
}

fb_err
fb_proc_child_start(fb_proc_child *c)
{
	fb_err rc = FB_OK;
	char sock_env[sizeof(c->sock) + 32];
	char tok_env[2 * FB_PROC_TOKEN_LEN + 32];
	char *own[2] = {sock_env, tok_env};
	char **envp = NULL;
	int at;

	fb_proc_child_stop(c, 0, 0);
	if (getrandom(c->token, sizeof(c->token), 0) !=
	    (ssize_t)sizeof(c->token)) {
		fb_log_error("trainer: getrandom: %s", strerror(errno));
		return FB_EIO;
	}
	if ((rc = listen_fresh(c)) != FB_OK) {
		return rc;
	}
	snprintf(
	    sock_env, sizeof(sock_env), "FEDBOX_TRAINER_SOCKET=%s", c->sock);
	at = snprintf(tok_env, sizeof(tok_env), "FEDBOX_TRAINER_TOKEN=");
	for (size_t i = 0; i < sizeof(c->token); i++) {
		at += snprintf(tok_env + at, sizeof(tok_env) - (size_t)at,
		    "%02x", c->token[i]);
	}
	if ((rc = build_envp(c, own, &envp)) != FB_OK) {
		goto out;
	}
	pthread_mutex_lock(&c->mu);
	c->envp = envp;
	c->phase = SPAWN_ASKED;
	pthread_cond_broadcast(&c->cv);
	while (c->phase != SPAWN_DONE) {
		pthread_cond_wait(&c->cv, &c->mu);
	}
	c->phase = SPAWN_IDLE;
	c->envp = NULL;
	pthread_mutex_unlock(&c->mu);
	if (c->spawned <= 0) {
		fb_log_error("trainer: cannot start %s: %s", c->exe,
		    strerror(c->spawn_errno));
		rc = FB_EIO;
		goto out;
	}
	c->pid = c->spawned;
	c->exited = false;
	c->token_live = true;
	fb_log_info("trainer: started %s (pid %d)", c->argv[0], (int)c->pid);
out:
	/* The token's text is on our stack only until here. */
	explicit_bzero(tok_env, sizeof(tok_env));
	fb_free(envp);
	if (rc != FB_OK) {
		close_listener(c);
	}
	return rc;
}

bool
fb_proc_child_exited(fb_proc_child *c, char *why, size_t why_len)
{
	siginfo_t si;

	if (why_len > 0) {
		why[0] = '\0';
	}
	if (c->pid <= 0) {
		return false;
	}
	if (!c->exited) {
		memset(&si, 0, sizeof(si));
		if (waitid(P_PID, (id_t)c->pid, &si,
		        WEXITED | WNOHANG | WNOWAIT) != 0 ||
		    si.si_pid != c->pid) {
			return false;
		}
		c->exited = true;
		c->status =
		    si.si_code == CLD_EXITED ? si.si_status : -si.si_status;
	}
	if (c->status >= 0) {
		snprintf(why, why_len, "exited with status %d", c->status);
	} else {
		snprintf(why, why_len, "was killed by signal %d (%s)",
		    -c->status, strsignal(-c->status));
	}
	return true;
}

/* group_gone says whether no process is left in the trainer's group. */
static bool
group_gone(pid_t pgid)
{
	return kill(-pgid, 0) != 0 && errno == ESRCH;
}

void
fb_proc_child_stop(fb_proc_child *c, int first_sig, int64_t grace_ms)
{
	char why[64];
	int64_t until;

	close_listener(c);
	c->token_live = false;
	if (c->pid <= 0) {
		return;
	}
	/* The first process is not reaped yet, so the group id is ours. */
	if (grace_ms > 0 && !fb_proc_child_exited(c, why, sizeof(why))) {
		if (first_sig != 0) {
			kill(-c->pid, first_sig);
		}
		until = fb_now_ms() + grace_ms;
		while (fb_now_ms() < until &&
		       !fb_proc_child_exited(c, why, sizeof(why))) {
			fb_sleep_ms(10);
		}
	}
	kill(-c->pid, SIGKILL);
	while (waitpid(c->pid, NULL, 0) < 0 && errno == EINTR) {
	}
	/* Its descendants got SIGKILL too; give them a moment to go. */
	until = fb_now_ms() + 2000;
	while (!group_gone(c->pid) && fb_now_ms() < until) {
		fb_sleep_ms(5);
	}
	c->pid = 0;
	c->exited = false;
}

pid_t
fb_proc_child_pid(const fb_proc_child *c)
{
	return c->pid;
}

int
fb_proc_child_listen_fd(const fb_proc_child *c)
{
	return c->lfd;
}

/* ---- who may connect ---- */

/* parent_of reads the parent pid of `pid` from /proc, or returns -1. */
static pid_t
parent_of(pid_t pid)
{
	char path[64], buf[512];
	ssize_t n;
	int fd;
	char *rp;
	long pp;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
		return -1;
	}
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0) {
		return -1;
	}
	buf[n] = '\0';
	/* "pid (comm) state ppid ...": comm may hold spaces and ')'. */
	if ((rp = strrchr(buf, ')')) == NULL ||
	    sscanf(rp + 1, " %*c %ld", &pp) != 1) {
		return -1;
	}
	return (pid_t)pp;
}

/* descends says whether `pid` is `root` or one of its descendants. */
static bool
descends(pid_t pid, pid_t root)
{
	for (int depth = 0; depth < 128 && pid > 1; depth++) {
		if (pid == root) {
			return true;
		}
		pid = parent_of(pid);
	}
	return false;
}

/* ct_equal compares two tokens in time that does not depend on where
 * they differ. */
static bool
ct_equal(const uint8_t *a, const uint8_t *b, size_t n)
{
	volatile uint8_t d = 0;
	for (size_t i = 0; i < n; i++) {
		d |= a[i] ^ b[i];
	}
	return d == 0;
}

fb_err
fb_proc_child_accept(
    fb_proc_child *c, int64_t hello_ms, int *fd, fb_proc_hello *h)
{
	fb_err rc = FB_OK;
	struct ucred uc;
	socklen_t ul = sizeof(uc);
	uint8_t *body = NULL;
	size_t cap = 0, len = 0;
	fb_proc_rd r;
	uint32_t type;
	const char *why = NULL;
	int cfd;

	*fd = -1;
	memset(h, 0, sizeof(*h));
	if (c->lfd < 0) {
		return FB_EAGAIN;
	}
	cfd = accept4(c->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	if (cfd < 0) {
		if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ||
		    errno == ECONNABORTED) {
			return FB_EAGAIN;
		}
		fb_log_error("trainer socket: accept: %s", strerror(errno));
		return FB_EIO;
	}
	memset(&uc, 0, sizeof(uc));
	if (getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &uc, &ul) != 0) {
		why = "its credentials cannot be read";
	} else if (uc.uid != geteuid()) {
		why = "it runs under another user";
	} else if (!c->token_live || c->pid <= 0) {
		why = "no trainer is expected now";
	} else if (uc.pid <= 0 || !descends(uc.pid, c->pid)) {
		why = "it is not the trainer's process or one of its "
		      "descendants";
	}
	if (why != NULL) {
		rc = FB_EAUTH;
		goto out;
	}
	rc = fb_proc_recv(
	    cfd, &body, &cap, &len, fb_now_ms() + hello_ms, NULL, NULL, NULL);
	if (rc != FB_OK) {
		why = rc == FB_ETIMEDOUT ? "it sent no hello in time"
		                         : "it sent no well-formed hello";
		rc = FB_EAUTH;
		goto out;
	}
	if (fb_proc_msg_type(body, len, &r, &type) != FB_OK ||
	    type != FB_PROC_HELLO || fb_proc_hello_unpack(&r, h) != FB_OK ||
	    h->magic != FB_PROC_MAGIC) {
		why = "its first message is not a trainer's hello";
		rc = FB_EAUTH;
		goto out;
	}
	if (h->version != FB_PROC_VERSION) {
		fb_log_error("trainer speaks protocol version %u, this worker "
		             "%u: run the python/fedbox of the same fedbox",
		    h->version, FB_PROC_VERSION);
		why = "its protocol version differs";
		rc = FB_EAUTH;
		goto out;
	}
	if (!ct_equal(h->token, c->token, sizeof(c->token))) {
		why = "it did not present the token";
		rc = FB_EAUTH;
		goto out;
	}
	/* The trainer is in: nobody else may connect. */
	close_listener(c);
	c->token_live = false;
	explicit_bzero(c->token, sizeof(c->token));
	*fd = cfd;
	cfd = -1;
	fb_log_info(
	    "trainer: pid %d connected (world size %u)", (int)uc.pid, h->world);
out:
	if (why != NULL) {
		fb_log_warn("trainer socket: refused a connection from pid %d "
		            "(uid %u): %s",
		    (int)uc.pid, (unsigned)uc.uid, why);
	}
	if (cfd >= 0) {
		close(cfd);
	}
	explicit_bzero(h->token, sizeof(h->token));
	if (body != NULL) {
		explicit_bzero(body, len);
	}
	fb_free(body);
	return rc;
}

void
fb_proc_child_describe(const fb_proc_child *c, char *buf, size_t len)
{
	size_t at = 0;

	buf[0] = '\0';
	for (uint32_t i = 0; i < c->argc && at + 1 < len; i++) {
		int n = snprintf(
		    buf + at, len - at, "%s%s", i ? " " : "", c->argv[i]);
		if (n < 0) {
			break;
		}
		at += (size_t)n;
	}
}

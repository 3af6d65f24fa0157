/*
 * gpuwire-call SOCKET TOKEN KIND N [FALLBACK...] ARGV0 ARG...
 *
 * Hands one call of gpuwire-hook or gpuwire-runtime (KIND: hook | runtime) to the resident
 * gpuwire listening on SOCKET (runtime_hook/start/resident.py), which has Python and gpuwire
 * loaded already and forks a copy of itself for the call: a GPU container start then pays
 * neither the interpreter's start nor the imports (~11 ms). FALLBACK is the command the
 * launcher would otherwise exec (`python -IS -c CODE`), run with the last N words, the
 * program's own arguments (ARGV0 ARG...), after it. Where nobody answers, or the resident is
 * another build than TOKEN names, or it declines, FALLBACK runs as before.
 *
 * Without FALLBACK (a host with no Python of gpuwire's: the image's install, docs/runtime.md,
 * "No Python on the host") nothing else can do the call's work, and none is done without
 * gpuwire's checks: gpuwire-call waits for a resident that serves it (one restarting, or of
 * the new version during an upgrade) for up to WAIT_MS, asking again every RETRY_MS, and
 * then fails the call, saying why on stderr and, for a runtime call, in the runtime's --log
 * file as runc writes its errors (where containerd reads why a create failed).
 *
 * The resident's child greets first ("r"); a resident that does not within READY_MS (stopped,
 * overloaded) gets no request, and FALLBACK runs (without one: it waits for the greeting
 * until WAIT_MS is over). The request is one datagram: TOKEN, KIND,
 * the umask, N and the N arguments, then the environment, each ended by a NUL; with it go
 * stdin, stdout, stderr and the working directory as descriptors. The answer: "x" and an
 * exit status, "e" and the runtime to exec with the ARGs, or "f" and why it declines (run
 * FALLBACK). Only the standard C library: it is built
 * with `cc -static` so that it runs on any host whatever glibc the host has.
 *
 * gpuwire-hook ARG...   (argv[0] "gpuwire-hook": a CDI spec's hook names this program itself)
 *
 * The same call of gpuwire-hook without the shell launcher in between (~1 ms of /bin/sh on
 * every CDI start): the socket, token and Python fallback that launcher would pass are the
 * ones the install compiled in (HOOK_SOCKET, HOOK_TOKEN, HOOK_PYTHON, HOOK_CODE, written by
 * runtime_hook/setup/launcher.py as it writes the launcher; HOOK_PYTHON empty: none), so both
 * ask the same resident and fall back to the same Python.
 *
 * gpuwire-hook ldcache ARG...   (the CDI spec's hook)
 *
 * First the hook's links and ld cache in C (ldcache.c), which spares a CDI start even the
 * served call (~4 ms of a forked Python's work); only a call it declines, having changed
 * nothing, goes on as above, with the OCI state it read put back as stdin.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ldcache.h"

#define REQUEST_MAX (1 << 20)
#define ANSWER_MAX 8192
#define READY_MS 2000
#ifndef WAIT_MS
#define WAIT_MS 20000
#endif
#define RETRY_MS 50

extern char **environ;

static char request[REQUEST_MAX];
static size_t used;

static int add(const char *field)
{
	size_t n = strlen(field) + 1;
	if (n > sizeof(request) - used)
		return -1;
	memcpy(request + used, field, n);
	used += n;
	return 0;
}

static char why[512]; /* why the last ask was not served */

static long now_ms(void)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return now.tv_sec * 1000L + now.tv_nsec / 1000000L;
}

/* Connect, wait up to `ready_ms` for the greeting, send the request: 0 sent, -1 not (`why`) */
static int ask(const char *socket_path, int sock, char **argv, int first, int argc, long ready_ms)
{
	struct sockaddr_un address = {.sun_family = AF_UNIX};
	if (strlen(socket_path) >= sizeof(address.sun_path)) {
		snprintf(why, sizeof(why), "the socket's path is too long");
		return -1;
	}
	strcpy(address.sun_path, socket_path);
	if (connect(sock, (struct sockaddr *)&address, sizeof(address)) < 0) {
		snprintf(why, sizeof(why), "nobody listens there: %s", strerror(errno));
		return -1;
	}
	struct pollfd ready = {.fd = sock, .events = POLLIN};
	char greeting;
	if (poll(&ready, 1, (int)ready_ms) != 1 || recv(sock, &greeting, 1, 0) != 1 ||
	    greeting != 'r') {
		if (ready_ms >= READY_MS || why[0] == '\0') /* not merely the wait's last moment */
			snprintf(why, sizeof(why), "the resident there did not greet (stopped, or busy)");
		return -1;
	}

	char number[32];
	mode_t mask = umask(0);
	umask(mask);
	used = 0;
	int full = add(argv[2]) || add(argv[3]);
	snprintf(number, sizeof(number), "%o", (unsigned)mask);
	full = full || add(number);
	snprintf(number, sizeof(number), "%d", argc - first);
	full = full || add(number);
	for (int i = first; i < argc && !full; i++)
		full = add(argv[i]);
	for (char **env = environ; *env && !full; env++)
		full = add(*env);
	if (full) {
		snprintf(why, sizeof(why), "the call is larger than %d bytes", REQUEST_MAX);
		return -1;
	}

	int cwd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (cwd < 0) {
		snprintf(why, sizeof(why), "no working directory: %s", strerror(errno));
		return -1;
	}
	int fds[4] = {0, 1, 2, cwd};
	char control[CMSG_SPACE(sizeof(fds))];
	memset(control, 0, sizeof(control));
	struct iovec iov = {.iov_base = request, .iov_len = used};
	struct msghdr message = {
		.msg_iov = &iov,
		.msg_iovlen = 1,
		.msg_control = control,
		.msg_controllen = sizeof(control),
	};
	struct cmsghdr *header = CMSG_FIRSTHDR(&message);
	header->cmsg_level = SOL_SOCKET;
	header->cmsg_type = SCM_RIGHTS;
	header->cmsg_len = CMSG_LEN(sizeof(fds));
	memcpy(CMSG_DATA(header), fds, sizeof(fds));
	ssize_t sent = sendmsg(sock, &message, MSG_NOSIGNAL);
	close(cwd);
	if (sent != (ssize_t)used) {
		snprintf(why, sizeof(why), "the call was not sent: %s", strerror(errno));
		return -1;
	}
	return 0;
}

#ifdef HOOK_CODE
/* `gpuwire-hook ldcache ...` done here (ldcache.c) where it can be: 0 done, -1 declined, with
 * the OCI state read from stdin put back as stdin (a memfd, all of it) for whoever does it */
static int ldcache_here(int argc, char **argv)
{
	static char state[REQUEST_MAX];
	size_t size = 0;
	ssize_t got = 1;
	while (size < sizeof(state) && ((got = read(0, state + size, sizeof(state) - size)) > 0 ||
					(got < 0 && errno == EINTR)))
		size += got > 0 ? (size_t)got : 0;
	if (got == 0 && ldcache_hook(argc - 2, argv + 2, state, size) == 0)
		return 0;
	int fd = memfd_create("gpuwire-oci-state", 0);
	int ok = fd >= 0 && got >= 0 && !write_all(fd, state, size);
	while (ok && got > 0) { /* stdin not at its end: the rest of it */
		while ((got = read(0, state, sizeof(state))) < 0 && errno == EINTR)
			;
		ok = got >= 0 && !write_all(fd, state, (size_t)(got > 0 ? got : 0));
	}
	if (!ok || lseek(fd, 0, SEEK_SET) != 0 || dup2(fd, 0) != 0) {
		fprintf(stderr, "gpuwire-hook: cannot hand the OCI state on: %s\n", strerror(errno));
		exit(1);
	}
	if (fd != 0)
		close(fd);
	return -1;
}

/* argv as gpuwire-hook's launcher would call gpuwire-call with it; NULL where out of memory */
static char **as_launcher(int argc, char **argv, int *count)
{
	static char *settings[] = {NULL, HOOK_SOCKET, HOOK_TOKEN, "hook", NULL,
				   HOOK_PYTHON, "-IS", "-c", HOOK_CODE};
	static char number[32];
	/* no Python to fall back to (HOOK_PYTHON empty): no FALLBACK, gpuwire-call waits */
	const int fixed = HOOK_PYTHON[0] ? sizeof(settings) / sizeof(settings[0]) : 5;
	char **full = calloc((size_t)(fixed + argc + 1), sizeof(char *));
	if (full == NULL)
		return NULL;
	snprintf(number, sizeof(number), "%d", argc);
	settings[0] = argv[0];
	settings[4] = number;
	memcpy(full, settings, (size_t)fixed * sizeof(char *));
	memcpy(full + fixed, argv, (size_t)argc * sizeof(char *));
	*count = fixed + argc;
	return full;
}
#endif

/* Append `message` to the runtime's --log file as runc writes an error there (text, or JSON
 * with --log-format json), as the shim's report_failure does */
static void log_failure(int count, char **args, const char *message)
{
	const char *file = NULL, *format = "text";
	for (int i = 0; i < count; i++) {
		const char *names[] = {"--log", "-log", "--log-format", "-log-format"};
		for (int k = 0; k < 4; k++) {
			size_t length = strlen(names[k]);
			const char *value = NULL;
			if (strcmp(args[i], names[k]) == 0 && i + 1 < count)
				value = args[i + 1];
			else if (strncmp(args[i], names[k], length) == 0 && args[i][length] == '=')
				value = args[i] + length + 1;
			if (value != NULL && k < 2 && file == NULL)
				file = value;
			else if (value != NULL && k >= 2)
				format = value;
		}
	}
	if (file == NULL || *file == '\0')
		return;
	FILE *log = fopen(file, "a");
	if (log == NULL)
		return;
	char stamp[32];
	time_t now = time(NULL);
	strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
	if (strcmp(format, "json") == 0) {
		fputs("{\"level\": \"error\", \"msg\": \"gpuwire: ", log);
		for (const unsigned char *c = (const unsigned char *)message; *c; c++)
			if (*c == '"' || *c == '\\')
				fprintf(log, "\\%c", *c);
			else if (*c < 0x20)
				fprintf(log, "\\u%04x", *c);
			else
				fputc(*c, log);
		fprintf(log, "\", \"time\": \"%s\"}\n", stamp);
	} else {
		fprintf(log, "time=\"%s\" level=error msg=\"gpuwire: %s\"\n", stamp, message);
	}
	fclose(log);
}

int main(int argc, char **argv)
{
#ifdef HOOK_CODE
	const char *base = strrchr(argv[0], '/');
	if (strcmp(base ? base + 1 : argv[0], "gpuwire-hook") == 0) {
		if (argc > 1 && strcmp(argv[1], "ldcache") == 0 && ldcache_here(argc, argv) == 0)
			return 0;
		argv = as_launcher(argc, argv, &argc);
		if (argv == NULL) {
			fputs("gpuwire-hook: out of memory\n", stderr);
			return 1;
		}
	}
#endif
	char *end = NULL;
	long n = argc > 5 ? strtol(argv[4], &end, 10) : 0;
	if (argc < 6 || *end != '\0' || n < 1 || n > argc - 5) {
		fputs("usage: gpuwire-call SOCKET TOKEN KIND N [FALLBACK...] ARGV0 ARG...\n", stderr);
		return 2;
	}
	int first = argc - (int)n;
	int waits = first == 5; /* no FALLBACK: wait for a resident that serves the call */
	long deadline = now_ms() + WAIT_MS;
	for (;;) {
		long left = deadline - now_ms();
		long ready_ms = !waits ? READY_MS : left > 0 ? left : 0;
		int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
		if (sock < 0)
			snprintf(why, sizeof(why), "no socket: %s", strerror(errno));
		else if (ask(argv[1], sock, argv, first, argc, ready_ms) == 0) {
			static char answer[ANSWER_MAX + 1];
			ssize_t got;
			do
				got = recv(sock, answer, ANSWER_MAX, 0);
			while (got < 0 && errno == EINTR);
			if (got <= 0) {
				fprintf(stderr, "gpuwire-%s: the resident gpuwire on %s gave no answer\n",
					argv[3], argv[1]);
				return 1;
			}
			answer[got] = '\0';
			if (answer[0] == 'x')
				return atoi(answer + 1);
			if (answer[0] == 'e') {
				argv[first] = answer + 1;
				execv(answer + 1, argv + first);
				fprintf(stderr, "gpuwire-runtime: cannot exec %s: %s\n", answer + 1,
					strerror(errno));
				return 127;
			}
			snprintf(why, sizeof(why), "the resident there declines: %s", answer + 1);
		}
		if (sock >= 0)
			close(sock);
		if (!waits)
			break;
		left = deadline - now_ms();
		if (left <= 0) {
			static char message[1024];
			snprintf(message, sizeof(message),
				 "no resident gpuwire served this call within %g s (%s: %s): it fails, "
				 "as nothing else here checks what the container asks for (is the "
				 "gpuwire-node pod running on this node?)",
				 WAIT_MS / 1000.0, argv[1], why);
			fprintf(stderr, "gpuwire-%s: %s\n", argv[3], message);
			if (strcmp(argv[3], "runtime") == 0)
				log_failure(argc - first - 1, argv + first + 1, message);
			return 1;
		}
		struct timespec pause = {.tv_nsec = (left < RETRY_MS ? left : RETRY_MS) * 1000000L};
		nanosleep(&pause, NULL);
	}
	/* nobody answered, or the answer was "f": FALLBACK, as if we were not here */
	execv(argv[5], argv + 5);
	fprintf(stderr, "gpuwire-%s: cannot exec %s: %s\n", argv[3], argv[5], strerror(errno));
	return 127;
}

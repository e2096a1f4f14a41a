/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * A plain TCP program, with nothing of RDMA in it: run under
 * LD_PRELOAD=librspreload.so, rsockets carries its stream over the RDMA
 * device instead.
 *
 *   xiw_tcp_echo server PORT              echoes one connection back, then exits
 *   xiw_tcp_echo client HOST PORT BYTES   sends BYTES bytes of a pattern in
 *                                         64 KiB pieces, checks each echoed
 *                                         piece, holds the connection 2 s
 *
 * exit: 0 when every byte came back as sent; 1 otherwise.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define PIECE 65536

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "xiw_tcp_echo: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

static void write_all(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			fail("write: %s", strerror(errno));
		p += w;
		n -= (size_t)w;
	}
}

static void read_all(int fd, uint8_t *p, size_t n)
{
	while (n) {
		ssize_t r = read(fd, p, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			fail("read: %s", r ? strerror(errno) : "end of stream");
		p += r;
		n -= (size_t)r;
	}
}

static int server(int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	static uint8_t buf[PIECE];
	unsigned long long total = 0;
	int one = 1, l, c;
	ssize_t r;

	l = socket(AF_INET, SOCK_STREAM, 0);
	if (l < 0)
		fail("socket: %s", strerror(errno));
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l, (struct sockaddr *)&sa, sizeof(sa)) || listen(l, 1))
		fail("bind/listen: %s", strerror(errno));
	c = accept(l, NULL, NULL);
	if (c < 0)
		fail("accept: %s", strerror(errno));
	while ((r = read(c, buf, sizeof(buf))) != 0) {
		if (r < 0) {
			if (errno == EINTR)
				continue;
			fail("read: %s", strerror(errno));
		}
		write_all(c, buf, (size_t)r);
		total += (unsigned long long)r;
	}
	printf("server: echoed %llu bytes\n", total);
	close(c);
	close(l);
	return 0;
}

static int client(const char *host, int port, unsigned long long bytes)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	static uint8_t out[PIECE], in[PIECE];
	unsigned long long done = 0;
	int fd;

	if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
		fail("bad address %s", host);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
		fail("connect: %s", strerror(errno));
	while (done < bytes) {
		size_t n = bytes - done < PIECE ? (size_t)(bytes - done) : PIECE;
		size_t i;

		for (i = 0; i < n; i++)
			out[i] = (uint8_t)((done + i) * 131 + (done + i) / 4093);
		write_all(fd, out, n);
		read_all(fd, in, n);
		if (memcmp(in, out, n))
			fail("the bytes echoed at %llu differ from those sent", done);
		done += n;
	}
	printf("client: %llu bytes echoed and checked\n", done);
	fflush(stdout);
	/* Held open, so that the connection can be looked at meanwhile. */
	sleep(2);
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "server"))
		return server(atoi(argv[2]));
	if (argc == 5 && !strcmp(argv[1], "client"))
		return client(argv[2], atoi(argv[3]), strtoull(argv[4], NULL, 0));
	fail("usage: xiw_tcp_echo server PORT | client HOST PORT BYTES");
}

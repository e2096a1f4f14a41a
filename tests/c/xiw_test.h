/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * What xiw's C test programs share: failing with a message, and opening the
 * device under test (the first one libibverbs lists, or $XIW_DEVICE).
 */
#ifndef XIW_TEST_H
#define XIW_TEST_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

/* Prints "PROGRAM: message" on stderr and exits 1. */
static inline void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static inline void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "%s: ", program_invocation_short_name);
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

static inline struct ibv_context *open_dev(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	const char *want = getenv("XIW_DEVICE");
	struct ibv_context *ctx = NULL;

	if (!list || n == 0)
		die("no RDMA device");
	for (int i = 0; i < n && !ctx; i++)
		if (!want || !strcmp(ibv_get_device_name(list[i]), want))
			ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!ctx)
		die("cannot open the device");
	return ctx;
}

#endif

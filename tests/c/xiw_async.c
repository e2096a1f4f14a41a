// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * Port events through ibv_get_async_event (kernel mode): runs DOWN, a shell
 * command that takes the device's netdev down, expects IBV_EVENT_PORT_ERR on
 * port 1, then runs UP and expects IBV_EVENT_PORT_ACTIVE.
 *
 * usage: xiw_async DOWN UP
 */
#define _GNU_SOURCE
#include <poll.h>

#include "xiw_test.h"

static void expect_port_event(struct ibv_context *ctx, enum ibv_event_type want,
			      const char *what)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	struct ibv_async_event ev;

	for (;;) {
		if (poll(&p, 1, 5000) != 1)
			die("%s: no async event within 5 s", what);
		if (ibv_get_async_event(ctx, &ev))
			die("ibv_get_async_event: %s", strerror(errno));
		ibv_ack_async_event(&ev);
		/* A netdev change may come first; the port event must follow. */
		if (ev.event_type == IBV_EVENT_GID_CHANGE)
			continue;
		if (ev.event_type != want || ev.element.port_num != 1)
			die("%s: event %s on port %d", what, ibv_event_type_str(ev.event_type),
			    ev.element.port_num);
		return;
	}
}

int main(int argc, char **argv)
{
	struct ibv_context *ctx;

	if (argc != 3)
		die("usage: xiw_async DOWN UP");
	ctx = open_dev();
	if (system(argv[1]))
		die("%s failed", argv[1]);
	expect_port_event(ctx, IBV_EVENT_PORT_ERR, "netdev down");
	if (system(argv[2]))
		die("%s failed", argv[2]);
	expect_port_event(ctx, IBV_EVENT_PORT_ACTIVE, "netdev up");
	if (ibv_close_device(ctx))
		die("ibv_close_device: %s", strerror(errno));
	printf("async ok: port down and up reported\n");
	return 0;
}

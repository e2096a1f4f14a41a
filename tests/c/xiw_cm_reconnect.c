/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * One local port for several rdma_cm connections in a row: for each PORT,
 * binds LOCAL:LPORT, connects to SERVER:PORT, disconnects and destroys the
 * connection, then goes on to the next at once, while the last one's TCP
 * connection may still be in TIME_WAIT on LPORT. rdma_cm keeps its own
 * port space and frees LPORT as soon as the ID is destroyed, so a device
 * whose socket cannot bind a port a closed connection still holds fails an
 * application's rdma_connect now and then with EADDRINUSE, wherever its
 * randomly chosen port meets an old one. Prints one line per connection.
 *
 * usage: xiw_cm_reconnect LOCAL LPORT SERVER PORT...
 * exit: 0 if every connection was established, 1 otherwise.
 */
#define _GNU_SOURCE
#include <rdma/rdma_cma.h>

#include "xiw_test.h"

int main(int argc, char **argv)
{
	struct rdma_conn_param param = { .initiator_depth = 1, .responder_resources = 1 };
	struct ibv_qp_init_attr attr = {
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct sockaddr_in local, server;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	int i;

	if (argc < 5)
		die("usage: xiw_cm_reconnect LOCAL LPORT SERVER PORT...");
	local = ipv4_addr(argv[1], atoi(argv[2]));
	for (i = 4; i < argc; i++) {
		server = ipv4_addr(argv[3], atoi(argv[i]));
		/* No event channel: each call below returns once it is done. */
		if (rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP))
			die("rdma_create_id: %s", strerror(errno));
		if (rdma_bind_addr(id, (struct sockaddr *)&local))
			die("rdma_bind_addr %s:%s: %s", argv[1], argv[2], strerror(errno));
		if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&server, 2000) ||
		    rdma_resolve_route(id, 2000))
			die("resolving %s:%s: %s", argv[3], argv[i], strerror(errno));
		pd = ibv_alloc_pd(id->verbs);
		cq = ibv_create_cq(id->verbs, 2, NULL, NULL, 0);
		if (!pd || !cq)
			die("PD or CQ: %s", strerror(errno));
		attr.send_cq = cq;
		attr.recv_cq = cq;
		if (rdma_create_qp(id, pd, &attr))
			die("rdma_create_qp: %s", strerror(errno));
		if (rdma_connect(id, &param))
			die("rdma_connect from port %s to %s:%s: %s", argv[2], argv[3], argv[i],
			    strerror(errno));
		printf("connected from %s:%s to %s:%s\n", argv[1], argv[2], argv[3], argv[i]);
		rdma_disconnect(id);
		rdma_destroy_qp(id);
		if (ibv_destroy_cq(cq) || ibv_dealloc_pd(pd) || rdma_destroy_id(id))
			die("tearing down: %s", strerror(errno));
	}
	return 0;
}

/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * A hand-written MPA initiator: connects to HOST:PORT over TCP, sends an MPA
 * Request of revision REV (RFC 5044; with RFC 6581's IRD/ORD block holding
 * IRD and ORD, control bits included, when REV is 2 and ENHANCED is 1) and
 * prints the Reply's header: "rev R flags 0xF pd_len L[ ird 0xI ord 0xO]".
 * It sends nothing after the Request and closes the connection.
 *
 * usage: xiw_mpa_peer HOST PORT REV ENHANCED IRD ORD
 * exit: 0 once a Reply was read, 1 otherwise.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "xiw_test.h"

static void read_all(int fd, uint8_t *p, size_t n)
{
	while (n) {
		ssize_t r = read(fd, p, n);

		if (r <= 0)
			die("the connection ended before the Reply was complete");
		p += r;
		n -= (size_t)r;
	}
}

int main(int argc, char **argv)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	uint8_t req[24], rep[20 + 512];
	int fd, rev, enhanced, len;
	unsigned int pd;

	if (argc != 7)
		die("usage: xiw_mpa_peer HOST PORT REV ENHANCED IRD ORD");
	rev = atoi(argv[3]);
	enhanced = rev == 2 && atoi(argv[4]);
	sa.sin_port = htons((uint16_t)atoi(argv[2]));
	if (inet_pton(AF_INET, argv[1], &sa.sin_addr) != 1)
		die("bad address %s", argv[1]);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
		die("connect: %s", strerror(errno));

	memcpy(req, "MPA ID Req Frame", 16);
	req[16] = enhanced ? 0x10 : 0;
	req[17] = (uint8_t)rev;
	req[18] = 0;
	req[19] = enhanced ? 4 : 0;
	if (enhanced) {
		uint16_t ird = htons((uint16_t)strtoul(argv[5], NULL, 0));
		uint16_t ord = htons((uint16_t)strtoul(argv[6], NULL, 0));

		memcpy(&req[20], &ird, 2);
		memcpy(&req[22], &ord, 2);
	}
	len = enhanced ? 24 : 20;
	if (write(fd, req, len) != len)
		die("sending the Request: %s", strerror(errno));

	read_all(fd, rep, 20);
	if (memcmp(rep, "MPA ID Rep Frame", 16))
		die("not an MPA Reply");
	pd = (unsigned int)rep[18] << 8 | rep[19];
	if (pd > 512)
		die("Reply private data of %u bytes", pd);
	read_all(fd, rep + 20, pd);
	printf("rev %u flags 0x%02x pd_len %u", rep[17], rep[16], pd);
	if ((rep[16] & 0x10) && pd >= 4)
		printf(" ird 0x%04x ord 0x%04x", rep[20] << 8 | rep[21], rep[22] << 8 | rep[23]);
	printf("\n");
	close(fd);
	return 0;
}

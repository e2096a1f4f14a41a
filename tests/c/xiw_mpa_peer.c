/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * A hand-written MPA initiator: connects to HOST:PORT over TCP, sends an MPA
 * Request of revision REV (RFC 5044; with RFC 6581's IRD/ORD block holding
 * IRD and ORD, control bits included, when REV is 2 and ENHANCED is 1) and
 * prints the Reply's header: "rev R flags 0xF pd_len L[ ird 0xI ord 0xO]".
 * It sends nothing after the Request and closes the connection.
 *
 * With a seventh argument "read-rtr" (revision 2, enhanced, no CRC asked
 * and none agreed), it goes on as an RFC 6581 initiator whose
 * ready-to-receive message is a zero-length RDMA Read: it sends that Read
 * Request (sink STag 0x5a5a01, source STag 0) and prints the answer's
 * header: "response opcode O stag 0xS last L".
 *
 * With "send-rtr" instead, the ready-to-receive message it offers and sends
 * is a zero-length Send (queue 0, MSN 1), which must be taken by the
 * responder's stream, not by a receive of its application; it then sends
 * the same zero-length Read, whose answer shows the responder went on.
 *
 * usage: xiw_mpa_peer HOST PORT REV ENHANCED IRD ORD [read-rtr|send-rtr]
 * exit: 0 once a Reply (and, with an RTR, a response) was read, 1 otherwise.
 */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "xiw_test.h"

/*
 * The RTR as a zero-length RDMA Read Request (no markers): MPA length, then
 * DDP untagged (queue 1, MSN 1, MO 0), then RDMAP's Read Request header
 * (RFC 5040 section 4.4), then the CRC field, present though CRC is not in
 * use (RFC 5044 section 4.1: any value, not checked).
 */
/*
 * The RTR as a zero-length Send: MPA length, DDP untagged (queue 0, MSN 1,
 * MO 0), no payload, the CRC field.
 */
static void send_rtr(int fd)
{
	uint8_t f[24] = { 0 };

	f[1] = 18;		/* ULPDU: the DDP/RDMAP header alone */
	f[2] = 0x41;		/* untagged, last, DDP version 1 */
	f[3] = 0x43;		/* RDMAP version 1, Send */
	put_be32(&f[8], 0);	/* queue 0 */
	put_be32(&f[12], 1);	/* MSN 1 */
	put_be32(&f[16], 0);	/* MO 0 */
	if (write(fd, f, sizeof(f)) != (ssize_t)sizeof(f))
		die("sending the zero-length Send: %s", strerror(errno));
}

static void read_rtr_exchange(int fd)
{
	uint8_t f[52] = { 0 }, r[20];
	uint32_t stag;

	f[0] = 0;
	f[1] = 46;		/* ULPDU: 18 bytes of headers, 28 of Read Request */
	f[2] = 0x41;		/* untagged, last, DDP version 1 */
	f[3] = 0x41;		/* RDMAP version 1, Read Request */
	put_be32(&f[8], 1);	/* queue 1 */
	put_be32(&f[12], 1);	/* MSN 1 */
	put_be32(&f[16], 0);	/* MO 0 */
	put_be32(&f[20], 0x5a5a01);	/* sink STag; sink TO 0 */
	put_be32(&f[32], 0);	/* RDMA Read size 0 */
	put_be32(&f[36], 0);	/* source STag 0; source TO 0 */
	if (write(fd, f, sizeof(f)) != (ssize_t)sizeof(f))
		die("sending the Read Request: %s", strerror(errno));
	/* MPA length, DDP tagged header (STag, TO), no payload or pad, CRC field. */
	read_exact(fd, r, sizeof(r), "the response");
	memcpy(&stag, &r[4], 4);
	printf("response opcode %u stag 0x%x last %u len %u\n", r[3] & 0x0f,
	       ntohl(stag), (r[2] & 0x40) != 0, r[0] << 8 | r[1]);
}

int main(int argc, char **argv)
{
	struct sockaddr_in sa;
	uint8_t req[24], rep[20 + 512];
	int fd, rev, enhanced, len, read_rtr, send_rtr_;
	unsigned int pd;

	/* What was read is shown even if the peer is killed waiting for more. */
	setvbuf(stdout, NULL, _IONBF, 0);
	if (argc != 7 && !(argc == 8 && (!strcmp(argv[7], "read-rtr") ||
					 !strcmp(argv[7], "send-rtr"))))
		die("usage: xiw_mpa_peer HOST PORT REV ENHANCED IRD ORD [read-rtr|send-rtr]");
	rev = atoi(argv[3]);
	enhanced = rev == 2 && atoi(argv[4]);
	read_rtr = argc == 8 && !strcmp(argv[7], "read-rtr");
	send_rtr_ = argc == 8 && !strcmp(argv[7], "send-rtr");
	if ((read_rtr || send_rtr_) && !enhanced)
		die("an RTR needs revision 2, enhanced");
	sa = ipv4_addr(argv[1], atoi(argv[2]));
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)))
		die("connect: %s", strerror(errno));

	memcpy(req, "MPA ID Req Frame", 16);
	req[16] = enhanced ? 0x10 : 0;
	req[17] = (uint8_t)rev;
	req[18] = 0;
	req[19] = enhanced ? 4 : 0;
	if (enhanced) {
		uint16_t ird = (uint16_t)strtoul(argv[5], NULL, 0);
		uint16_t ord = (uint16_t)strtoul(argv[6], NULL, 0);

		if (read_rtr) {
			ird |= 0x8000;	/* peer-to-peer */
			ord |= 0x4000;	/* zero-length Read as the RTR */
		}
		if (send_rtr_)
			ird |= 0x8000 | 0x4000;	/* peer-to-peer, Send as the RTR */
		ird = htons(ird);
		ord = htons(ord);

		memcpy(&req[20], &ird, 2);
		memcpy(&req[22], &ord, 2);
	}
	len = enhanced ? 24 : 20;
	if (write(fd, req, len) != len)
		die("sending the Request: %s", strerror(errno));

	read_exact(fd, rep, 20, "the MPA Reply");
	if (memcmp(rep, "MPA ID Rep Frame", 16))
		die("not an MPA Reply");
	pd = (unsigned int)rep[18] << 8 | rep[19];
	if (pd > 512)
		die("Reply private data of %u bytes", pd);
	read_exact(fd, rep + 20, pd, "the MPA Reply");
	printf("rev %u flags 0x%02x pd_len %u", rep[17], rep[16], pd);
	if ((rep[16] & 0x10) && pd >= 4)
		printf(" ird 0x%04x ord 0x%04x", rep[20] << 8 | rep[21], rep[22] << 8 | rep[23]);
	printf("\n");
	if (send_rtr_)
		send_rtr(fd);
	if (read_rtr || send_rtr_)
		read_rtr_exchange(fd);
	close(fd);
	return 0;
}

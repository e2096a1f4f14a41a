/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * An MPI ping-pong between two ranks, every byte checked: for each size
 * from 1 byte to 1 MiB, rank 0 sends a message whose bytes depend on the
 * size and the iteration, rank 1 checks it and sends back its complement,
 * which rank 0 checks. Prints one line per size (half round trip, µs).
 *
 * usage: mpirun -np 2 xiw_mpi_pingpong [ITERATIONS]
 * exit: 0 if every message arrived intact, 1 otherwise.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char pattern(size_t i, int size, int iter)
{
	return (unsigned char)(i * 131 + (size_t)size * 7 + (size_t)iter * 13 + 1);
}

int main(int argc, char **argv)
{
	const int max = 1 << 20;
	int rank, nprocs, bad = 0, all_bad = 0;
	int iters = argc > 1 ? atoi(argv[1]) : 100;
	unsigned char *buf;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
	if (nprocs != 2) {
		if (rank == 0)
			fprintf(stderr, "xiw_mpi_pingpong: needs 2 ranks\n");
		MPI_Finalize();
		return 1;
	}
	buf = malloc(max);
	if (!buf)
		MPI_Abort(MPI_COMM_WORLD, 1);
	for (int size = 1; size <= max; size *= 4) {
		double t0;

		MPI_Barrier(MPI_COMM_WORLD);
		t0 = MPI_Wtime();
		for (int it = 0; it < iters && !bad; it++) {
			if (rank == 0) {
				for (int i = 0; i < size; i++)
					buf[i] = pattern(i, size, it);
				MPI_Send(buf, size, MPI_BYTE, 1, it, MPI_COMM_WORLD);
				memset(buf, 0, size);
				MPI_Recv(buf, size, MPI_BYTE, 1, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				for (int i = 0; i < size; i++)
					if (buf[i] != (unsigned char)~pattern(i, size, it))
						bad = 1;
			} else {
				MPI_Recv(buf, size, MPI_BYTE, 0, it, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
				for (int i = 0; i < size; i++) {
					if (buf[i] != pattern(i, size, it))
						bad = 1;
					buf[i] = ~buf[i];
				}
				MPI_Send(buf, size, MPI_BYTE, 0, it, MPI_COMM_WORLD);
			}
		}
		MPI_Allreduce(&bad, &all_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
		if (all_bad) {
			if (rank == 0)
				printf("%8d bytes: data corrupted\n", size);
			break;
		}
		if (rank == 0)
			printf("%8d bytes: %10.2f us, %d iterations checked\n", size,
			       (MPI_Wtime() - t0) * 1e6 / (2.0 * iters), iters);
	}
	free(buf);
	MPI_Finalize();
	return all_bad ? 1 : 0;
}

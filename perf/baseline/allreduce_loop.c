/* What MPI_Allreduce costs without Python: the C reference row of perf/baseline.
 *
 * The sweep's conventions (bmlmpi/bench.py): MPI_FLOAT sums, sizes in bytes, powers of two
 * from MIN to MAX; ITERS timed iterations and SKIP warm-up ones up to 8 KiB, ITERS_LARGE and
 * SKIP_LARGE above; one timed call per iteration followed by a barrier; the timed iterations
 * cut into BLOCKS blocks.  Output is OSU's table (size, average over ranks of each rank's
 * mean latency, min, max over ranks, iterations) with one more column: the median of the
 * per-block means (averaged over ranks), the number the same-run table uses.
 *
 * usage: allreduce_loop MIN MAX ITERS SKIP ITERS_LARGE SKIP_LARGE BLOCKS
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define LARGE_MESSAGE 8192
#define MAX_BLOCKS 64

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, by_value);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 8) {
        if (rank == 0)
            fprintf(stderr, "usage: %s MIN MAX ITERS SKIP ITERS_LARGE SKIP_LARGE BLOCKS\n",
                    argv[0]);
        MPI_Finalize();
        return 2;
    }
    long lo = atol(argv[1]), hi = atol(argv[2]);
    int iters_small = atoi(argv[3]), skip_small = atoi(argv[4]);
    int iters_large = atoi(argv[5]), skip_large = atoi(argv[6]), blocks = atoi(argv[7]);
    if (lo < 1 || hi < lo || iters_small < 1 || iters_large < 1 || blocks < 1 ||
        blocks > MAX_BLOCKS) {
        if (rank == 0) fprintf(stderr, "bad arguments\n");
        MPI_Finalize();
        return 2;
    }
    size_t max_count = (size_t)(hi / 4 > 0 ? hi / 4 : 1);
    float *send = malloc(max_count * sizeof *send), *recv = malloc(max_count * sizeof *recv);
    if (!send || !recv) MPI_Abort(MPI_COMM_WORLD, 1);
    for (size_t i = 0; i < max_count; i++) send[i] = (float)((i % 64) + rank);

    int failed = 0;
    if (rank == 0) {
        char version[MPI_MAX_LIBRARY_VERSION_STRING];
        int len;
        MPI_Get_library_version(version, &len);
        for (int i = 0; i < len; i++)
            if (version[i] == '\n') { version[i] = '\0'; break; }
        printf("# OSU MPI Allreduce Latency Test (C MPI_Allreduce loop, perf/baseline)\n");
        printf("# Ranks: %d; MPI: %s\n# Datatype: MPI_FLOAT.\n", size, version);
        printf("%-10s%18s%18s%18s%12s%18s\n", "# Size", "Avg Latency(us)", "Min Latency(us)",
               "Max Latency(us)", "Iterations", "Median block(us)");
    }
    for (long bytes = 1; bytes <= hi; bytes *= 2) {
        if (bytes < lo) continue;
        int count = (int)(bytes / 4 > 0 ? bytes / 4 : 1);
        int large = bytes > LARGE_MESSAGE;
        int iters = large ? iters_large : iters_small, skip = large ? skip_large : skip_small;
        int nblocks = blocks < iters ? blocks : iters;
        double block_sum[MAX_BLOCKS] = {0};
        for (int i = 0; i < skip; i++) {
            MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            MPI_Barrier(MPI_COMM_WORLD);
        }
        double total = 0.0;
        for (int i = 0; i < iters; i++) {
            double t0 = MPI_Wtime();
            MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double dt = MPI_Wtime() - t0;
            total += dt;
            block_sum[(long)i * nblocks / iters] += dt;
            MPI_Barrier(MPI_COMM_WORLD);
        }
        /* the same check as the sweep's: sum over ranks of (i % 64) + rank */
        for (int i = 0; i < count; i++) {
            float want = (float)((i % 64) * size + size * (size - 1) / 2);
            if (recv[i] != want) { failed = 1; break; }
        }
        double means[MAX_BLOCKS];
        for (int b = 0; b < nblocks; b++) {
            int first = (b * iters + nblocks - 1) / nblocks;
            int next = ((b + 1) * iters + nblocks - 1) / nblocks;
            means[b] = block_sum[b] * 1e6 / (next - first);
        }
        double mine[2] = {total * 1e6 / iters, median(means, nblocks)};
        double mn[2], mx[2], sm[2];
        MPI_Reduce(mine, mn, 2, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
        MPI_Reduce(mine, mx, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        MPI_Reduce(mine, sm, 2, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0)
            printf("%-10ld%18.2f%18.2f%18.2f%12d%18.2f\n", bytes, sm[0] / size, mn[0], mx[0],
                   iters, sm[1] / size);
    }
    int any_failed = 0;
    MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0 && any_failed) fprintf(stderr, "allreduce_loop: wrong result\n");
    free(send);
    free(recv);
    MPI_Finalize();
    return any_failed ? 1 : 0;
}

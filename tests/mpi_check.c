/* tests/mpi_check.c: the communication layer under a real launcher, run by
 * tests/cli/mpi.sh as mpirun -np N build/tests/mpi_check MODE [DIR].
 *
 *   collectives   every collective and point-to-point call on crafted
 *                 inputs whose results are exact (small integers, halves);
 *                 rank 0 prints one TAP line per check, failed if any rank
 *                 failed it
 *   grid T P      the tensor x pipeline grid: sub-communicators, neighbours,
 *                 a stage-boundary send of 1/T of a row plus the all-gather
 *   partition DIR each rank opens only its own file of a partitioned
 *                 checkpoint; a partition for another number of ranks ends
 *                 the job with a message
 *   die | exit | kill
 *                 rank 1 fails (llm_comm_die, exit(3), SIGKILL) while the
 *                 others wait in an all-reduce: the job must end, naming it
 * Without a launcher it runs as a one-rank world (the single-process
 * implementation) and the same checks hold. */
#define _GNU_SOURCE
#include "llm.h"
#include "comm.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct llm_comm *W;

/* One check: every rank contributes OK; rank 0 prints the verdict. */
static int verdict(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int verdict(int ok, const char *fmt, ...)
{
	float bad = ok ? 0.0f : 1.0f;
	if (llm_comm_allreduce_sum_f32(W, &bad, 1))
		llm_comm_die("%s", llm_errmsg());
	if (!ok)
		fprintf(stderr, "rank %d failed a check\n", W->rank);
	if (W->rank == 0) {
		char msg[512];
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(msg, sizeof msg, fmt, ap);
		va_end(ap);
		printf("%s - %s (%d ranks%s)\n", bad == 0 ? "ok" : "not ok", msg, W->size,
		       bad == 0 ? "" : ", failed on some");
		fflush(stdout);
	}
	return bad == 0;
}

#define TRY(x) do { if ((x) != LLM_OK) llm_comm_die("%s: %s", #x, llm_errmsg()); } while (0)

static void collectives(void)
{
	int r = W->rank, n = W->size;
	verdict(n >= 1 && r >= 0 && r < n && W->world_rank == r, "world: rank %d of %d (%s)", r, n, W->ops->name);

	/* all-reduce: halves and small integers sum exactly in f32 */
	size_t big = (size_t)1 << 20;
	float *x = malloc(big * sizeof *x);
	for (size_t i = 0; i < big; i++)
		x[i] = (float)r + 0.5f * (float)(i % 1024);
	TRY(llm_comm_allreduce_sum_f32(W, x, big));
	int ok = 1;
	for (size_t i = 0; i < big && ok; i++)
		ok = x[i] == (float)(n * (n - 1) / 2) + 0.5f * (float)n * (float)(i % 1024);
	verdict(ok, "allreduce_sum_f32 of 2^20 floats is exact");
	free(x);

	/* argmax: distinct maxima, and a tie that the lowest index must win */
	float v[3] = { (float)r, 7.0f, -(float)r };
	int32_t id[3] = { 100 + r, 200 + r, 300 + r };
	TRY(llm_comm_argmax_f32(W, v, id, 3));
	verdict(v[0] == n - 1 && id[0] == 100 + n - 1 && v[1] == 7 && id[1] == 200 && v[2] == 0 && id[2] == 300,
	        "argmax_f32: largest value, lowest index on a tie");

	/* all-gather and all-gather-v (counts r + 1), in rank order */
	unsigned char mine[5], *all = malloc((size_t)n * 5);
	memset(mine, 'a' + r, sizeof mine);
	TRY(llm_comm_allgather(W, mine, 5, all));
	ok = 1;
	for (int q = 0; q < n; q++)
		for (int i = 0; i < 5; i++)
			ok &= all[q * 5 + i] == 'a' + q;
	verdict(ok, "allgather: 5 bytes of every rank in rank order");
	size_t *counts = malloc((size_t)n * sizeof *counts), tot = 0;
	for (int q = 0; q < n; q++)
		tot += counts[q] = (size_t)q + 1;
	unsigned char *gv = malloc(tot);
	TRY(llm_comm_allgatherv(W, mine, gv, counts));
	ok = 1;
	for (int q = 0, at = 0; q < n; at += q + 1, q++)
		for (int i = 0; i <= q; i++)
			ok &= gv[at + i] == 'a' + q;
	verdict(ok, "allgatherv: counts 1..N in rank order");
	free(all), free(gv), free(counts);

	/* broadcast from the last rank */
	int64_t b[4] = { r, r, r, r };
	TRY(llm_comm_bcast(W, b, sizeof b, n - 1));
	verdict(b[0] == n - 1 && b[3] == n - 1, "bcast from rank %d", n - 1);

	/* a ring of point-to-point messages; the byte counters see them */
	if (n > 1) {
		int next = (r + 1) % n, prev = (r + n - 1) % n;
		double out[256], in[256];
		for (int i = 0; i < 256; i++)
			out[i] = r * 1000 + i;
		uint64_t s0 = W->stats.sent, r0 = W->stats.recvd;
		if (r % 2 == 0) {
			TRY(llm_comm_send(W, out, sizeof out, next, 7));
			TRY(llm_comm_recv(W, in, sizeof in, prev, 7));
		} else {
			TRY(llm_comm_recv(W, in, sizeof in, prev, 7));
			TRY(llm_comm_send(W, out, sizeof out, next, 7));
		}
		ok = 1;
		for (int i = 0; i < 256; i++)
			ok &= in[i] == prev * 1000 + i;
		verdict(ok, "send/recv around a ring of %d ranks", n);
		verdict(W->stats.sent - s0 == sizeof out && W->stats.recvd - r0 == sizeof in,
		        "byte counters: %zu bytes sent and received per rank", sizeof out);
		/* a receive of the wrong size is an error naming the rank */
		if (r == 0)
			TRY(llm_comm_send(W, out, 16, 1, 9));
		enum llm_status s = LLM_OK;
		if (r == 1)
			s = llm_comm_recv(W, in, 8, 0, 9);
		verdict(r != 1 || (s == LLM_ERR_COMM && strstr(llm_errmsg(), "rank 1 of")),
		        "a message longer than the receive is an error naming the rank");
	}
	enum llm_status s = llm_comm_send(W, "x", 1, r, 0);
	verdict(s == LLM_ERR_INTERNAL && strstr(llm_errmsg(), "send to rank"), "a send to itself is refused");
	struct llm_grid g;
	s = llm_grid_init(&g, W, n + 1, 1);
	verdict(s == LLM_ERR_USAGE && strstr(llm_errmsg(), "launched"), "a grid for %d ranks is refused on %d", n + 1, n);
	TRY(llm_comm_barrier(W));
}

/* The grid, and the stage boundary of partition.h: rank t of stage p sends
 * its 1/T column block of x to rank t of stage p+1, which all-gathers. */
static void grid(int tp, int pp)
{
	struct llm_grid g;
	TRY(llm_grid_init(&g, W, tp, pp));
	int r = W->rank;
	verdict(g.stage == r / tp && g.tp_rank == r % tp && g.tp->size == tp && g.pp->size == pp &&
	        g.tp->rank == g.tp_rank && g.pp->rank == g.stage &&
	        g.prev == (g.stage ? g.stage - 1 : -1) && g.next == (g.stage + 1 < pp ? g.stage + 1 : -1),
	        "grid tp %d x pp %d: stage, tp rank and neighbours", tp, pp);
	/* all-reduce inside a stage sums only its T ranks */
	float v = (float)r;
	TRY(llm_comm_allreduce_sum_f32(g.tp, &v, 1));
	float want = 0;
	for (int t = 0; t < tp; t++)
		want += (float)(g.stage * tp + t);
	verdict(v == want, "all-reduce over the TP group of each stage");
	/* stage boundary: x (n_tok, d) built on stage 0, sent as T column blocks */
	enum { NT = 3, D = 12 };
	float x[NT * D], part[NT * D], got[NT * D];
	for (int i = 0; i < NT * D; i++)
		x[i] = (float)i;
	int w = D / tp;
	uint64_t sent0 = g.pp->stats.sent;
	for (int p = 0; p + 1 < pp; p++) {
		if (g.stage == p) {
			for (int i = 0; i < NT; i++)
				memcpy(part + i * w, x + i * D + g.tp_rank * w, (size_t)w * sizeof(float));
			TRY(llm_comm_send(g.pp, part, (size_t)(NT * w) * sizeof(float), g.next, 1));
		} else if (g.stage == p + 1) {
			TRY(llm_comm_recv(g.pp, part, (size_t)(NT * w) * sizeof(float), g.prev, 1));
			float *blocks = malloc((size_t)(NT * D) * sizeof(float));
			TRY(llm_comm_allgather(g.tp, part, (size_t)(NT * w) * sizeof(float), blocks));
			for (int t = 0; t < tp; t++)          /* T blocks (NT, w) -> rows of D */
				for (int i = 0; i < NT; i++)
					memcpy(got + i * D + t * w, blocks + t * NT * w + i * w, (size_t)w * sizeof(float));
			free(blocks);
		}
	}
	int ok = pp == 1 || g.stage == 0 || !memcmp(got, x, sizeof x);
	verdict(ok, "stage boundary: 1/T column blocks sent, all-gathered into x");
	/* the model's boundary gather (llm_comm_allgather_slices): flat
	 * slices [t*N/T, (t+1)*N/T) of an N no T divides, in place */
	enum { NS = 37 };
	float y[NS];
	int64_t a, len;
	llm_comm_slice(NS, tp, g.tp_rank, &a, &len);
	for (int i = 0; i < NS; i++)
		y[i] = i >= a && i < a + len ? (float)(3 * i + 1) : -1.0f;
	TRY(llm_comm_allgather_slices(g.tp, y, NS));
	int same = 1;
	for (int i = 0; i < NS; i++)
		same &= y[i] == (float)(3 * i + 1);
	verdict(same, "the boundary's flat 1/T slices of %d floats all-gathered in place over the TP group", NS);
	uint64_t per = g.pp->stats.sent - sent0;
	verdict(pp == 1 || g.stage == pp - 1 || per == (uint64_t)(NT * D / tp) * sizeof(float),
	        "each TP rank sends %zu of %zu bytes across the boundary (1/T)",
	        (size_t)(NT * D / tp) * sizeof(float), (size_t)(NT * D) * sizeof(float));
	llm_grid_free(&g);
}

static void partition(const char *dir)
{
	struct llm_partition *p;
	TRY(llm_partition_load(&p, dir));
	if (llm_partition_check_world(p, W->size, dir))
		llm_comm_die("%s", llm_errmsg());
	struct llm_ckpt ck;
	TRY(llm_ckpt_open_rank(&ck, dir, W->rank));
	const struct llm_partition *q = ck.part;
	uint64_t bytes = 0;
	for (size_t i = 0; i < ck.n_tensor; i++)
		bytes += ck.tensors[i]->nbytes;
	verdict(q && q->rank == W->rank && q->ranks[W->rank].stage == W->rank / p->tp &&
	        bytes == p->ranks[W->rank].bytes && llm_ckpt_aux(&ck, "config.json"),
	        "each rank opens only its own file (rank, stage, bytes as %s says)", LLM_PART_FILE);
	llm_ckpt_close(&ck);
	llm_partition_free(p);
}

static void fail(const char *how)
{
	TRY(llm_comm_barrier(W));
	if (W->rank == 1) {
		if (!strcmp(how, "die"))
			llm_comm_die("deliberate failure");
		if (!strcmp(how, "exit"))
			exit(3);
		raise(SIGKILL);
	}
	float x = 1;
	llm_comm_allreduce_sum_f32(W, &x, 1);     /* waits for rank 1 forever, unless the job ends */
	printf("not ok - rank %d got past a collective that rank 1 never joined\n", W->rank);
}

int main(int argc, char **argv)
{
	llm_set_progname(argv[0]);
	if (llm_comm_init(&W, &argc, &argv))
		llm_die("%s", llm_errmsg());
	const char *mode = argc > 1 ? argv[1] : "collectives";
	int64_t tp, pp;
	if (!strcmp(mode, "collectives"))
		collectives();
	else if (!strcmp(mode, "grid") && argc == 4 && !llm_parse_int(argv[2], 1, 64, &tp) &&
	         !llm_parse_int(argv[3], 1, 64, &pp))
		grid((int)tp, (int)pp);
	else if (!strcmp(mode, "partition") && argc == 3)
		partition(argv[2]);
	else if (!strcmp(mode, "die") || !strcmp(mode, "exit") || !strcmp(mode, "kill"))
		fail(mode);
	else
		llm_comm_die("usage: mpi_check collectives | grid T P | partition DIR | die | exit | kill");
	if (llm_comm_finalize(W))
		llm_die("%s", llm_errmsg());
	return 0;
}

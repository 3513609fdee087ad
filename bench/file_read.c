/*
 * file_read - random 4 KiB reads of a file in the page cache, many in
 * flight: weft (weft_fs_read, on the ring of the caller's shard), weft
 * through its blocking pool (WEFT_URING_FILES=pool: what epoll gets),
 * libuv (uv_fs_read on its thread pool, bench/peers/uv_file_read) and a
 * floor: pread(2) on as many threads as CPUs, no runtime.
 *
 *   file_read [--seconds S] [--rounds R] [--inflight N] [--mib M]
 *
 * A file of M MiB (default 64) is written and read once, so it sits in
 * the page cache. Each reader keeps N reads (default 64) in flight, each
 * completion issuing the next at a pseudo-random 4 KiB-aligned offset,
 * for S seconds (default 2), R times in turn (default 5). Each runs as
 * its own process (this program again, or the peer), and reports its
 * reads and its CPU time (getrusage) over the span. Figures: medians of
 * reads per second and CPU microseconds per read. Last line: one JSON
 * object.
 *
 * With --hang N (the report's resolve_isolation) it measures instead
 * whether N name lookups that never end, started first, slow other work:
 * weft's and libuv's pool readers, and a TCP echo inside one weft process
 * (16 connections to its own listener on 127.0.0.1, each sending 64 bytes
 * and waiting for them back, round trip after round trip), each unloaded
 * and loaded in turn.
 */
#include <weft.h>
#include <weft/net.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "benchutil.h"

#define MAX_INFLIGHT 1024
#define MAX_ROUNDS 32

static uint64_t g_size, g_end_ns;
static int g_fd;
static _Atomic uint64_t g_reads;
static _Atomic int g_live;
static _Atomic uint64_t g_done_ns; /* when the last read ended */

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static double cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
         (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

static uint64_t next_off(uint64_t *seed) {
  *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
  return ((*seed >> 33) % (g_size / 4096)) * 4096;
}

/* ---- the weft reader (a child process) ----------------------------------- */

typedef struct rd {
  weft_rt *rt;
  weft_strand *s;
  uint64_t seed;
  char buf[4096];
} rd;

static weft_rt *g_rt;

static void lookup_done(void *arg, int status, struct addrinfo *res) {
  (void)arg;
  (void)status;
  (void)res;
}

/* N lookups that never end (bench/peers/hang_resolver.c makes the names
 * under .hang.test hang). */
static int hang_lookups(int n) {
  for (int i = 0; i < n; i++) {
    char name[64];
    snprintf(name, sizeof(name), "h%d.hang.test", i);
    if (weft_resolve(g_rt, NULL, name, "80", NULL, lookup_done, NULL, NULL))
      return 1;
  }
  return 0;
}

/* One reader is done; the last one stops the clock and the runtime. */
static void reader_done(void) {
  if (atomic_fetch_sub(&g_live, 1) != 1)
    return;
  atomic_store(&g_done_ns, now_ns());
  weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_DRAIN | WEFT_SHUTDOWN_NOWAIT);
}

static void on_read(void *arg, long result) {
  rd *r = arg;
  if (result == 4096)
    atomic_fetch_add_explicit(&g_reads, 1, memory_order_relaxed);
  if (now_ns() < g_end_ns &&
      weft_fs_read(r->rt, r->s, g_fd, r->buf, sizeof(r->buf),
                   (int64_t)next_off(&r->seed), on_read, r) == 0)
    return;
  reader_done();
}

static void start_reads(void *arg) {
  rd *r = arg;
  if (weft_fs_read(r->rt, r->s, g_fd, r->buf, sizeof(r->buf),
                   (int64_t)next_off(&r->seed), on_read, r) != 0)
    reader_done();
}

static int weft_reader(int inflight, double secs) {
  weft_config cfg;
  weft_config_init(&cfg);
  if (weft_rt_create(&g_rt, &cfg) < 0)
    return 1;
  static rd rds[MAX_INFLIGHT];
  weft_strand *ss[4];
  for (int i = 0; i < 4; i++)
    if (weft_strand_create(g_rt, &ss[i]) < 0)
      return 1;
  const char *hang = getenv("FILE_READ_HANG");
  int nhang = hang ? atoi(hang) : 0;
  if (hang_lookups(nhang))
    return 1;
  double c0 = cpu_s();
  uint64_t t0 = now_ns();
  g_end_ns = t0 + (uint64_t)(secs * 1e9);
  atomic_store(&g_live, inflight);
  /* Started on the strands, so that they go through their shards' rings
   * (a call from this thread, outside the runtime, would use the pool). */
  for (int i = 0; i < inflight; i++) {
    rds[i] = (rd){.rt = g_rt, .s = ss[i % 4], .seed = (uint64_t)i + 1};
    weft_post(ss[i % 4], start_reads, &rds[i]);
  }
  if (nhang) { /* the shutdown would wait for the lookups: never */
    while (atomic_load(&g_live) > 0)
      usleep(1000);
  } else {
    weft_rt_wait(g_rt, UINT64_MAX);
  }
  double el = (double)(atomic_load(&g_done_ns) - t0) / 1e9;
  printf("{\"reads\":%llu,\"seconds\":%.3f,\"cpu_s\":%.3f}\n",
         (unsigned long long)atomic_load(&g_reads), el, cpu_s() - c0);
  if (nhang) {
    fflush(stdout);
    _exit(0);
  }
  for (int i = 0; i < 4; i++)
    weft_strand_release(ss[i]);
  weft_rt_destroy(g_rt);
  return 0;
}

/* ---- TCP echo in one process (a child) ------------------------------------
 */

#define ECHO_CONNS 16
#define ECHO_MSG 64

typedef struct ep {
  char buf[ECHO_MSG];
  size_t got;
} ep;

static void srv_read(void *arg, weft_tcp *c, long n);

static void srv_wrote(void *arg, weft_tcp *c, int status) {
  ep *e = arg;
  if (status < 0 || weft_tcp_read(c, e->buf, sizeof(e->buf), srv_read, e) < 0)
    weft_tcp_close(c, 0);
}

static void srv_read(void *arg, weft_tcp *c, long n) {
  ep *e = arg;
  if (n <= 0 || weft_tcp_write(c, e->buf, (size_t)n, srv_wrote, e) < 0)
    weft_tcp_close(c, 0);
}

static void srv_closed(void *data, weft_tcp *c) {
  (void)c;
  free(data);
}

static void srv_accept(void *arg, weft_tcp *c) {
  (void)arg;
  ep *e = calloc(1, sizeof(*e));
  if (!e || weft_tcp_set_data(c, e, srv_closed) < 0 ||
      weft_tcp_read(c, e->buf, sizeof(e->buf), srv_read, e) < 0)
    weft_tcp_close(c, 0);
}

static void cli_read(void *arg, weft_tcp *c, long n);

static void cli_send(ep *e, weft_tcp *c) {
  e->got = 0;
  if (now_ns() >= g_end_ns ||
      weft_tcp_write(c, e->buf, sizeof(e->buf), NULL, NULL) < 0 ||
      weft_tcp_read(c, e->buf, sizeof(e->buf), cli_read, e) < 0)
    reader_done();
}

static void cli_read(void *arg, weft_tcp *c, long n) {
  ep *e = arg;
  if (n <= 0) {
    reader_done();
    return;
  }
  e->got += (size_t)n;
  if (e->got < sizeof(e->buf)) {
    if (weft_tcp_read(c, e->buf + e->got, sizeof(e->buf) - e->got, cli_read,
                      e) < 0)
      reader_done();
    return;
  }
  atomic_fetch_add_explicit(&g_reads, 1, memory_order_relaxed);
  cli_send(e, c);
}

static void cli_connected(void *arg, weft_tcp *c, int status) {
  if (status < 0)
    reader_done();
  else
    cli_send(arg, c);
}

static int weft_echo(double secs) {
  weft_config cfg;
  weft_config_init(&cfg);
  if (weft_rt_create(&g_rt, &cfg) < 0)
    return 1;
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  weft_listener *l;
  unsigned alen = sizeof(a);
  if (weft_tcp_listen(g_rt, (struct sockaddr *)&a, sizeof(a), NULL, srv_accept,
                      NULL, &l) < 0 ||
      weft_listener_addr(l, (struct sockaddr *)&a, &alen) < 0)
    return 1;
  const char *hang = getenv("FILE_READ_HANG");
  int nhang = hang ? atoi(hang) : 0;
  if (hang_lookups(nhang))
    return 1;
  static ep eps[ECHO_CONNS];
  double c0 = cpu_s();
  uint64_t t0 = now_ns();
  g_end_ns = t0 + (uint64_t)(secs * 1e9);
  atomic_store(&g_live, ECHO_CONNS);
  for (int i = 0; i < ECHO_CONNS; i++) {
    memset(eps[i].buf, 'e', sizeof(eps[i].buf));
    weft_tcp *c;
    if (weft_tcp_connect(g_rt, NULL, (struct sockaddr *)&a, alen, 0,
                         cli_connected, &eps[i], &c) < 0)
      return 1;
  }
  while (atomic_load(&g_live) > 0)
    usleep(1000);
  double el = (double)(atomic_load(&g_done_ns) - t0) / 1e9;
  printf("{\"reads\":%llu,\"seconds\":%.3f,\"cpu_s\":%.3f}\n",
         (unsigned long long)atomic_load(&g_reads), el, cpu_s() - c0);
  fflush(stdout);
  _exit(0); /* the lookups would hold a shutdown for ever */
}

/* ---- the floor: pread on threads ----------------------------------------- */

static void *floor_thread(void *arg) {
  uint64_t seed = (uint64_t)(uintptr_t)arg, n = 0;
  char buf[4096];
  while (now_ns() < g_end_ns)
    for (int k = 0; k < 64; k++)
      n += pread(g_fd, buf, sizeof(buf), (off_t)next_off(&seed)) == 4096;
  atomic_fetch_add(&g_reads, n);
  return NULL;
}

static int floor_reader(double secs) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int n = cpus < 1 ? 1 : cpus > 64 ? 64 : (int)cpus;
  pthread_t t[64];
  double c0 = cpu_s();
  uint64_t t0 = now_ns();
  g_end_ns = t0 + (uint64_t)(secs * 1e9);
  for (int i = 0; i < n; i++)
    pthread_create(&t[i], NULL, floor_thread, (void *)(uintptr_t)(i + 1));
  for (int i = 0; i < n; i++)
    pthread_join(t[i], NULL);
  double el = (double)(now_ns() - t0) / 1e9;
  printf("{\"reads\":%llu,\"seconds\":%.3f,\"cpu_s\":%.3f}\n",
         (unsigned long long)atomic_load(&g_reads), el, cpu_s() - c0);
  return 0;
}

/* ---- the driver ---------------------------------------------------------- */

typedef struct reader {
  const char *name;
  double rps[MAX_ROUNDS], cpu_us[MAX_ROUNDS];
} reader;

/* Runs one reader process (argv) with envs ("K=V", NULL-terminated) set
 * for it; records its rate and CPU per read for round r. zero_ok: a run
 * that read nothing is a result (a reader whose pool hangs). */
static bool run_one(reader *rd_, char *const argv[], const char *const *envs,
                    bool zero_ok, int r) {
  char keys[4][64];
  int n = 0;
  for (; envs && envs[n] && n < 4; n++) {
    const char *eq = strchr(envs[n], '=');
    snprintf(keys[n], sizeof(keys[n]), "%.*s", (int)(eq - envs[n]), envs[n]);
    setenv(keys[n], eq + 1, 1);
  }
  char *out = bench_capture(argv);
  while (n-- > 0)
    unsetenv(keys[n]);
  double reads, secs, cpu;
  if (!out || !bench_json_num(out, "reads", &reads) ||
      !bench_json_num(out, "seconds", &secs) ||
      !bench_json_num(out, "cpu_s", &cpu) || secs <= 0 ||
      (reads <= 0 && !zero_ok)) {
    fprintf(stderr, "file_read: %s failed\n", rd_->name);
    free(out);
    return false;
  }
  free(out);
  rd_->rps[r] = reads / secs;
  rd_->cpu_us[r] = reads > 0 ? cpu * 1e6 / reads : 0;
  fprintf(stderr, "round %d %-14s %10.0f reads/s %6.2f us CPU each\n", r + 1,
          rd_->name, rd_->rps[r], rd_->cpu_us[r]);
  return true;
}

static double med(const double *v, int n) {
  double c[MAX_ROUNDS];
  memcpy(c, v, (size_t)n * sizeof(*v));
  return bench_median(c, n);
}

static struct {
  double secs;
  int rounds, inflight, hang;
  unsigned mib;
  char path[64], size_s[32], secs_s[32], infl_s[32], hang_s[32];
  char uv[512], preload[600];
  bool have_uv, have_preload;
} g;

/* A file of g.mib MiB, written and read once: in the page cache. */
static bool make_file(void) {
  snprintf(g.path, sizeof(g.path), "/tmp/weft-file-read-XXXXXX");
  int fd = mkstemp(g.path);
  if (fd < 0)
    return false;
  g_size = (uint64_t)g.mib << 20;
  static char chunk[1 << 20];
  memset(chunk, 'f', sizeof(chunk));
  bool ok = true;
  for (unsigned i = 0; ok && i < g.mib; i++)
    ok = write(fd, chunk, sizeof(chunk)) == (ssize_t)sizeof(chunk);
  for (unsigned i = 0; ok && i < g.mib; i++)
    ok = pread(fd, chunk, sizeof(chunk), (off_t)i << 20) >= 0;
  close(fd);
  snprintf(g.size_s, sizeof(g.size_s), "%llu", (unsigned long long)g_size);
  snprintf(g.secs_s, sizeof(g.secs_s), "%.3f", g.secs);
  snprintf(g.infl_s, sizeof(g.infl_s), "%d", g.inflight);
  snprintf(g.hang_s, sizeof(g.hang_s), "%d", g.hang);
  return ok;
}

/* The four readers, in turn; the JSON line. */
static int compare(char *self) {
  reader rs[4] = {{.name = "weft"},
                  {.name = "weft_pool"},
                  {.name = "uv"},
                  {.name = "floor"}};
  char *argv_w[] = {self, "--child", "weft", g.path, g.size_s, g.secs_s, NULL};
  char *argv_f[] = {self, "--child", "floor", g.path, g.size_s, g.secs_s, NULL};
  char *argv_u[] = {g.uv, g.path, g.size_s, g.infl_s, g.secs_s, NULL};
  const char *pool[] = {"WEFT_URING_FILES=pool", NULL};
  for (int r = 0; r < g.rounds; r++)
    for (int k = 0; k < 4; k++) {
      int i = (k + r) % 4;
      if ((i == 0 && !run_one(&rs[0], argv_w, NULL, false, r)) ||
          (i == 1 && !run_one(&rs[1], argv_w, pool, false, r)) ||
          (i == 2 && g.have_uv && !run_one(&rs[2], argv_u, NULL, false, r)) ||
          (i == 3 && !run_one(&rs[3], argv_f, NULL, false, r)))
        return 1;
    }
  printf("%-10s %12s %16s\n", "reader", "reads/s", "CPU us/read");
  for (int k = 0; k < 4; k++)
    if (k != 2 || g.have_uv)
      printf("%-10s %12.0f %16.3f\n", rs[k].name, med(rs[k].rps, g.rounds),
             med(rs[k].cpu_us, g.rounds));
  double wr = med(rs[0].rps, g.rounds), wc = med(rs[0].cpu_us, g.rounds);
  printf("{\"bench\":\"file_read\",\"inflight\":%d,\"mib\":%u,\"rounds\":%d",
         g.inflight, g.mib, g.rounds);
  for (int k = 0; k < 4; k++)
    if (k != 2 || g.have_uv)
      printf(",\"%s_rps\":%.0f,\"%s_cpu_us\":%.3f", rs[k].name,
             med(rs[k].rps, g.rounds), rs[k].name, med(rs[k].cpu_us, g.rounds));
  if (g.have_uv)
    printf(",\"weft_vs_uv_rps\":%.3f,\"weft_vs_uv_cpu\":%.3f",
           wr / med(rs[2].rps, g.rounds), wc / med(rs[2].cpu_us, g.rounds));
  printf(",\"weft_vs_floor_rps\":%.3f,\"weft_vs_floor_cpu\":%.3f}\n",
         wr / med(rs[3].rps, g.rounds), wc / med(rs[3].cpu_us, g.rounds));
  return 0;
}

/* --hang N: each pool-based reader (weft through its blocking pool, libuv)
 * unloaded and with N lookups that never end started first, in turn; the
 * ratio of the loaded rate to the unloaded one says whether slow lookups
 * hold the threads file reads need. The JSON line. */
static int isolation(char *self) {
  if (!g.have_preload) {
    fprintf(stderr, "file_read: --hang needs bench/peers' hang_resolver\n");
    return 1;
  }
  reader rs[6] = {{.name = "weft_pool"}, {.name = "weft_pool_hang"},
                  {.name = "uv"},        {.name = "uv_hang"},
                  {.name = "echo"},      {.name = "echo_hang"}};
  char *argv_w[] = {self, "--child", "weft", g.path, g.size_s, g.secs_s, NULL};
  char *argv_e[] = {self, "--child", "echo", g.path, g.size_s, g.secs_s, NULL};
  char *argv_u[] = {g.uv, g.path, g.size_s, g.infl_s, g.secs_s, NULL};
  char *argv_uh[] = {g.uv,     g.path,   g.size_s, g.infl_s,
                     g.secs_s, g.hang_s, NULL};
  char hang_env[48];
  snprintf(hang_env, sizeof(hang_env), "FILE_READ_HANG=%d", g.hang);
  const char *plain[] = {"WEFT_URING_FILES=pool", g.preload, NULL};
  const char *loaded[] = {"WEFT_URING_FILES=pool", g.preload, hang_env, NULL};
  const char *uvenv[] = {g.preload, NULL};
  const char *echo_plain[] = {g.preload, NULL};
  const char *echo_loaded[] = {g.preload, hang_env, NULL};
  for (int r = 0; r < g.rounds; r++)
    for (int k = 0; k < 6; k++) {
      int i = (k + r) % 6;
      if ((i == 0 && !run_one(&rs[0], argv_w, plain, false, r)) ||
          (i == 1 && !run_one(&rs[1], argv_w, loaded, true, r)) ||
          (i == 2 && g.have_uv && !run_one(&rs[2], argv_u, uvenv, false, r)) ||
          (i == 3 && g.have_uv && !run_one(&rs[3], argv_uh, uvenv, true, r)) ||
          (i == 4 && !run_one(&rs[4], argv_e, echo_plain, false, r)) ||
          (i == 5 && !run_one(&rs[5], argv_e, echo_loaded, true, r)))
        return 1;
    }
  double w0 = med(rs[0].rps, g.rounds), w1 = med(rs[1].rps, g.rounds);
  printf("{\"bench\":\"resolve_isolation\",\"hung_lookups\":%d,"
         "\"rounds\":%d,\"weft_pool_rps\":%.0f,\"weft_pool_hang_rps\":%.0f,"
         "\"weft_ratio\":%.3f",
         g.hang, g.rounds, w0, w1, w0 > 0 ? w1 / w0 : 0);
  if (g.have_uv) {
    double u0 = med(rs[2].rps, g.rounds), u1 = med(rs[3].rps, g.rounds);
    printf(",\"uv_rps\":%.0f,\"uv_hang_rps\":%.0f,\"uv_ratio\":%.3f", u0, u1,
           u0 > 0 ? u1 / u0 : 0);
  }
  double e0 = med(rs[4].rps, g.rounds), e1 = med(rs[5].rps, g.rounds);
  printf(",\"echo_rtps\":%.0f,\"echo_hang_rtps\":%.0f,\"echo_ratio\":%.3f}\n",
         e0, e1, e0 > 0 ? e1 / e0 : 0);
  return 0;
}

int main(int argc, char **argv) {
  g.secs = 2;
  g.rounds = 5;
  g.inflight = 64;
  g.mib = 64;
  if (argc == 6 && !strcmp(argv[1], "--child")) {
    g_fd = open(argv[3], O_RDONLY | O_CLOEXEC);
    g_size = strtoull(argv[4], NULL, 10);
    if (g_fd < 0)
      return 1;
    if (!strcmp(argv[2], "floor"))
      return floor_reader(atof(argv[5]));
    if (!strcmp(argv[2], "echo"))
      return weft_echo(atof(argv[5]));
    return weft_reader(atoi(getenv("FILE_READ_INFLIGHT")), atof(argv[5]));
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--seconds"))
      g.secs = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--rounds"))
      g.rounds = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--inflight"))
      g.inflight = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--mib"))
      g.mib = (unsigned)atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--hang"))
      g.hang = atoi(argv[i + 1]);
    else
      goto usage;
  }
  if (argc % 2 == 0 || g.secs <= 0 || g.rounds < 1 || g.rounds > MAX_ROUNDS ||
      g.inflight < 1 || g.inflight > MAX_INFLIGHT || g.mib < 1 ||
      g.mib > 4096 || g.hang < 0 || g.hang > 1024)
    goto usage;
  char inf_env[64], lib[512];
  snprintf(inf_env, sizeof(inf_env), "FILE_READ_INFLIGHT=%d", g.inflight);
  putenv(inf_env);
  g.have_uv = bench_peer_path("uv_file_read", g.uv, sizeof(g.uv));
  g.have_preload = bench_peer_path("libhang_resolver.so", lib, sizeof(lib));
  snprintf(g.preload, sizeof(g.preload), "LD_PRELOAD=%s", lib);
  if (!make_file()) {
    unlink(g.path);
    return 1;
  }
  int rc = g.hang ? isolation(argv[0]) : compare(argv[0]);
  unlink(g.path);
  return rc;
usage:
  fprintf(stderr, "usage: file_read [--seconds S] [--rounds R] "
                  "[--inflight N] [--mib M] [--hang N]\n");
  return 2;
}

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
 */
#include <weft.h>

#include <errno.h>
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

static void on_read(void *arg, long result) {
  rd *r = arg;
  if (result == 4096)
    atomic_fetch_add_explicit(&g_reads, 1, memory_order_relaxed);
  if (now_ns() < g_end_ns &&
      weft_fs_read(r->rt, r->s, g_fd, r->buf, sizeof(r->buf),
                   (int64_t)next_off(&r->seed), on_read, r) == 0)
    return;
  if (atomic_fetch_sub(&g_live, 1) == 1)
    weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_DRAIN | WEFT_SHUTDOWN_NOWAIT);
}

static void start_reads(void *arg) {
  rd *r = arg;
  if (weft_fs_read(r->rt, r->s, g_fd, r->buf, sizeof(r->buf),
                   (int64_t)next_off(&r->seed), on_read, r) != 0 &&
      atomic_fetch_sub(&g_live, 1) == 1)
    weft_rt_shutdown(g_rt, WEFT_SHUTDOWN_DRAIN | WEFT_SHUTDOWN_NOWAIT);
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
  weft_rt_wait(g_rt, UINT64_MAX);
  double el = (double)(now_ns() - t0) / 1e9;
  printf("{\"reads\":%llu,\"seconds\":%.3f,\"cpu_s\":%.3f}\n",
         (unsigned long long)atomic_load(&g_reads), el, cpu_s() - c0);
  for (int i = 0; i < 4; i++)
    weft_strand_release(ss[i]);
  weft_rt_destroy(g_rt);
  return 0;
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
  bool ok;
} reader;

static bool run_one(reader *rd_, char *const argv[], const char *env, int r) {
  if (env)
    putenv((char *)env);
  char *out = bench_capture(argv);
  if (env)
    unsetenv("WEFT_URING_FILES");
  double reads, secs, cpu;
  if (!out || !bench_json_num(out, "reads", &reads) ||
      !bench_json_num(out, "seconds", &secs) ||
      !bench_json_num(out, "cpu_s", &cpu) || secs <= 0 || reads <= 0) {
    fprintf(stderr, "file_read: %s failed\n", rd_->name);
    free(out);
    return false;
  }
  free(out);
  rd_->rps[r] = reads / secs;
  rd_->cpu_us[r] = cpu * 1e6 / reads;
  fprintf(stderr, "round %d %-10s %10.0f reads/s %6.2f us CPU each\n", r + 1,
          rd_->name, rd_->rps[r], rd_->cpu_us[r]);
  return true;
}

static double med(const double *v, int n) {
  double c[MAX_ROUNDS];
  memcpy(c, v, (size_t)n * sizeof(*v));
  return bench_median(c, n);
}

int main(int argc, char **argv) {
  double secs = 2;
  int rounds = 5, inflight = 64;
  unsigned mib = 64;
  if (argc == 6 && !strcmp(argv[1], "--child")) {
    g_fd = open(argv[3], O_RDONLY | O_CLOEXEC);
    g_size = strtoull(argv[4], NULL, 10);
    if (g_fd < 0)
      return 1;
    if (!strcmp(argv[2], "floor"))
      return floor_reader(atof(argv[5]));
    return weft_reader(atoi(getenv("FILE_READ_INFLIGHT")), atof(argv[5]));
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--seconds"))
      secs = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--rounds"))
      rounds = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--inflight"))
      inflight = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--mib"))
      mib = (unsigned)atoi(argv[i + 1]);
    else
      goto usage;
  }
  if (argc % 2 == 0 || secs <= 0 || rounds < 1 || rounds > MAX_ROUNDS ||
      inflight < 1 || inflight > MAX_INFLIGHT || mib < 1 || mib > 4096)
    goto usage;
  char path[] = "/tmp/weft-file-read-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0)
    return 1;
  g_size = (uint64_t)mib << 20;
  static char chunk[1 << 20];
  memset(chunk, 'f', sizeof(chunk));
  for (unsigned i = 0; i < mib; i++)
    if (write(fd, chunk, sizeof(chunk)) != (ssize_t)sizeof(chunk))
      return 1;
  for (unsigned i = 0; i < mib; i++) /* into the page cache */
    if (pread(fd, chunk, sizeof(chunk), (off_t)i << 20) < 0)
      return 1;
  close(fd);
  char size_s[32], secs_s[32], infl_s[32], env_infl[64], uvpath[512];
  snprintf(size_s, sizeof(size_s), "%llu", (unsigned long long)g_size);
  snprintf(secs_s, sizeof(secs_s), "%.3f", secs);
  snprintf(infl_s, sizeof(infl_s), "%d", inflight);
  snprintf(env_infl, sizeof(env_infl), "FILE_READ_INFLIGHT=%d", inflight);
  putenv(env_infl);
  reader rs[4] = {{.name = "weft"},
                  {.name = "weft_pool"},
                  {.name = "uv"},
                  {.name = "floor"}};
  bool have_uv = bench_peer_path("uv_file_read", uvpath, sizeof(uvpath));
  for (int r = 0; r < rounds; r++) {
    for (int k = 0; k < 4; k++) {
      int i = (k + r) % 4;
      char *argv_w[] = {argv[0], "--child", "weft", path, size_s, secs_s, NULL};
      char *argv_f[] = {argv[0], "--child", "floor", path,
                        size_s,  secs_s,    NULL};
      char *argv_u[] = {uvpath, path, size_s, infl_s, secs_s, NULL};
      bool ok = true;
      if (i == 0)
        ok = run_one(&rs[0], argv_w, NULL, r);
      else if (i == 1)
        ok = run_one(&rs[1], argv_w, "WEFT_URING_FILES=pool", r);
      else if (i == 2 && have_uv)
        ok = run_one(&rs[2], argv_u, NULL, r);
      else if (i == 3)
        ok = run_one(&rs[3], argv_f, NULL, r);
      if (!ok) {
        unlink(path);
        return 1;
      }
    }
  }
  unlink(path);
  printf("%-10s %12s %16s\n", "reader", "reads/s", "CPU us/read");
  for (int k = 0; k < 4; k++)
    if (k != 2 || have_uv)
      printf("%-10s %12.0f %16.3f\n", rs[k].name, med(rs[k].rps, rounds),
             med(rs[k].cpu_us, rounds));
  double wr = med(rs[0].rps, rounds), wc = med(rs[0].cpu_us, rounds);
  printf("{\"bench\":\"file_read\",\"inflight\":%d,\"mib\":%u,\"rounds\":%d",
         inflight, mib, rounds);
  for (int k = 0; k < 4; k++)
    if (k != 2 || have_uv)
      printf(",\"%s_rps\":%.0f,\"%s_cpu_us\":%.3f", rs[k].name,
             med(rs[k].rps, rounds), rs[k].name, med(rs[k].cpu_us, rounds));
  if (have_uv)
    printf(",\"weft_vs_uv_rps\":%.3f,\"weft_vs_uv_cpu\":%.3f",
           wr / med(rs[2].rps, rounds), wc / med(rs[2].cpu_us, rounds));
  printf(",\"weft_vs_floor_rps\":%.3f,\"weft_vs_floor_cpu\":%.3f}\n",
         wr / med(rs[3].rps, rounds), wc / med(rs[3].cpu_us, rounds));
  return 0;
usage:
  fprintf(stderr, "usage: file_read [--seconds S] [--rounds R] "
                  "[--inflight N] [--mib M]\n");
  return 2;
}

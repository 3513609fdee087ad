/*
 * uv_file_read.c - random 4 KiB reads of a file in the page cache through
 * libuv's uv_fs_read (its thread pool, UV_THREADPOOL_SIZE threads, 4 by
 * default): the libuv peer of bench/file_read.
 *
 * Usage: uv_file_read PATH SIZE INFLIGHT SECONDS [HANG]
 * Keeps INFLIGHT reads in flight for SECONDS (each completion issues the
 * next), then prints one JSON line: reads, seconds, and the process's CPU
 * seconds (user + system) over the same span. With HANG, that many
 * uv_getaddrinfo lookups of names that never resolve (under .hang.test,
 * with bench/peers/hang_resolver.c preloaded) are started first, on the
 * same pool as the reads (bench/resolve_isolation); the program then
 * exits at the end of the span without waiting for them.
 */
#include <uv.h>

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

#define MAX_INFLIGHT 1024

typedef struct rd {
  uv_fs_t req;
  char buf[4096];
  uint64_t seed;
} rd;

static uv_file g_fd;
static uint64_t g_size, g_reads, g_end_ns;
static int g_stop;

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

static uint64_t next_off(rd *r) {
  r->seed = r->seed * 6364136223846793005ull + 1442695040888963407ull;
  return ((r->seed >> 33) % (g_size / 4096)) * 4096;
}

static void on_read(uv_fs_t *req);

static uv_getaddrinfo_t g_gai[1024];
static uv_timer_t g_timer;
static uint64_t g_t0;
static double g_c0;

static void report(void) {
  double el = (double)(now_ns() - g_t0) / 1e9;
  printf("{\"reads\":%llu,\"seconds\":%.3f,\"cpu_s\":%.3f}\n",
         (unsigned long long)g_reads, el, cpu_s() - g_c0);
  fflush(stdout);
}

static void on_gai(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
  (void)req;
  (void)status;
  uv_freeaddrinfo(res);
}

static void on_end(uv_timer_t *t) { /* lookups hang: stop without them */
  (void)t;
  g_stop = 1;
  report();
  _exit(0);
}

static void issue(rd *r) {
  uv_buf_t b = uv_buf_init(r->buf, sizeof(r->buf));
  uv_fs_read(uv_default_loop(), &r->req, g_fd, &b, 1, (int64_t)next_off(r),
             on_read);
}

static void on_read(uv_fs_t *req) {
  rd *r = (rd *)req;
  if (req->result == 4096)
    g_reads++;
  uv_fs_req_cleanup(req);
  if (!g_stop && now_ns() < g_end_ns)
    issue(r);
}

int main(int argc, char **argv) {
  if (argc != 5 && argc != 6)
    return 2;
  int hang = argc == 6 ? atoi(argv[5]) : 0;
  if (hang < 0 || hang > 1024)
    return 2;
  for (int i = 0; i < hang; i++) {
    char name[64];
    snprintf(name, sizeof(name), "h%d.hang.test", i);
    uv_getaddrinfo(uv_default_loop(), &g_gai[i], on_gai, name, "80", NULL);
  }
  uv_fs_t o;
  g_fd = uv_fs_open(NULL, &o, argv[1], O_RDONLY, 0, NULL);
  g_size = strtoull(argv[2], NULL, 10);
  int inflight = atoi(argv[3]);
  double secs = atof(argv[4]);
  if (g_fd < 0 || inflight < 1 || inflight > MAX_INFLIGHT)
    return 1;
  static rd rds[MAX_INFLIGHT];
  double c0 = cpu_s();
  uint64_t t0 = now_ns();
  g_end_ns = t0 + (uint64_t)(secs * 1e9);
  g_t0 = t0;
  g_c0 = c0;
  if (hang) {
    uv_timer_init(uv_default_loop(), &g_timer);
    uv_timer_start(&g_timer, on_end, (uint64_t)(secs * 1000), 0);
  }
  for (int i = 0; i < inflight; i++) {
    rds[i].seed = (uint64_t)i + 1;
    issue(&rds[i]);
  }
  uv_run(uv_default_loop(), UV_RUN_DEFAULT);
  double el = (double)(now_ns() - t0) / 1e9;
  printf("{\"reads\":%llu,\"seconds\":%.3f,\"cpu_s\":%.3f}\n",
         (unsigned long long)g_reads, el, cpu_s() - c0);
  return 0;
}

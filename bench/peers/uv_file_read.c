/*
 * uv_file_read.c - random 4 KiB reads of a file in the page cache through
 * libuv's uv_fs_read (its thread pool, UV_THREADPOOL_SIZE threads, 4 by
 * default): the libuv peer of bench/file_read.
 *
 * Usage: uv_file_read PATH SIZE INFLIGHT SECONDS
 * Keeps INFLIGHT reads in flight for SECONDS (each completion issues the
 * next), then prints one JSON line: reads, seconds, and the process's CPU
 * seconds (user + system) over the same span.
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
  if (argc != 5)
    return 2;
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

/*
 * benchutil.h - helpers shared by the benchmarks (bench/NAME.c and
 * examples/seed_strand.c): run a child and capture its stdout, find a peer
 * binary under WEFT_PEER_DIR, read "key":number from a JSON line, take
 * a median, fault a buffer's pages in, and write a distribution's tail;
 * the clock, the process's resident bytes, and the scale benchmarks'
 * random deadlines.
 * Header-only; every function is static inline.
 */
#ifndef WEFT_BENCHUTIL_H
#define WEFT_BENCHUTIL_H

#include <errno.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* CLOCK_MONOTONIC, in nanoseconds. */
static inline uint64_t bench_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Resident bytes of this process (/proc/self/statm), or -1. */
static inline long bench_rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long size, res;
  int got = f ? fscanf(f, "%ld %ld", &size, &res) : 0;
  if (f)
    fclose(f);
  return got == 2 ? res * sysconf(_SC_PAGESIZE) : -1;
}

/* bench/scale's and its peers' deadlines: between 1 s and 1 h ahead, from
 * a xorshift64 (13, 7, 17) whose state starts at BENCH_SCALE_SEED, so that
 * every program draws the same sequence (asio_scale.cpp, in C++, has its
 * own copy). */
#define BENCH_SCALE_SEED 0x9E3779B97F4A7C15u
static inline uint64_t bench_scale_deadline_ns(uint64_t *state) {
  uint64_t x = *state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  *state = x;
  return 1000000000u + x % (3600000000000u - 1000000000u);
}

/* Writes a byte of each page of p[0..n), so that a benchmark's first
 * writes into a large buffer do not fault pages in while it measures. Not
 * memset: gcc 12 turns a malloc followed by a memset of 0 into calloc,
 * whose large blocks are fresh, untouched mappings. */
static inline void bench_prefault(void *p, size_t n) {
  volatile char *c = p;
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  for (size_t i = 0; i < n; i += pg)
    c[i] = 0;
}

/* Runs argv[0] with argv and returns its stdout (malloc'd, NUL-terminated),
 * or NULL if it could not start or did not exit with 0. */
static inline char *bench_capture(char *const argv[]) {
  int fds[2];
  if (pipe(fds) != 0)
    return NULL;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  pid_t pid;
  int r = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (r) {
    close(fds[0]);
    return NULL;
  }
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  ssize_t k;
  while (buf && (k = read(fds[0], buf + len, cap - 1 - len)) > 0) {
    len += (size_t)k;
    if (cap - 1 - len == 0) {
      char *nb = realloc(buf, cap *= 2);
      if (!nb)
        free(buf);
      buf = nb;
    }
  }
  close(fds[0]);
  int st;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
    ;
  if (!buf || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    free(buf);
    return NULL;
  }
  buf[len] = 0;
  return buf;
}

/* The peer binary NAME in $WEFT_PEER_DIR, else in the WEFT_PEER_DIR the
 * build defines; written into buf. NULL unless it is there and executable. */
static inline const char *bench_peer_path(const char *name, char *buf,
                                          size_t size) {
  const char *dir = getenv("WEFT_PEER_DIR");
#ifdef WEFT_PEER_DIR
  if (!dir)
    dir = WEFT_PEER_DIR;
#endif
  if (!dir)
    return NULL;
  snprintf(buf, size, "%s/%s", dir, name);
  return access(buf, X_OK) == 0 ? buf : NULL;
}

/* Reads "KEY":number from a JSON line (key given without quotes). */
static inline bool bench_json_num(const char *s, const char *key, double *out) {
  char k[64];
  snprintf(k, sizeof(k), "\"%s\":", key);
  const char *p = strstr(s, k);
  if (!p)
    return false;
  *out = strtod(p + strlen(k), NULL);
  return true;
}

/* The last line of s, with the trailing newlines cut off s. */
static inline char *bench_last_line(char *s) {
  size_t len = strlen(s);
  while (len && s[len - 1] == '\n')
    s[--len] = 0;
  char *line = strrchr(s, '\n');
  return line ? line + 1 : s;
}

static inline int bench_cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Sorts v[0..n) in place and returns its median. */
static inline double bench_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(*v), bench_cmp_dbl);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Appends the upper tail of a distribution to f, for tools/bench-report's
 * plots: lines "NAME VALUE FRACTION", FRACTION the share of the n samples
 * at least VALUE, at ranks from the top that grow by about 5% a line (some
 * 50 lines a decade), then the minimum. sorted: n values, ascending, in ns;
 * VALUE is in us. */
static inline void bench_write_tail(FILE *f, const char *name,
                                    const int64_t *sorted, size_t n) {
  for (size_t k = 1; k <= n; k += 1 + k / 20)
    fprintf(f, "%s %.3f %.6g\n", name, (double)sorted[n - k] / 1e3,
            (double)k / (double)n);
  if (n)
    fprintf(f, "%s %.3f 1\n", name, (double)sorted[0] / 1e3);
}

#endif

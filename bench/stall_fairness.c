/*
 * stall_fairness - what a handler that spins for seconds costs everything
 * else, against the same CPU taken away by another process.
 *
 *   stall_fairness [--threads N] [--timers T] [--period-us P]
 *                  [--seconds S] [--rounds R]
 *
 * A runtime of N workers (default 2) runs T periodic timers (default
 * 1000, each on its own strand, period P us, default 1000, first
 * deadlines spread over a period) and an echo server on 127.0.0.1, which
 * a client thread of this program pings every millisecond (32 bytes there
 * and back). Three phases of S seconds (default 2), R times in turn
 * (default 3), measure the timers' lateness (entry time minus the
 * deadline fired for) and the echo's round trip:
 *   quiet       nothing else;
 *   weft_spin   one more strand runs a handler that spins for the whole
 *               phase (the monitor hands its shard to a spare thread);
 *   floor_spin  no such handler: a child process spins instead, taking
 *               the same CPU away with no runtime involved.
 * The floor is what losing one CPU to a spinner costs by itself; the
 * promise asks that weft's spinning handler cost the rest no more than
 * that: timer_p99_vs_floor and echo_p99_vs_floor, weft_spin's p99 over
 * floor_spin's, at most 1. Last line: one JSON object.
 */
#include <weft.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "benchutil.h"

enum { P_QUIET, P_WEFT, P_FLOOR, PHASES, P_NONE = PHASES };
static const char *const phase_name[PHASES] = {"quiet", "weft_spin",
                                               "floor_spin"};

#define MAX_SAMPLES (1u << 23)
static uint32_t *g_tsamp[PHASES], *g_esamp[PHASES]; /* ns, capped */
static _Atomic uint32_t g_tn[PHASES], g_en[PHASES];
static _Atomic int g_phase = P_NONE;
static uint64_t g_period_ns;

static uint64_t now_ns(void) { return weft_now_ns(); }

static void record(uint32_t **s, _Atomic uint32_t *n, int ph, uint64_t v) {
  uint32_t i = atomic_fetch_add_explicit(&n[ph], 1, memory_order_relaxed);
  if (i < MAX_SAMPLES)
    s[ph][i] = v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

typedef struct ptimer {
  weft_timer *t;
  uint64_t next; /* the deadline it fires for next */
} ptimer;

static void on_tick(void *arg, int status, uint64_t missed) {
  ptimer *p = arg;
  if (status)
    return;
  uint64_t now = now_ns();
  int ph = atomic_load_explicit(&g_phase, memory_order_relaxed);
  if (ph != P_NONE && now >= p->next)
    record(g_tsamp, g_tn, ph, now - p->next);
  p->next += g_period_ns * (1 + missed);
}

/* ---- echo ---------------------------------------------------------------- */

typedef struct econn {
  char buf[256];
} econn;

static void econn_free(void *data, weft_tcp *c) {
  (void)c;
  free(data);
}
static void e_read(void *arg, weft_tcp *c, long n);
static void e_written(void *arg, weft_tcp *c, int status) {
  econn *e = arg;
  if (status < 0 || weft_tcp_read(c, e->buf, sizeof(e->buf), e_read, e) < 0)
    weft_tcp_close(c, 0);
}
static void e_read(void *arg, weft_tcp *c, long n) {
  econn *e = arg;
  if (n <= 0 || weft_tcp_write(c, e->buf, (size_t)n, e_written, e) < 0)
    weft_tcp_close(c, 0);
}
static void e_accept(void *arg, weft_tcp *c) {
  (void)arg;
  econn *e = malloc(sizeof(*e));
  if (!e) {
    weft_tcp_close(c, 1);
    return;
  }
  weft_tcp_set_data(c, e, econn_free);
  weft_tcp_nodelay(c, 1);
  if (weft_tcp_read(c, e->buf, sizeof(e->buf), e_read, e) < 0)
    weft_tcp_close(c, 0);
}

static atomic_bool g_stop;
static uint16_t g_port;

static void *pinger(void *arg) {
  (void)arg;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(g_port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
    perror("stall_fairness: connect");
    exit(1);
  }
  char msg[32] = "ping", back[32];
  while (!atomic_load(&g_stop)) {
    uint64_t t0 = now_ns();
    if (send(fd, msg, sizeof(msg), 0) != (ssize_t)sizeof(msg))
      break;
    size_t got = 0;
    while (got < sizeof(back)) {
      ssize_t n = recv(fd, back + got, sizeof(back) - got, 0);
      if (n <= 0)
        goto out;
      got += (size_t)n;
    }
    int ph = atomic_load_explicit(&g_phase, memory_order_relaxed);
    if (ph != P_NONE)
      record(g_esamp, g_en, ph, now_ns() - t0);
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
out:
  close(fd);
  return NULL;
}

/* ---- the spinners ----------------------------------------------------------
 */

static uint64_t g_spin_until;
static atomic_bool g_spin_done;

static void spin_handler(void *arg) {
  (void)arg;
  while (now_ns() < g_spin_until) {
  }
  atomic_store(&g_spin_done, true);
}

static void sleep_until(uint64_t t) {
  while (now_ns() < t) {
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
}

/* ---- report ---------------------------------------------------------------
 */

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

static double pct(uint32_t *v, uint32_t n, double q) {
  if (!n)
    return -1;
  uint32_t i = (uint32_t)(q * (n - 1));
  return v[i] / 1000.0;
}

static void usage(void) {
  fprintf(stderr, "usage: stall_fairness [--threads N] [--timers T] "
                  "[--period-us P] [--seconds S] [--rounds R]\n");
  exit(2);
}

int main(int argc, char **argv) {
  unsigned threads = 2, ntimers = 1000, period_us = 1000, rounds = 3;
  double seconds = 2;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc)
      usage();
    const char *a = argv[i], *v = argv[i + 1];
    if (!strcmp(a, "--threads"))
      threads = (unsigned)atoi(v);
    else if (!strcmp(a, "--timers"))
      ntimers = (unsigned)atoi(v);
    else if (!strcmp(a, "--period-us"))
      period_us = (unsigned)atoi(v);
    else if (!strcmp(a, "--seconds"))
      seconds = atof(v);
    else if (!strcmp(a, "--rounds"))
      rounds = (unsigned)atoi(v);
    else
      usage();
  }
  if (!threads || !ntimers || !period_us || seconds <= 0 || !rounds)
    usage();
  g_period_ns = (uint64_t)period_us * 1000;
  for (int p = 0; p < PHASES; p++) {
    g_tsamp[p] = malloc(MAX_SAMPLES * sizeof(uint32_t));
    g_esamp[p] = malloc(MAX_SAMPLES * sizeof(uint32_t));
    if (!g_tsamp[p] || !g_esamp[p])
      return 1;
    bench_prefault(g_tsamp[p], MAX_SAMPLES * sizeof(uint32_t));
    bench_prefault(g_esamp[p], MAX_SAMPLES * sizeof(uint32_t));
  }

  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = threads;
  cfg.on_stall = NULL;
  cfg.log_level = WEFT_LOG_ERROR; /* the spinner's stall is the point */
  weft_rt *rt;
  int r = weft_rt_create(&rt, &cfg);
  if (r) {
    fprintf(stderr, "weft_rt_create: %s\n", weft_strerror(r));
    return 1;
  }
  ptimer *pt = calloc(ntimers, sizeof(*pt));
  uint64_t start = now_ns() + 10000000;
  for (unsigned i = 0; i < ntimers; i++) {
    weft_strand *s;
    if (weft_strand_create(rt, &s) || weft_timer_create(rt, s, &pt[i].t))
      return 1;
    pt[i].next = start + g_period_ns * i / ntimers;
    if (weft_timer_start_at(pt[i].t, pt[i].next, g_period_ns, on_tick, &pt[i]))
      return 1;
  }
  struct sockaddr_in la = {.sin_family = AF_INET};
  la.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  weft_listener *l;
  if (weft_tcp_listen(rt, (struct sockaddr *)&la, sizeof(la), NULL, e_accept,
                      NULL, &l))
    return 1;
  unsigned alen = sizeof(la);
  weft_listener_addr(l, (struct sockaddr *)&la, &alen);
  g_port = ntohs(la.sin_port);
  pthread_t pth;
  pthread_create(&pth, NULL, pinger, NULL);
  weft_strand *spin_strand;
  weft_strand_create(rt, &spin_strand);
  sleep_until(now_ns() + 300000000); /* warm-up */

  uint64_t span = (uint64_t)(seconds * 1e9);
  for (unsigned k = 0; k < rounds; k++) {
    for (int p = 0; p < PHASES; p++) {
      int ph = (p + (int)k) % PHASES; /* rotated: each meets all minutes */
      uint64_t until = now_ns() + span;
      pid_t child = -1;
      if (ph == P_WEFT) {
        g_spin_until = until;
        atomic_store(&g_spin_done, false);
        weft_post(spin_strand, spin_handler, NULL);
      } else if (ph == P_FLOOR) {
        fflush(NULL);
        child = fork();
        if (child == 0) {
          while (now_ns() < until) {
          }
          _exit(0);
        }
      }
      atomic_store(&g_phase, ph);
      sleep_until(until);
      atomic_store(&g_phase, P_NONE);
      if (child > 0)
        waitpid(child, NULL, 0);
      while (ph == P_WEFT && !atomic_load(&g_spin_done))
        sleep_until(now_ns() + 1000000);
      sleep_until(now_ns() + 100000000); /* settle */
    }
  }
  atomic_store(&g_stop, true);
  pthread_join(pth, NULL);
  weft_rt_shutdown(rt, WEFT_SHUTDOWN_CANCEL);
  weft_rt_destroy(rt);

  double tp99[PHASES], ep99[PHASES];
  printf("phase        timer p50/p99/max us      echo p50/p99 us\n");
  char json[2048];
  int off = snprintf(json, sizeof(json),
                     "{\"bench\":\"stall_fairness\",\"threads\":%u,"
                     "\"timers\":%u,\"period_us\":%u,\"seconds\":%g,"
                     "\"rounds\":%u",
                     threads, ntimers, period_us, seconds, rounds);
  for (int p = 0; p < PHASES; p++) {
    uint32_t tn = atomic_load(&g_tn[p]), en = atomic_load(&g_en[p]);
    tn = tn < MAX_SAMPLES ? tn : MAX_SAMPLES;
    en = en < MAX_SAMPLES ? en : MAX_SAMPLES;
    qsort(g_tsamp[p], tn, sizeof(uint32_t), cmp_u32);
    qsort(g_esamp[p], en, sizeof(uint32_t), cmp_u32);
    double t50 = pct(g_tsamp[p], tn, 0.5), t99 = pct(g_tsamp[p], tn, 0.99);
    double tmax = pct(g_tsamp[p], tn, 1.0);
    double e50 = pct(g_esamp[p], en, 0.5), e99 = pct(g_esamp[p], en, 0.99);
    tp99[p] = t99;
    ep99[p] = e99;
    printf("%-12s %8.1f %8.1f %9.1f   %8.1f %8.1f   (%u firings, %u pings)\n",
           phase_name[p], t50, t99, tmax, e50, e99, tn, en);
    off += snprintf(json + off, sizeof(json) - (size_t)off,
                    ",\"%s\":{\"timer_p50_us\":%.2f,\"timer_p99_us\":%.2f,"
                    "\"timer_max_us\":%.1f,\"echo_p50_us\":%.2f,"
                    "\"echo_p99_us\":%.2f,\"firings\":%u,\"pings\":%u}",
                    phase_name[p], t50, t99, tmax, e50, e99, tn, en);
  }
  snprintf(json + off, sizeof(json) - (size_t)off,
           ",\"timer_p99_vs_floor\":%.3f,\"echo_p99_vs_floor\":%.3f}",
           tp99[P_FLOOR] > 0 ? tp99[P_WEFT] / tp99[P_FLOOR] : -1,
           ep99[P_FLOOR] > 0 ? ep99[P_WEFT] / ep99[P_FLOOR] : -1);
  printf("%s\n", json);
  return 0;
}

/*
 * timer_lateness - how late weft's periodic timers fire, against the kernel
 * floor and against Asio and libuv, in one run.
 *
 *  weft: a runtime of --threads workers; --timers periodic timers, each on
 *    its own strand, period --period-us, first deadlines spread evenly over
 *    one period. Each handler records lateness = weft_now_ns() at entry
 *    minus the deadline it fired for (first + k * period, k counting
 *    firings plus the periods weft reported missed). --busy K strands run
 *    ~1 us handlers that re-post themselves, so timers compete with work;
 *    --blocked K strands each run one handler that sleeps through the
 *    whole measurement.
 *  floor: the same timers with no runtime: --threads threads, each owning
 *    every threads-th timer in deadline order, 1 ns timer slack, sleeping to
 *    the next deadline (a) with clock_nanosleep(TIMER_ABSTIME), (b) with an
 *    absolute timerfd and epoll_wait. Each variant gets as many seconds as
 *    weft: a maximum is the worst of the machine's hiccups in its window,
 *    and a window half as long meets fewer of them. The floor is the
 *    variant with the lower p99. No busy or blocked work.
 *  late timers, everywhere: a timer that comes late fires once, late, for
 *    the deadline it was due at, and the periods that passed meanwhile are
 *    skipped (counted as missed): its next deadline is the first still
 *    ahead, as with weft's periodic timers, instead of one firing for each
 *    period passed. So a stall shows at its full length in the maximum
 *    but as one late sample per timer, not one per period. The floor and
 *    the Asio peer apply the rule themselves; libuv's repeat skips the
 *    same way.
 *  slices: the three windows are interleaved, --slices of them each
 *    (default 6): weft, nanosleep, timerfd, then again in a rotated order,
 *    each slice --seconds / --slices long, so that all three meet the
 *    hiccups of the same minutes. On a shared guest a vCPU can stop for
 *    milliseconds at a time; with one window after the other, a maximum
 *    says more about which window met the longest stop than about what
 *    was measured. --slices 1: one window each, one after the other.
 *    Each slice starts afresh (a new runtime, new threads) and has its
 *    own warm-up.
 *  vcpu stall: nothing but one thread per CPU, pinned to it, SCHED_FIFO
 *    (when permitted), 1 ns slack, sleeping to a deadline every 1 ms for
 *    --seconds; the worst oversleep (vcpu_stall_max_us) and the time spent
 *    more than 0.5 ms past a deadline, per CPU (vcpu_stall_ms_per_s,
 *    ms per second, the mean of the CPUs). Little in a
 *    guest keeps a pinned real-time thread from its CPU (interrupts, the
 *    kernel's own real-time threads, sections with interrupts off), so
 *    these are mostly gaps where the virtual CPU itself did not run, and
 *    no scheduler, weft's or the kernel's, fires a timer inside one. The
 *    guest is idle meanwhile, so the figures include the host's delay in
 *    waking an idle vCPU. vcpu_stall_rt says whether SCHED_FIFO was
 *    granted (without it they include the kernel's scheduling too).
 *    --no-probe skips it.
 *  peers: build/bench/peers/asio_timer_lateness and uv_timer_lateness, run
 *    with the same flags when built (--no-peer skips them).
 *  --no-spin: the runtime with WEFT_CONFIG_NO_TIMER_SPIN, sleeping for
 *    every deadline however near (weft_config.timer_spin_ns).
 *  cpu_ms_per_s: the process's CPU time per second of the sampling window,
 *    for weft and each floor variant (each runs alone in the process).
 *
 * episodes: a stop of the machine shows as a burst of samples more than
 *   0.5 ms late (firings less than 2 ms apart); a burst of more than
 *   timers / 2 of them is an episode (the first 400000 late samples of a
 *   variant are kept). Its stall is the time from the
 *   earliest deadline in it to its first firing, its excess the worst
 *   lateness in it minus the stall: what serving the timers that fell due
 *   added to the stop itself. Reported per variant: episodes,
 *   episode_excess_p50_us, episode_excess_max_us.
 *
 * Samples: after a 0.2 s warm-up, deadlines in each slice's window;
 * nearest-rank percentiles; "missed" counts periods skipped by a timer more
 * than a period late. weft's counters go to stderr. The last line is one JSON
 * object; ratios are weft's p99 over the other's (below 1: weft is better).
 *   build/bench/timer_lateness [--timers T] [--period-us P] [--seconds S]
 *     [--threads N] [--busy K] [--blocked K] [--slices N] [--no-peer]
 *     [--no-spin] [--no-probe] [--dist FILE]
 * --dist FILE: the tail of each variant's distribution (weft,
 * floor_nanosleep, floor_timerfd, then the peers, which append theirs) as
 * lines "NAME LATENESS_US FRACTION" (bench_write_tail) for a plot.
 */
#include <weft.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "benchutil.h"

#define WARMUP_NS 200000000ull
#define LEAD_NS 20000000ull /* set-up time before the first deadline */

struct opts {
  unsigned timers, period_us, threads, busy, blocked, slices;
  double seconds;
  bool peers, spin, probe;
  const char *dist;
};

/* cpu: CPU time of the whole process per second of the run, in ms (1000:
 * one CPU busy); 0 where not measured (peers). */
struct result {
  double p50, p99, max;
  unsigned long long n, missed;
  bool ok;
  double cpu;
  unsigned episodes;
  double ex_p50, ex_max;
};

#define LATE_NS 500000u        /* a sample this late may be in an episode */
#define LATE_CAP 400000u       /* late samples kept per variant */
#define EPISODE_GAP_NS 2000000 /* firings further apart: another burst */

struct late {
  uint64_t fired, deadline;
};

/* Lateness samples of one variant over all its slices: timer i owns
 * v[i * cap ...], n[i] of them; only deadlines in the current slice's
 * [from, to) count. A timer is served by one thread at a time (its strand,
 * its floor thread), so no atomics. cpu and wall add up the slices'
 * sampling windows, missed their missed periods. */
struct samples {
  int64_t *v;
  uint32_t *n;
  size_t cap;
  uint64_t from, to;
  uint64_t cpu, wall, missed;
  /* Samples later than LATE_NS, from any thread: a slot each by fetch_add;
   * read after the threads are joined or the runtime destroyed. */
  struct late *late;
  atomic_size_t nlate;
};

static uint64_t clock_ns(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

static void sleep_until(uint64_t t) {
  struct timespec ts = {(time_t)(t / 1000000000u), (long)(t % 1000000000u)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
    ;
}

/* Sleeps through s's window, adding the process's CPU time and the wall
 * time of [from, to) to s. */
static void sample_window(struct samples *s) {
  sleep_until(s->from);
  uint64_t cpu0 = clock_ns(CLOCK_PROCESS_CPUTIME_ID), wall0 = now_ns();
  sleep_until(s->to);
  s->cpu += clock_ns(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
  s->wall += now_ns() - wall0;
}

static void die(const char *what, int err) {
  fprintf(stderr, "timer_lateness: %s: %s\n", what, weft_strerror(err));
  exit(1);
}

static uint64_t first_deadline(const struct opts *o, uint64_t t0, unsigned i) {
  return t0 + (uint64_t)i * o->period_us * 1000 / o->timers;
}

static void samples_init(struct samples *s, const struct opts *o) {
  *s = (struct samples){0};
  uint64_t slice = (uint64_t)(o->seconds * 1e9 / o->slices);
  s->cap = (slice / (o->period_us * 1000ull) + 2) * o->slices;
  s->v = malloc((size_t)o->timers * s->cap * sizeof(*s->v));
  s->n = calloc(o->timers, sizeof(*s->n));
  s->late = malloc(LATE_CAP * sizeof(*s->late));
  if (!s->v || !s->n || !s->late)
    die("samples", -ENOMEM);
  /* Faulted in now, not by the samples: timer i's samples are a row of
   * cap, and all rows cross a page boundary at about the same sample, so
   * untouched rows would make a burst of ~timers page faults in each
   * slice, milliseconds that belong to the benchmark and not to what it
   * measures; the peers fault theirs in first too. */
  bench_prefault(s->v, (size_t)o->timers * s->cap * sizeof(*s->v));
  bench_prefault(s->late, LATE_CAP * sizeof(*s->late));
}

/* The next slice's window: deadlines from t0 + warm-up, one slice long. */
static void samples_window(struct samples *s, const struct opts *o,
                           uint64_t t0) {
  s->from = t0 + WARMUP_NS;
  s->to = s->from + (uint64_t)(o->seconds * 1e9 / o->slices);
}

/* Records a sample of timer i; false if its deadline is not in the window. */
static inline bool record(struct samples *s, unsigned i, uint64_t deadline,
                          uint64_t now) {
  if (deadline < s->from || deadline >= s->to)
    return false;
  if (s->n[i] < s->cap)
    s->v[i * s->cap + s->n[i]++] = (int64_t)(now - deadline);
  if (now - deadline > LATE_NS) {
    size_t k = atomic_fetch_add_explicit(&s->nlate, 1, memory_order_relaxed);
    if (k < LATE_CAP)
      s->late[k] = (struct late){now, deadline};
  }
  return true;
}

static int cmp_fired(const void *a, const void *b) {
  uint64_t x = ((const struct late *)a)->fired,
           y = ((const struct late *)b)->fired;
  return x < y ? -1 : x > y;
}

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The episodes among s's late samples (see the top of this file). */
static void episodes(struct samples *s, unsigned timers, struct result *r) {
  size_t n = atomic_load(&s->nlate);
  if (n > LATE_CAP)
    n = LATE_CAP;
  qsort(s->late, n, sizeof(*s->late), cmp_fired);
  double *ex = malloc((n / (timers / 2 + 1) + 1) * sizeof(*ex));
  if (!ex)
    die("episodes", -ENOMEM);
  unsigned ne = 0;
  for (size_t a = 0, b; a < n; a = b) {
    uint64_t lo = s->late[a].deadline, worst = 0;
    for (b = a; b < n && (b == a || s->late[b].fired - s->late[b - 1].fired <
                                        EPISODE_GAP_NS);
         b++) {
      if (s->late[b].deadline < lo)
        lo = s->late[b].deadline;
      if (s->late[b].fired - s->late[b].deadline > worst)
        worst = s->late[b].fired - s->late[b].deadline;
    }
    if (b - a >= timers / 2 + 1 || (timers < 2 && b > a))
      ex[ne++] = ((double)worst - (double)(s->late[a].fired - lo)) / 1e3;
  }
  qsort(ex, ne, sizeof(*ex), cmp_dbl);
  r->episodes = ne;
  r->ex_p50 = ne ? ex[ne / 2] : 0;
  r->ex_max = ne ? ex[ne - 1] : 0;
  free(ex);
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* Percentiles of all samples, in us, and CPU per second; writes their
 * tail to dist as NAME when dist is not NULL; frees them. */
static struct result summarize(struct samples *s, unsigned timers, FILE *dist,
                               const char *name) {
  struct result r = {.missed = s->missed};
  r.cpu = s->wall ? (double)s->cpu * 1e3 / (double)s->wall : 0;
  size_t n = 0;
  for (unsigned i = 0; i < timers; i++) {
    memmove(s->v + n, s->v + i * s->cap, s->n[i] * sizeof(*s->v));
    n += s->n[i];
  }
  if ((r.ok = n > 0)) {
    qsort(s->v, n, sizeof(*s->v), cmp_i64);
    r.p50 = s->v[n / 2] / 1e3;
    r.p99 = s->v[(n * 99) / 100] / 1e3;
    r.max = s->v[n - 1] / 1e3;
    if (dist)
      bench_write_tail(dist, name, s->v, n);
  }
  r.n = n;
  episodes(s, timers, &r);
  free(s->v);
  free(s->n);
  free(s->late);
  return r;
}

/* ---- weft ---- */

static struct samples *wsamples;
static uint64_t wperiod;
static atomic_bool stop;

struct wtimer {
  weft_timer *t;
  weft_strand *s;
  uint64_t first, k, missed;
  unsigned i;
};

static void on_timer(void *arg, int status, uint64_t missed) {
  uint64_t now = weft_now_ns();
  struct wtimer *w = arg;
  if (status)
    return;
  w->k += missed;
  if (record(wsamples, w->i, w->first + w->k++ * wperiod, now))
    w->missed += missed;
}

static void busy(void *arg) {
  uint64_t end = now_ns() + 1000;
  while (now_ns() < end)
    ;
  int r = atomic_load_explicit(&stop, memory_order_relaxed)
              ? 0
              : weft_post(arg, busy, arg);
  if (r && r != -ESHUTDOWN)
    die("weft_post", r);
}

static void blocked(void *arg) {
  (void)arg;
  while (!atomic_load(&stop))
    usleep(1000);
}

/* weft's counters over all slices, for stderr. */
static unsigned long long wst_fired, wst_parks, wst_steals, wst_stalls,
    wst_handoffs;
static unsigned wst_threads;

/* One slice of weft into *ws: a fresh runtime, its timers and strands. */
static void run_weft(const struct opts *o, struct samples *ws) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = o->threads;
  if (!o->spin)
    cfg.flags |= WEFT_CONFIG_NO_TIMER_SPIN;
  weft_rt *rt;
  weft_strand *s;
  int r = weft_rt_create(&rt, &cfg);
  if (r)
    die("weft_rt_create", r);
  wperiod = o->period_us * 1000ull;
  wsamples = ws;
  atomic_store(&stop, false);
  struct wtimer *w = calloc(o->timers, sizeof(*w));
  if (!w)
    die("calloc", -ENOMEM);
  for (unsigned i = 0; i < o->timers; i++)
    if ((r = weft_strand_create(rt, &w[i].s)) ||
        (r = weft_timer_create(rt, w[i].s, &w[i].t)))
      die("create", r);
  for (unsigned i = 0; i < o->busy + o->blocked; i++)
    if ((r = weft_strand_create(rt, &s)) ||
        (r = weft_post(s, i < o->busy ? busy : blocked, s)))
      die("post", r);
  uint64_t t0 = now_ns() + LEAD_NS;
  samples_window(ws, o, t0);
  for (unsigned i = 0; i < o->timers; i++) {
    w[i].i = i;
    w[i].first = first_deadline(o, t0, i);
    if ((r = weft_timer_start_at(w[i].t, w[i].first, wperiod, on_timer, &w[i])))
      die("weft_timer_start_at", r);
  }
  sample_window(ws);
  sleep_until(ws->to + LEAD_NS);
  atomic_store(&stop, true);
  weft_stats st;
  weft_rt_stats(rt, &st);
  wst_fired += st.total.timers_fired;
  wst_parks += st.total.parks;
  wst_steals += st.total.steals;
  wst_stalls += st.total.stalls;
  wst_handoffs += st.total.handoffs;
  if (st.threads > wst_threads)
    wst_threads = st.threads;
  /* The strands are left to weft_rt_destroy, which frees them. */
  for (unsigned i = 0; i < o->timers; i++)
    weft_timer_destroy(w[i].t);
  if ((r = weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN)))
    die("weft_rt_shutdown", r);
  weft_rt_destroy(rt);
  for (unsigned i = 0; i < o->timers; i++)
    ws->missed += w[i].missed;
  free(w);
}

/* ---- kernel floor ---- */

struct floor_arg {
  const struct opts *o;
  struct samples *s;
  uint64_t t0;
  unsigned j, nt;
  bool tfd;
  uint64_t missed; /* out: periods skipped in the window */
};

static void *floor_thread(void *p) {
  struct floor_arg *a = p;
  const struct opts *o = a->o;
  const uint64_t period = o->period_us * 1000ull;
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  /* Timers j, j + nt, j + 2 nt ...: a ring in deadline order. */
  unsigned n = (o->timers - a->j + a->nt - 1) / a->nt, c = 0;
  uint64_t *next = malloc(n * sizeof(*next));
  if (!next)
    die("malloc", -ENOMEM);
  for (unsigned m = 0; m < n; m++)
    next[m] = first_deadline(o, a->t0, a->j + m * a->nt);
  struct epoll_event ev = {.events = EPOLLIN};
  int fd = a->tfd ? timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC) : -1;
  int ep = a->tfd ? epoll_create1(EPOLL_CLOEXEC) : -1;
  if (a->tfd && (fd < 0 || ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev)))
    die("timerfd/epoll", -errno);
  for (uint64_t d; (d = next[c]) < a->s->to;) {
    uint64_t t = now_ns(), x;
    if (t < d && !a->tfd) {
      sleep_until(d);
      t = now_ns();
    } else if (t < d) {
      struct itimerspec its = {
          .it_value = {(time_t)(d / 1000000000u), (long)(d % 1000000000u)}};
      timerfd_settime(fd, TFD_TIMER_ABSTIME, &its, NULL);
      while (epoll_wait(ep, &ev, 1, -1) < 0 && errno == EINTR)
        ;
      if (read(fd, &x, sizeof(x)) < 0)
        die("read timerfd", -errno);
      t = now_ns();
    }
    /* weft's rule for a periodic timer that comes late: the periods that
     * passed unfired are skipped, not fired in a burst. */
    uint64_t skip = t > d ? (t - d) / period : 0;
    if (record(a->s, a->j + c * a->nt, d, t))
      a->missed += skip;
    next[c] = d + (skip + 1) * period;
    c = c + 1 == n ? 0 : c + 1;
  }
  close(fd); /* -1 without tfd: harmless */
  close(ep);
  free(next);
  return NULL;
}

/* One slice of the floor into *s (tfd: the timerfd variant). */
static void run_floor(const struct opts *o, bool tfd, struct samples *s) {
  unsigned nt = o->threads < o->timers ? o->threads : o->timers;
  pthread_t th[WEFT_MAX_WORKERS];
  struct floor_arg a[WEFT_MAX_WORKERS];
  uint64_t t0 = now_ns() + LEAD_NS;
  samples_window(s, o, t0);
  for (unsigned j = 0; j < nt; j++) {
    a[j] = (struct floor_arg){o, s, t0, j, nt, tfd, 0};
    if (pthread_create(&th[j], NULL, floor_thread, &a[j]))
      die("pthread_create", -EAGAIN);
  }
  sample_window(s);
  for (unsigned j = 0; j < nt; j++) {
    pthread_join(th[j], NULL);
    s->missed += a[j].missed;
  }
}

/* ---- vCPU stall probe ---- */

struct probe {
  double secs;
  unsigned cpu;
  bool rt;               /* out: SCHED_FIFO granted */
  uint64_t max, stalled; /* out: worst oversleep, sum of time past 0.5 ms */
};

#define PROBE_TICK_NS 1000000ull
#define PROBE_LATE_NS 500000ull

static void *probe_thread(void *p) {
  struct probe *a = p;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(a->cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  struct sched_param sp = {.sched_priority =
                               sched_get_priority_min(SCHED_FIFO)};
  a->rt = pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp) == 0;
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  uint64_t next = now_ns(), end = next + (uint64_t)(a->secs * 1e9);
  while ((next += PROBE_TICK_NS) < end) {
    sleep_until(next);
    uint64_t late = now_ns() - next;
    if (late > a->max)
      a->max = late;
    if (late > PROBE_LATE_NS)
      a->stalled += late - PROBE_LATE_NS;
    /* A stall of several ticks counts once: start again from now. */
    if (late > PROBE_TICK_NS)
      next = now_ns();
  }
  return NULL;
}

/* Worst vCPU stall over all CPUs, in us; stall time in ms per second. */
static void run_probe(const struct opts *o, double *max_us, double *ms_per_s,
                      bool *rt) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  unsigned nc = n <= 0 ? 1 : n > 64 ? 64 : (unsigned)n;
  pthread_t th[64];
  struct probe a[64];
  *max_us = *ms_per_s = 0;
  *rt = true;
  for (unsigned c = 0; c < nc; c++) {
    a[c] = (struct probe){.secs = o->seconds, .cpu = c};
    if (pthread_create(&th[c], NULL, probe_thread, &a[c]))
      die("pthread_create", -EAGAIN);
  }
  for (unsigned c = 0; c < nc; c++) {
    pthread_join(th[c], NULL);
    if (a[c].max / 1e3 > *max_us)
      *max_us = a[c].max / 1e3;
    *ms_per_s += a[c].stalled / 1e6 / o->seconds / nc;
    *rt = *rt && a[c].rt;
  }
}

/* ---- peers ---- */

/* Runs build/bench/peers/NAME with the same flags; reads its last line. */
static struct result run_peer(const struct opts *o, const char *name) {
  struct result r = {.ok = false};
  char path[4096], v[6][32];
  if (!bench_peer_path(name, path, sizeof(path)))
    return r;
  unsigned u[6] = {o->timers, o->period_us, o->threads, o->busy, o->blocked, 0};
  for (int i = 0; i < 5; i++)
    snprintf(v[i], sizeof(v[i]), "%u", u[i]);
  snprintf(v[5], sizeof(v[5]), "%g", o->seconds);
  char *argv[] = {path, "--timers", v[0], "--period-us", v[1], "--threads",
                  v[2], "--busy",   v[3], "--blocked",   v[4], "--seconds",
                  v[5], NULL,       NULL, NULL};
  if (o->dist) {
    argv[13] = "--dist";
    argv[14] = (char *)o->dist;
  }
  char *out = bench_capture(argv);
  if (!out)
    return r;
  const char *line = bench_last_line(out);
  const char *keys[5] = {"p50_us", "p99_us", "max_us", "samples", "missed"};
  double x[5] = {0};
  for (int i = 0; i < 5; i++)
    bench_json_num(line, keys[i], &x[i]);
  if (strstr(line, "\"p99_us\":"))
    r = (struct result){.p50 = x[0],
                        .p99 = x[1],
                        .max = x[2],
                        .n = (unsigned long long)x[3],
                        .missed = (unsigned long long)x[4],
                        .ok = true};
  free(out);
  return r;
}

/* ---- main ---- */

static void usage(void) {
  fprintf(stderr, "usage: timer_lateness [--timers T] [--period-us P] "
                  "[--seconds S] [--threads N] [--busy K] [--blocked K] "
                  "[--slices N] [--no-peer] [--no-spin] [--no-probe] "
                  "[--dist FILE]\n");
  exit(2);
}

static unsigned num(const char *v, unsigned lo, unsigned hi) {
  char *end;
  unsigned long x = strtoul(v, &end, 10);
  if (!*v || *v == '-' || *end || x < lo || x > hi)
    usage();
  return (unsigned)x;
}

static void parse(int argc, char **argv, struct opts *o) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
    char *end;
    bool flag = !strcmp(a, "--no-peer") || !strcmp(a, "--no-spin") ||
                !strcmp(a, "--no-probe");
    i += !flag; /* the others take a value */
    if (!strcmp(a, "--no-peer"))
      o->peers = false;
    else if (!strcmp(a, "--no-probe"))
      o->probe = false;
    else if (!strcmp(a, "--no-spin"))
      o->spin = false;
    else if (!strcmp(a, "--timers"))
      o->timers = num(v, 1, 1000000);
    else if (!strcmp(a, "--period-us"))
      o->period_us = num(v, 10, 10000000);
    else if (!strcmp(a, "--threads"))
      o->threads = num(v, 1, WEFT_MAX_WORKERS);
    else if (!strcmp(a, "--busy"))
      o->busy = num(v, 0, 1024);
    else if (!strcmp(a, "--blocked"))
      o->blocked = num(v, 0, 64);
    else if (!strcmp(a, "--slices"))
      o->slices = num(v, 1, 100);
    else if (!strcmp(a, "--dist") && *v)
      o->dist = v;
    else if (strcmp(a, "--seconds") || (o->seconds = strtod(v, &end), *end) ||
             !(o->seconds >= 0.1 && o->seconds <= 600))
      usage();
  }
  if (o->seconds / o->slices < 0.1) {
    fprintf(stderr, "timer_lateness: slices shorter than 0.1 s\n");
    exit(2);
  }
  if (o->timers * (o->seconds * 1e3 / o->period_us + 2.0 * o->slices) > 2e8) {
    fprintf(stderr, "timer_lateness: more than 2e8 samples\n");
    exit(2);
  }
}

/* Prints r as a table row and appends it to the JSON line in js. */
static char js[4096];
static void emit(const char *name, const char *prefix, const struct result *r) {
  printf("%-16s %10.2f %10.2f %10.2f %10llu %8llu %8.0f", name, r->p50, r->p99,
         r->max, r->n, r->missed, r->cpu);
  if (r->cpu > 0) /* ours, not a peer's: its episodes were counted */
    printf(" %8u %10.2f", r->episodes, r->ex_max);
  printf("\n");
  size_t l = strlen(js);
  snprintf(js + l, sizeof(js) - l,
           ",\"%sp50_us\":%.2f,\"%sp99_us\":%.2f,\"%smax_us\":%.2f,"
           "\"%ssamples\":%llu,\"%smissed\":%llu",
           prefix, r->p50, prefix, r->p99, prefix, r->max, prefix, r->n, prefix,
           r->missed);
  if (r->cpu > 0) {
    l = strlen(js);
    snprintf(js + l, sizeof(js) - l, ",\"%scpu_ms_per_s\":%.0f", prefix,
             r->cpu);
    l = strlen(js);
    snprintf(js + l, sizeof(js) - l,
             ",\"%sepisodes\":%u,\"%sepisode_excess_p50_us\":%.2f,"
             "\"%sepisode_excess_max_us\":%.2f",
             prefix, r->episodes, prefix, r->ex_p50, prefix, r->ex_max);
  }
}

int main(int argc, char **argv) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  struct opts o = {
      1000, 1000, cpus > 0 ? (unsigned)cpus : 1, 0, 0, 6, 3, true, true,
      true, NULL};
  parse(argc, argv, &o);
  struct samples sw, sa, sb;
  samples_init(&sw, &o);
  samples_init(&sa, &o);
  samples_init(&sb, &o);
  /* Slice k runs the three in the order rotated by k. */
  for (unsigned k = 0; k < o.slices; k++)
    for (unsigned v = 0; v < 3; v++)
      switch ((k + v) % 3) {
      case 0:
        run_weft(&o, &sw);
        break;
      case 1:
        run_floor(&o, false, &sa);
        break;
      default:
        run_floor(&o, true, &sb);
      }
  fprintf(stderr,
          "weft: timers_fired %llu parks %llu steals %llu stalls %llu "
          "handoffs %llu threads %u (%u slices)\n",
          wst_fired, wst_parks, wst_steals, wst_stalls, wst_handoffs,
          wst_threads, o.slices);
  FILE *dist = o.dist ? fopen(o.dist, "w") : NULL;
  if (o.dist && !dist)
    die(o.dist, -errno);
  struct result w = summarize(&sw, o.timers, dist, "weft"), pa = {0}, pu = {0};
  struct result fa = summarize(&sa, o.timers, dist, "floor_nanosleep");
  struct result fb = summarize(&sb, o.timers, dist, "floor_timerfd");
  if (dist && fclose(dist))
    die(o.dist, -errno);
  const struct result *f = fb.ok && (!fa.ok || fb.p99 < fa.p99) ? &fb : &fa;
  double stall_max = 0, stall_ms = 0;
  bool stall_rt = false;
  if (o.probe)
    run_probe(&o, &stall_max, &stall_ms, &stall_rt);
  if (o.peers) {
    pa = run_peer(&o, "asio_timer_lateness");
    pu = run_peer(&o, "uv_timer_lateness");
  }
  printf("timer_lateness: %u timers, period %u us, %g s in %u slices, %u "
         "threads, busy %u, blocked %u%s; lateness in us, process CPU in ms "
         "per s\n"
         "%-16s %10s %10s %10s %10s %8s %8s %8s %10s\n",
         o.timers, o.period_us, o.seconds, o.slices, o.threads, o.busy,
         o.blocked, o.spin ? "" : ", no spin", "", "p50", "p99", "max",
         "samples", "missed", "cpu", "episodes", "excess max");
  emit("weft", "", &w);
  size_t l = strlen(js);
  snprintf(js + l, sizeof(js) - l,
           ",\"floor_p50_us\":%.2f,\"floor_p99_us\":%.2f,\"floor_max_us\":"
           "%.2f,\"floor_variant\":\"%s\",\"p99_vs_floor\":%.3f",
           f->p50, f->p99, f->max, f == &fb ? "timerfd" : "nanosleep",
           f->p99 > 0 ? w.p99 / f->p99 : 0);
  emit("floor nanosleep", "floor_nanosleep_", &fa);
  emit("floor timerfd", "floor_timerfd_", &fb);
  if (o.probe) {
    printf("%-16s %10s %10s %10.2f   (%.2f ms/s stalled%s)\n", "vcpu stall", "",
           "", stall_max, stall_ms, stall_rt ? "" : ", not SCHED_FIFO");
    l = strlen(js);
    snprintf(js + l, sizeof(js) - l,
             ",\"vcpu_stall_max_us\":%.2f,\"vcpu_stall_ms_per_s\":%.3f,"
             "\"vcpu_stall_rt\":%s",
             stall_max, stall_ms, stall_rt ? "true" : "false");
  }
  const char *names[2] = {"asio", "uv"};
  struct result *p[2] = {&pa, &pu};
  for (int i = 0; i < 2; i++) {
    char pre[8];
    snprintf(pre, sizeof(pre), "%s_", names[i]);
    if (!p[i]->ok) {
      printf("%-16s %10s\n", names[i], "-");
      continue;
    }
    emit(names[i], pre, p[i]);
    l = strlen(js);
    snprintf(js + l, sizeof(js) - l, ",\"p99_vs_%s\":%.3f", names[i],
             p[i]->p99 > 0 ? w.p99 / p[i]->p99 : 0);
  }
  printf("{\"bench\":\"timer_lateness\",\"timers\":%u,\"period_us\":%u,"
         "\"seconds\":%g,\"slices\":%u,\"threads\":%u,\"busy\":%u,"
         "\"blocked\":%u,\"spin\":%s%s}\n",
         o.timers, o.period_us, o.seconds, o.slices, o.threads, o.busy,
         o.blocked, o.spin ? "true" : "false", js);
  return 0;
}

/*
 * startup - what a whole runtime life costs with many threads.
 *
 * One cycle: weft_rt_create with --threads workers (default 64), one
 * weft_post_rt handler posted and waited for (the waiting thread sleeps on
 * a condition variable), weft_rt_shutdown(WEFT_SHUTDOWN_DRAIN),
 * weft_rt_destroy. One untimed cycle first, then --repeat timed ones.
 *
 *  ms_per_cycle:     wall time / repeat.
 *  cpu_ms_per_cycle: getrusage(RUSAGE_SELF) user + system over the timed
 *                    cycles / repeat (all threads, the joined ones too).
 *                    weft_config.eager_workers is left at its default
 *                    (one thread per CPU; the other shards' threads start
 *                    when first needed, which here is never).
 *  eager_*:          the same with eager_workers = --threads: every
 *                    shard's thread started by weft_rt_create, as Asio's
 *                    are; what a runtime costs once all its threads run.
 *  pinned_*:         the same as the first in a child (this program re-executed
 * with a hidden --child-pinned flag) that first of all pins itself to CPU 0
 * with sched_setaffinity, so all the threads share one CPU: whoever waits by
 * spinning shows up here as time, not just CPU.
 *
 * CPU above wall time on one CPU is impossible; with several CPUs, threads
 * created and exiting in parallel put CPU above wall time by themselves
 * (the floor below shows how much), so only the pinned figures tell
 * whether anybody spins.
 *
 * The same cycles run on Asio (build/bench/peers/asio_startup, normal and
 * --pin) when it was built; ratios are weft / asio (below 1: weft cheaper).
 *
 *  floor_*:          no runtime at all: --threads bare pthreads that each
 *                    wait on a futex word, woken together and joined. With
 *                    512 KiB stacks (weft's default, weft_config.stack_size)
 *                    and with glibc's default stack (8 MiB; what Asio's
 *                    threads get): what the kernel and glibc charge for the
 *                    threads alone, measured in the same rounds.
 *
 * The four set-ups (weft, weft pinned, asio, asio pinned) take turns for
 * --rounds rounds of --repeat cycles each; every figure is the median over
 * the rounds, so that a noisy spell of a shared machine does not land on
 * one set-up only.
 *   build/bench/startup [--threads 64] [--repeat 20] [--rounds 5] [--no-peer]
 * The last line is one JSON object.
 */
#include <weft.h>

#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "benchutil.h"

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t cpu_ns(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) *
             1000000000u +
         ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) *
             1000u;
}

static void check(int r, const char *what) {
  if (r) {
    fprintf(stderr, "startup: %s: %s\n", what, weft_strerror(r));
    exit(1);
  }
}

struct flag {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  bool set;
};

static void signal_flag(void *arg) {
  struct flag *f = arg;
  pthread_mutex_lock(&f->lock);
  f->set = true;
  pthread_cond_signal(&f->cond);
  pthread_mutex_unlock(&f->lock);
}

static unsigned eager; /* weft_config.eager_workers; 0: the default */

static void cycle(unsigned threads) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = threads;
  cfg.eager_workers = eager;
  weft_rt *rt;
  check(weft_rt_create(&rt, &cfg), "weft_rt_create");
  struct flag f = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false};
  check(weft_post_rt(rt, signal_flag, &f), "weft_post_rt");
  pthread_mutex_lock(&f.lock);
  while (!f.set)
    pthread_cond_wait(&f.cond, &f.lock);
  pthread_mutex_unlock(&f.lock);
  check(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), "weft_rt_shutdown");
  check(weft_rt_destroy(rt), "weft_rt_destroy");
  pthread_mutex_destroy(&f.lock);
  pthread_cond_destroy(&f.cond);
}

/* The floor: bare threads waiting on a futex word, woken and joined. */
static _Atomic uint32_t floor_go;

static void *floor_thread(void *arg) {
  (void)arg;
  while (!atomic_load(&floor_go))
    syscall(SYS_futex, &floor_go, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
  return NULL;
}

static size_t floor_stack; /* 0: glibc's default */

static void floor_cycle(unsigned threads) {
  pthread_attr_t a;
  pthread_attr_init(&a);
  if (floor_stack && pthread_attr_setstacksize(&a, floor_stack))
    check(-22, "pthread_attr_setstacksize");
  pthread_t t[WEFT_MAX_WORKERS];
  atomic_store(&floor_go, 0);
  for (unsigned i = 0; i < threads; i++)
    if (pthread_create(&t[i], &a, floor_thread, NULL))
      check(-11, "pthread_create");
  atomic_store(&floor_go, 1);
  syscall(SYS_futex, &floor_go, FUTEX_WAKE_PRIVATE, 1 << 30, NULL, NULL, 0);
  for (unsigned i = 0; i < threads; i++)
    pthread_join(t[i], NULL);
  pthread_attr_destroy(&a);
}

/* Wall and CPU ms per cycle of fn. */
static void measure_fn(void (*fn)(unsigned), unsigned threads, int repeat,
                       double *ms, double *cpu_ms) {
  fn(threads); /* untimed: first-use costs of the process */
  uint64_t c0 = cpu_ns(), t0 = mono_ns();
  for (int i = 0; i < repeat; i++)
    fn(threads);
  uint64_t t1 = mono_ns(), c1 = cpu_ns();
  *ms = (double)(t1 - t0) / 1e6 / repeat;
  *cpu_ms = (double)(c1 - c0) / 1e6 / repeat;
}

static void measure(unsigned threads, int repeat, double *ms, double *cpu_ms) {
  measure_fn(cycle, threads, repeat, ms, cpu_ms);
}

static int pin_cpu0(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(0, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    perror("startup: sched_setaffinity(CPU 0)");
    return -1;
  }
  return 0;
}

/* Runs `prog` (this program or the peer) and reads its two figures. */
static bool run_child(const char *prog, bool self, bool pin, unsigned threads,
                      int repeat, double *ms, double *cpu_ms) {
  char a_th[16], a_rep[16];
  snprintf(a_th, sizeof(a_th), "%u", threads);
  snprintf(a_rep, sizeof(a_rep), "%d", repeat);
  char *argv[8];
  int n = 0;
  argv[n++] = (char *)prog;
  if (self)
    argv[n++] = "--child-pinned";
  else if (pin)
    argv[n++] = "--pin";
  argv[n++] = "--threads";
  argv[n++] = a_th;
  argv[n++] = "--repeat";
  argv[n++] = a_rep;
  argv[n] = NULL;
  char *out = bench_capture(argv);
  if (!out)
    return false;
  bool ok = bench_json_num(out, "ms_per_cycle", ms) &&
            bench_json_num(out, "cpu_ms_per_cycle", cpu_ms);
  free(out);
  return ok;
}

/* Median of v[0..n), and its smallest and largest values. */
static double median(const double *v, int n, double *lo, double *hi) {
  double s[64];
  memcpy(s, v, (size_t)n * sizeof(*v));
  double m = bench_median(s, n);
  *lo = s[0];
  *hi = s[n - 1];
  return m;
}

enum {
  W_MS,
  W_CPU,
  WE_MS,
  WE_CPU,
  WP_MS,
  WP_CPU,
  F_MS,
  F_CPU,
  FD_MS,
  FD_CPU,
  A_MS,
  A_CPU,
  AP_MS,
  AP_CPU,
  NFIG
};

/* One table row: set-up f's wall figure at f, its CPU figure at f + 1. */
static void row(const char *label, const double *med, const double *lo,
                const double *hi, int f) {
  printf("%-28s %.3f ms/cycle (%.3f..%.3f), CPU %.3f ms (%.3f..%.3f)\n", label,
         med[f], lo[f], hi[f], med[f + 1], lo[f + 1], hi[f + 1]);
}

int main(int argc, char **argv) {
  unsigned threads = 64;
  int repeat = 20, rounds = 5;
  bool peer = true, child_pinned = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = (unsigned)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--repeat") && i + 1 < argc)
      repeat = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
      rounds = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--no-peer"))
      peer = false;
    else if (!strcmp(argv[i], "--child-pinned"))
      child_pinned = true;
    else {
      fprintf(stderr, "usage: startup [--threads N] [--repeat R] "
                      "[--rounds K] [--no-peer]\n");
      return 2;
    }
  }
  if (threads < 1 || threads > WEFT_MAX_WORKERS || repeat < 1 || rounds < 1 ||
      rounds > 64) {
    fprintf(stderr,
            "startup: --threads 1..%d, --repeat >= 1, --rounds "
            "1..64\n",
            WEFT_MAX_WORKERS);
    return 2;
  }
  if (child_pinned) {
    if (pin_cpu0() != 0)
      return 1;
    double ms, cpu;
    measure(threads, repeat, &ms, &cpu);
    printf("{\"ms_per_cycle\":%.4f,\"cpu_ms_per_cycle\":%.4f}\n", ms, cpu);
    return 0;
  }

  char pbuf[4096];
  const char *ppath =
      peer ? bench_peer_path("asio_startup", pbuf, sizeof(pbuf)) : NULL;
  bool have = ppath != NULL;
  double fig[NFIG][64];
  /* The four set-ups take turns, round after round, so that a noisy spell
   * of the machine lands on all of them rather than on one; each figure is
   * the median over the rounds of that round's mean per cycle. */
  for (int r = 0; r < rounds; r++) {
    measure(threads, repeat, &fig[W_MS][r], &fig[W_CPU][r]);
    eager = threads;
    measure(threads, repeat, &fig[WE_MS][r], &fig[WE_CPU][r]);
    eager = 0;
    floor_stack = (size_t)512 * 1024;
    measure_fn(floor_cycle, threads, repeat, &fig[F_MS][r], &fig[F_CPU][r]);
    floor_stack = 0;
    measure_fn(floor_cycle, threads, repeat, &fig[FD_MS][r], &fig[FD_CPU][r]);
    if (!run_child("/proc/self/exe", true, true, threads, repeat,
                   &fig[WP_MS][r], &fig[WP_CPU][r])) {
      fprintf(stderr, "startup: pinned child failed\n");
      return 1;
    }
    if (have && !(run_child(ppath, false, false, threads, repeat, &fig[A_MS][r],
                            &fig[A_CPU][r]) &&
                  run_child(ppath, false, true, threads, repeat, &fig[AP_MS][r],
                            &fig[AP_CPU][r]))) {
      fprintf(stderr, "startup: %s failed; no peer figures\n", ppath);
      have = false;
    }
  }
  double med[NFIG], lo[NFIG], hi[NFIG];
  for (int f = 0; f < NFIG; f++)
    if (f < A_MS || have)
      med[f] = median(fig[f], rounds, &lo[f], &hi[f]);

  char label[64];
  snprintf(label, sizeof(label), "weft, %u threads:", threads);
  row(label, med, lo, hi, W_MS);
  row("  all started at create:", med, lo, hi, WE_MS);
  row("  pinned to CPU 0:", med, lo, hi, WP_MS);
  snprintf(label, sizeof(label), "floor, %u threads, 512 KiB:", threads);
  row(label, med, lo, hi, F_MS);
  row("  glibc's 8 MiB stacks:", med, lo, hi, FD_MS);
  if (have) {
    snprintf(label, sizeof(label), "asio, %u threads:", threads);
    row(label, med, lo, hi, A_MS);
    row("  pinned to CPU 0:", med, lo, hi, AP_MS);
  }
  printf("(medians over %d rounds of %d cycles, min..max in brackets)\n",
         rounds, repeat);
  if (med[WP_CPU] > med[WP_MS] * 1.05)
    printf("note: pinned to one CPU, weft's CPU per cycle exceeds its wall "
           "time: threads burn CPU while they wait\n");
  printf("{\"bench\":\"startup\",\"threads\":%u,\"repeat\":%d,\"rounds\":%d,"
         "\"ms_per_cycle\":%.4f,\"cpu_ms_per_cycle\":%.4f,"
         "\"pinned_ms_per_cycle\":%.4f,\"pinned_cpu_ms_per_cycle\":%.4f",
         threads, repeat, rounds, med[W_MS], med[W_CPU], med[WP_MS],
         med[WP_CPU]);
  printf(",\"eager_ms_per_cycle\":%.4f,\"eager_cpu_ms_per_cycle\":%.4f",
         med[WE_MS], med[WE_CPU]);
  printf(",\"floor_ms_per_cycle\":%.4f,\"floor_cpu_ms_per_cycle\":%.4f,"
         "\"floor_default_stack_ms_per_cycle\":%.4f,"
         "\"floor_default_stack_cpu_ms_per_cycle\":%.4f,"
         "\"ms_vs_floor\":%.3f,\"cpu_vs_floor\":%.3f",
         med[F_MS], med[F_CPU], med[FD_MS], med[FD_CPU], med[W_MS] / med[F_MS],
         med[W_CPU] / med[F_CPU]);
  if (have)
    printf(",\"asio_ms_per_cycle\":%.4f,\"asio_cpu_ms_per_cycle\":%.4f,"
           "\"asio_pinned_ms_per_cycle\":%.4f,"
           "\"asio_pinned_cpu_ms_per_cycle\":%.4f,"
           "\"ms_ratio\":%.3f,\"cpu_ratio\":%.3f,"
           "\"pinned_ms_ratio\":%.3f,\"pinned_cpu_ratio\":%.3f,"
           "\"eager_ms_ratio\":%.3f,\"eager_cpu_ratio\":%.3f",
           med[A_MS], med[A_CPU], med[AP_MS], med[AP_CPU],
           med[W_MS] / med[A_MS], med[W_CPU] / med[A_CPU],
           med[WP_MS] / med[AP_MS], med[WP_CPU] / med[AP_CPU],
           med[WE_MS] / med[A_MS], med[WE_CPU] / med[A_CPU]);
  printf("}\n");
  return 0;
}

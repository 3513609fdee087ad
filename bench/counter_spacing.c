/*
 * counter_spacing - what the seed case's floor measures: a shared counter
 * whose cost depends on the work between its adds. No runtime.
 *
 * Each round of a thread: malloc a 16-byte piece, add to one shared
 * counter, free the last piece, then `spin` rounds of work on a local
 * variable (the stand-in for a runtime's own work per handler). Run for
 * --seconds on one thread, then on two, for spin = 0, 40, 80, 120, 160.
 * Reported per spin: ns per round on one thread, and CPU ns per round on
 * two threads (2 s of CPU per second over the rounds made): on two CPUs
 * the difference is the counter's line moving between them, which a tight
 * loop (spin 0) pays least, since a core makes several adds while it
 * holds the line. seed_strand's floor is the spin-0 loop; a runtime whose
 * handler costs as much as some spin's one-thread figure cannot beat that
 * spin's two-thread figure on the same counter (docs/design.md, "Scale").
 *
 *   build/bench/counter_spacing [--seconds S]
 *
 * Last line: {"bench":"counter_spacing","seconds":S,"rows":[{"spin":K,
 * "one_thread_ns":..,"two_threads_cpu_ns":..},...]}
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "benchutil.h"

/* On separate lines, as in seed_strand. */
static _Alignas(64) atomic_long counter;
static _Alignas(64) atomic_bool running;
static int spin;

static void *round_loop(void *arg) {
  (void)arg;
  void *last = NULL;
  volatile unsigned sink = 0;
  while (atomic_load_explicit(&running, memory_order_relaxed)) {
    void *p = malloc(16);
    if (!p) {
      fprintf(stderr, "counter_spacing: out of memory\n");
      exit(1);
    }
    atomic_fetch_add_explicit(&counter, 1, memory_order_relaxed);
    free(last);
    last = p;
    for (int i = 0; i < spin; i++)
      sink += (unsigned)i;
  }
  free(last);
  return NULL;
}

/* Rounds per second of n threads over s seconds. */
static double run(int n, int k, double s) {
  pthread_t t[2];
  spin = k;
  atomic_store(&counter, 0);
  atomic_store(&running, true);
  for (int i = 0; i < n; i++)
    if (pthread_create(&t[i], NULL, round_loop, NULL)) {
      fprintf(stderr, "counter_spacing: pthread_create failed\n");
      exit(1);
    }
  uint64_t t0 = bench_now_ns();
  long c0 = atomic_load(&counter);
  usleep((useconds_t)(s * 1e6));
  long c1 = atomic_load(&counter);
  uint64_t t1 = bench_now_ns();
  atomic_store(&running, false);
  for (int i = 0; i < n; i++)
    pthread_join(t[i], NULL);
  return (double)(c1 - c0) / ((double)(t1 - t0) / 1e9);
}

int main(int argc, char **argv) {
  double s = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--seconds") && i + 1 < argc) {
      s = atof(argv[++i]);
    } else {
      fprintf(stderr, "usage: counter_spacing [--seconds S]\n");
      return 2;
    }
  }
  if (s <= 0 || s > 60) {
    fprintf(stderr, "counter_spacing: --seconds in (0, 60]\n");
    return 2;
  }
  static const int spins[] = {0, 40, 80, 120, 160};
  enum { NSPINS = sizeof spins / sizeof spins[0] };
  double one[NSPINS], two[NSPINS];
  printf("%6s %18s %22s\n", "spin", "ns/round, 1 thread",
         "CPU ns/round, 2 threads");
  for (int k = 0; k < NSPINS; k++) {
    one[k] = 1e9 / run(1, spins[k], s);
    two[k] = 2e9 / run(2, spins[k], s);
    printf("%6d %18.1f %22.1f\n", spins[k], one[k], two[k]);
  }
  printf("{\"bench\":\"counter_spacing\",\"seconds\":%g,\"rows\":[", s);
  for (int k = 0; k < NSPINS; k++)
    printf("%s{\"spin\":%d,\"one_thread_ns\":%.1f,\"two_threads_cpu_ns\":%.1f}",
           k ? "," : "", spins[k], one[k], two[k]);
  printf("]}\n");
  return 0;
}

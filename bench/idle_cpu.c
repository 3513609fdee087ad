/*
 * idle_cpu - what an idle runtime costs: CPU time per second of a runtime
 * with nothing to do (monitor, parked workers, one spare), against an idle
 * Asio io_context run by as many threads (build/bench/peers/asio_idle_cpu),
 * and against a runtime that has just been busy (the monitor must go back
 * to sleep).
 *   build/bench/idle_cpu [--threads N] [--seconds S] [--no-peer]
 */
#include <weft.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "benchutil.h"

static double cpu_ms(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec * 1e3 + ru.ru_utime.tv_usec / 1e3 +
         ru.ru_stime.tv_sec * 1e3 + ru.ru_stime.tv_usec / 1e3;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

static void nop(void *arg) { (void)arg; }

/* CPU ms per second while idle, after `warm` posts to wake everything. */
static double measure(unsigned threads, double seconds, int warm) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = threads;
  weft_rt *rt;
  int r = weft_rt_create(&rt, &cfg);
  if (r) {
    fprintf(stderr, "idle_cpu: weft_rt_create: %s\n", weft_strerror(r));
    exit(1);
  }
  for (int i = 0; i < warm; i++)
    weft_post_rt(rt, nop, NULL);
  sleep_s(0.2); /* let it settle */
  double c0 = cpu_ms();
  sleep_s(seconds);
  double c1 = cpu_ms();
  weft_rt_destroy(rt);
  return (c1 - c0) / seconds;
}

static double run_peer(unsigned threads, double seconds) {
  char path[4096], th[16], sec[32];
  if (!bench_peer_path("asio_idle_cpu", path, sizeof(path)))
    return -1;
  snprintf(th, sizeof(th), "%u", threads);
  snprintf(sec, sizeof(sec), "%.2f", seconds);
  char *argv[] = {path, "--threads", th, "--seconds", sec, NULL};
  char *out = bench_capture(argv);
  double v = -1;
  if (out && !bench_json_num(bench_last_line(out), "cpu_ms_per_sec", &v))
    v = -1;
  free(out);
  return v;
}

int main(int argc, char **argv) {
  unsigned threads = 0;
  double seconds = 3;
  int peer = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = (unsigned)atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
      seconds = atof(argv[++i]);
    else if (!strcmp(argv[i], "--no-peer"))
      peer = 0;
    else {
      fprintf(stderr, "usage: idle_cpu [--threads N] [--seconds S] "
                      "[--no-peer]\n");
      return 2;
    }
  }
  if (!threads)
    threads = (unsigned)sysconf(_SC_NPROCESSORS_ONLN);
  if (seconds <= 0)
    seconds = 3;
  double idle = measure(threads, seconds, 0);
  double after = measure(threads, seconds, 10000);
  double asio = peer ? run_peer(threads, seconds) : -1;
  printf("weft idle: %.3f CPU ms/s (after work: %.3f); asio: %.3f\n", idle,
         after, asio);
  printf("{\"bench\":\"idle_cpu\",\"threads\":%u,\"seconds\":%.2f,"
         "\"cpu_ms_per_sec\":%.3f,\"after_work_cpu_ms_per_sec\":%.3f",
         threads, seconds, idle, after);
  if (asio >= 0)
    printf(",\"asio_cpu_ms_per_sec\":%.3f", asio);
  printf("}\n");
  return 0;
}

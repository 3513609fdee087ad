/*
 * accept_storm - a storm of short connections against a weft listener:
 * every one must be accepted and answered, none lost or stuck.
 *
 *   accept_storm [--threads N] [--clients K] [--seconds S]
 *
 * A runtime of N workers (default: one per CPU) listens on 127.0.0.1 with
 * weft's default listener: a listening socket per shard (SO_REUSEPORT), so
 * that the kernel spreads the connections over the shards and no lock is
 * shared on the accept path. Every accepted connection gets "hello\n",
 * then the server closes it. K client threads (default 4) of this program
 * connect, read the reply to EOF and close, over and over for S seconds
 * (default 2; demo_client.h).
 *
 * Prints one JSON line: the connections answered per second, those the
 * clients saw answered or failed, and those the server accepted and
 * answered (all of them should agree). examples/peers/asio_accept_storm.cpp
 * runs the same storm against Asio; tools/demo.sh runs both.
 */
#include <weft.h>

#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "demo_client.h"

#define MAX_CLIENTS 64

static atomic_ullong accepted, answered;

static void check(int r, const char *what) {
  if (r < 0) {
    fprintf(stderr, "accept_storm: %s: %s\n", what, weft_strerror(r));
    exit(1);
  }
}

/* The reply is in the kernel: close (FIN after it). A connection owns
 * nothing, so it needs no close callback. */
static void on_written(void *arg, weft_tcp *c, int status) {
  (void)arg;
  if (status == 0)
    atomic_fetch_add_explicit(&answered, 1, memory_order_relaxed);
  weft_tcp_close(c, 0);
}

static void on_accept(void *arg, weft_tcp *c) {
  (void)arg;
  atomic_fetch_add_explicit(&accepted, 1, memory_order_relaxed);
  if (weft_tcp_write(c, DC_REPLY, DC_REPLY_LEN, on_written, NULL) < 0)
    weft_tcp_close(c, 0);
}

static void usage(void) {
  fprintf(stderr, "usage: accept_storm [--threads N] [--clients K] "
                  "[--seconds S]\n");
  exit(2);
}

int main(int argc, char **argv) {
  unsigned threads = 0, clients = 4;
  double seconds = 2;
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 == argc)
      usage();
    if (!strcmp(argv[i], "--threads"))
      threads = (unsigned)dc_number(argv[i + 1], 0, WEFT_MAX_WORKERS, usage);
    else if (!strcmp(argv[i], "--clients"))
      clients = (unsigned)dc_number(argv[i + 1], 1, MAX_CLIENTS, usage);
    else if (!strcmp(argv[i], "--seconds"))
      seconds = dc_number(argv[i + 1], 0.01, 60, usage);
    else
      usage();
  }

  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = threads;
  weft_rt *rt;
  check(weft_rt_create(&rt, &cfg), "weft_rt_create");
  threads = weft_rt_workers(rt);

  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  weft_listener *l;
  unsigned alen = sizeof(a);
  check(weft_tcp_listen(rt, (struct sockaddr *)&a, sizeof(a), NULL, on_accept,
                        NULL, &l),
        "weft_tcp_listen");
  check(weft_listener_addr(l, (struct sockaddr *)&a, &alen),
        "weft_listener_addr");

  struct dc_storm storm[MAX_CLIENTS];
  pthread_t tid[MAX_CLIENTS];
  uint64_t t0 = dc_now_ns();
  for (unsigned i = 0; i < clients; i++) {
    storm[i] = (struct dc_storm){.port = ntohs(a.sin_port),
                                 .end = t0 + (uint64_t)(seconds * 1e9)};
    if (pthread_create(&tid[i], NULL, dc_storm_run, &storm[i]) != 0) {
      fprintf(stderr, "accept_storm: pthread_create failed\n");
      return 1;
    }
  }
  unsigned long long ok = 0, failed = 0;
  int first_err = 0;
  for (unsigned i = 0; i < clients; i++) {
    pthread_join(tid[i], NULL);
    ok += storm[i].answered;
    failed += storm[i].failed;
    if (!first_err)
      first_err = storm[i].first_err;
  }
  double elapsed = (double)(dc_now_ns() - t0) / 1e9;

  /* Every connection a client finished was accepted and written to before
   * its EOF; the shutdown closes what is left and waits for its
   * callbacks. */
  check(weft_listener_close(l, NULL, NULL), "weft_listener_close");
  check(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), "weft_rt_shutdown");
  check(weft_rt_destroy(rt), "weft_rt_destroy");

  printf("{\"demo\":\"accept_storm\",\"impl\":\"weft\",\"threads\":%u,"
         "\"clients\":%u,\"seconds\":%.2f,\"conns_per_sec\":%.0f,"
         "\"answered\":%llu,\"failed\":%llu,\"first_error\":\"%s\","
         "\"server_accepted\":%llu,\"server_answered\":%llu}\n",
         threads, clients, elapsed, (double)ok / elapsed, ok, failed,
         first_err ? strerror(-first_err) : "", atomic_load(&accepted),
         atomic_load(&answered));
  return 0;
}

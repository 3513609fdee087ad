/*
 * echo - a TCP echo server on weft: every byte a client sends comes back.
 *
 *   echo [--port P] [--threads N] [--host ADDR]
 *
 * Each connection has one 64 KiB buffer and at most one operation in
 * flight: read, then write what was read, then (when the write is complete)
 * read again, so a client that sends without reading is slowed by TCP
 * instead of growing memory. EOF: half-close our side too, then close.
 * Prints "listening on PORT"; SIGINT or SIGTERM stops it (exit 0).
 */
#include <weft.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "netutil.h"

#define BUF_SIZE (64 * 1024)

/* One connection; touched only on its strand. Lifetime: freed when it is
 * closing and no callback with it as arg is pending (ops == 0). ops counts
 * the read or write in flight and our close callback; one of them is always
 * pending until the end, so a close by weft_rt_shutdown still reaches us
 * (as -ECANCELED). */
struct conn {
  weft_tcp *c;
  unsigned ops;
  bool closing;
  char buf[BUF_SIZE];
};

static void on_read(void *arg, weft_tcp *c, long n);

static void conn_maybe_free(struct conn *k) {
  if (k->closing && k->ops == 0)
    free(k);
}

static void on_close(void *arg, weft_tcp *c) {
  (void)c;
  struct conn *k = arg;
  k->ops--;
  conn_maybe_free(k);
}

/* Starts closing k; the caller runs conn_maybe_free afterwards. If
 * weft_tcp_close fails (-ESHUTDOWN from outside the runtime once it
 * shut down) no close callback of ours will come: k goes when its last
 * pending callback has run. */
static void conn_close(struct conn *k) {
  if (k->closing)
    return;
  k->closing = true;
  if (weft_tcp_close(k->c, 0, on_close, k) == 0)
    k->ops++;
}

static void conn_read(struct conn *k) {
  int r = weft_tcp_read(k->c, k->buf, sizeof(k->buf), on_read, k);
  if (r == 0)
    k->ops++;
  else
    conn_close(k);
}

static void on_write(void *arg, weft_tcp *c, int status) {
  (void)c;
  struct conn *k = arg;
  k->ops--;
  if (!k->closing) {
    if (status < 0)
      conn_close(k);
    else
      conn_read(k);
  }
  conn_maybe_free(k);
}

static void on_read(void *arg, weft_tcp *c, long n) {
  struct conn *k = arg;
  k->ops--;
  if (k->closing) {
    conn_maybe_free(k);
    return;
  }
  if (n > 0) {
    if (weft_tcp_write(c, k->buf, (size_t)n, on_write, k) == 0)
      k->ops++;
    else
      conn_close(k);
  } else {
    /* EOF: nothing of ours is queued (we only read when the last write
     * completed), so the FIN goes out at once; errors just close. */
    if (n == 0)
      weft_tcp_shutdown(c);
    conn_close(k);
  }
  conn_maybe_free(k);
}

static void on_accept(void *arg, weft_tcp *c) {
  (void)arg;
  struct conn *k = malloc(sizeof(*k));
  if (!k) {
    weft_tcp_close(c, 1, ex_on_close_noop, NULL);
    return;
  }
  k->c = c;
  k->ops = 0;
  k->closing = false;
  weft_tcp_nodelay(c, 1);
  conn_read(k);
  conn_maybe_free(k);
}

static void usage(void) {
  fprintf(stderr, "usage: echo [--port P] [--threads N] [--host ADDR]\n");
  exit(1);
}

int main(int argc, char **argv) {
  struct ex_opts o;
  ex_opts_init(&o);
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc || ex_common_opt(&o, argv[i], argv[i + 1]) != 1)
      usage();
  }
  sigset_t sigs;
  ex_block_signals(&sigs);
  weft_rt *rt = ex_rt_create("echo", &o);
  weft_listener *l = ex_listen("echo", rt, &o, on_accept, NULL);
  ex_wait_signal(&sigs);
  return ex_stop("echo", rt, l);
}

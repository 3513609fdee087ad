/*
 * echo - an echo server on weft: every byte a client sends comes back.
 *
 *   echo [--port P] [--threads N] [--host ADDR] [--unix PATH]
 *
 * Over TCP, or over a Unix domain socket with --unix (a path, or "@name"
 * in the abstract namespace): the same code serves both.
 * Each connection has one 64 KiB buffer and at most one operation in
 * flight: read, then write what was read, then (when the write is complete)
 * read again, so a client that sends without reading is slowed by TCP
 * instead of growing memory. EOF: half-close our side too, then close.
 * Per-connection state is freed in the close callback.
 * Prints "listening on PORT" (or PATH); SIGINT or SIGTERM stops it (exit
 * 0).
 */
#include <weft.h>

#include <stdio.h>
#include <stdlib.h>

#include "netutil.h"

#define BUF_SIZE (64 * 1024)

/* One connection; touched only on its strand, freed in its close
 * callback. */
struct conn {
  char buf[BUF_SIZE];
};

static void on_read(void *arg, weft_tcp *c, long n);

static void conn_free(void *data, weft_tcp *c) {
  (void)c;
  free(data);
}

static void on_write(void *arg, weft_tcp *c, int status) {
  struct conn *k = arg;
  if (status < 0 || weft_tcp_read(c, k->buf, sizeof(k->buf), on_read, k) < 0)
    weft_tcp_close(c, 0);
}

static void on_read(void *arg, weft_tcp *c, long n) {
  struct conn *k = arg;
  if (n > 0 && weft_tcp_write(c, k->buf, (size_t)n, on_write, k) == 0)
    return;
  /* EOF: nothing of ours is queued (we only read when the last write
   * completed), so the FIN goes out at once; errors just close. */
  if (n == 0)
    weft_tcp_shutdown(c);
  weft_tcp_close(c, 0);
}

static void on_accept(void *arg, weft_tcp *c) {
  (void)arg;
  struct conn *k = malloc(sizeof(*k));
  if (!k) {
    weft_tcp_close(c, 1);
    return;
  }
  weft_tcp_set_data(c, k, conn_free);
  weft_tcp_nodelay(c, 1);
  if (weft_tcp_read(c, k->buf, sizeof(k->buf), on_read, k) < 0)
    weft_tcp_close(c, 0);
}

static void usage(void) {
  fprintf(stderr, "usage: echo [--port P] [--threads N] [--host ADDR] "
                  "[--unix PATH]\n");
  exit(1);
}

int main(int argc, char **argv) {
  struct ex_opts o;
  ex_opts_init(&o);
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc || ex_common_opt(&o, argv[i], argv[i + 1]) != 1)
      usage();
  }
  weft_rt *rt = ex_rt_create("echo", &o);
  weft_listener *l = ex_listen("echo", rt, &o, on_accept, NULL);
  return ex_serve("echo", rt, l, NULL, NULL);
}

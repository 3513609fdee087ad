/*
 * tcp_proxy - a TCP proxy on weft: each client connection is joined to a
 * new connection to the backend, and bytes flow both ways.
 *
 *   tcp_proxy --backend HOST:PORT [--port P] [--threads N] [--host ADDR]
 *             [--unix PATH]
 *             [--connect-timeout-ms MS] [--idle-timeout-ms MS]
 *
 * A pair (client, backend) lives on one strand: the client's, which
 * weft_tcp_connect is given for the backend, so the pair's state needs no
 * lock. Each direction has a 64 KiB buffer and one operation in flight
 * (read, then write, then read again when the write is complete): a slow
 * reader slows the writer through TCP instead of growing memory. EOF on one
 * side is passed on as a half-close (weft_tcp_shutdown) of the other; when both
 * directions have ended, or on an error, the idle timeout (default 60 s, 0:
 * none) or a failed connect (timeout default 5 s), both sides are closed.
 * Per-connection state (the pair) is freed in the close callbacks.
 * Prints "listening on PORT"; SIGINT or SIGTERM stops it (exit 0).
 */
#include <weft.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "netutil.h"

#define BUF_SIZE (64 * 1024)

static weft_rt *g_rt;
static struct sockaddr_storage g_backend;
static unsigned g_backend_len;
static uint64_t g_connect_timeout_ns = 5000ull * 1000000;
static uint64_t g_idle_ns = 60000ull * 1000000;

/* A client and its backend connection, touched only on the client's
 * strand. Side 0 is the client, side 1 the backend; buf[i] holds what was
 * read from side i and is being written to side 1 - i. Both connections
 * have on_closed as their close callback, which forgets the side (c[i] =
 * NULL: it must not be used after that) and frees the pair after the
 * second one. The idle timeout is the client connection's own
 * (weft_tcp_set_timeouts): every byte of the pair is read from or sent
 * to the client. */
struct pair {
  weft_tcp *c[2]; /* NULL once that side's close callback has run */
  unsigned live;  /* connections whose close callback is still due */
  bool eof[2];    /* side i sent FIN and it was passed on */
  char buf[2][BUF_SIZE];
};

static void on_read(void *arg, weft_tcp *c, long n);

/* Closes both sides. Calling it again while a close is under way is
 * harmless (weft_tcp_close returns -EALREADY). */
static void pair_close(struct pair *p) {
  for (int i = 0; i < 2; i++)
    if (p->c[i])
      weft_tcp_close(p->c[i], 0);
}

static void on_closed(void *data, weft_tcp *c) {
  struct pair *p = data;
  int i = c == p->c[1];
  p->c[i] = NULL;
  pair_close(p); /* the other side, if it is still open */
  if (--p->live == 0)
    free(p);
}

/* Reads from side i into buf[i]; 0 or a negative errno. */
static int pair_read(struct pair *p, int i) {
  if (!p->c[i])
    return -EBADF;
  return weft_tcp_read(p->c[i], p->buf[i], BUF_SIZE, on_read, p);
}

static void on_write(void *arg, weft_tcp *c, int status) {
  struct pair *p = arg;
  int from = c == p->c[1] ? 0 : 1; /* c is the side written to */
  if (status < 0 || pair_read(p, from) < 0)
    pair_close(p);
}

static void on_read(void *arg, weft_tcp *c, long n) {
  struct pair *p = arg;
  int i = c == p->c[0] ? 0 : 1;
  weft_tcp *to = p->c[1 - i];
  if (n > 0 && to) {
    if (weft_tcp_write(to, p->buf[i], (size_t)n, on_write, p) == 0)
      return;
  } else if (n == 0 && to) {
    /* Nothing is queued on the other side in this direction (we read only
     * after a write completed), so its FIN goes out at once. */
    p->eof[i] = true;
    if (weft_tcp_shutdown(to) == 0 && !p->eof[1 - i])
      return;
  }
  pair_close(p);
}

/* A failed connect closes the backend by itself: on_closed then closes the
 * client. */
static void on_connect(void *arg, weft_tcp *c, int status) {
  struct pair *p = arg;
  if (status < 0)
    return;
  weft_tcp_nodelay(c, 1);
  if (!p->c[0] || weft_tcp_set_timeouts(p->c[0], g_idle_ns, 0, 0) < 0 ||
      pair_read(p, 0) < 0 || pair_read(p, 1) < 0)
    pair_close(p);
}

static void on_accept(void *arg, weft_tcp *c) {
  (void)arg;
  struct pair *p = calloc(1, sizeof(*p));
  if (!p) {
    weft_tcp_close(c, 1);
    return;
  }
  p->c[0] = c;
  p->live = 1;
  weft_tcp_set_data(c, p, on_closed);
  weft_tcp_nodelay(c, 1);
  weft_tcp *b;
  if (weft_tcp_connect(g_rt, weft_tcp_strand(c), (struct sockaddr *)&g_backend,
                       g_backend_len, g_connect_timeout_ns, on_connect, p,
                       &b) < 0) {
    weft_tcp_close(c, 0);
    return;
  }
  p->c[1] = b;
  p->live = 2;
  weft_tcp_set_data(b, p, on_closed);
}

static void usage(void) {
  fprintf(stderr, "usage: tcp_proxy --backend HOST:PORT [--port P] "
                  "[--threads N] [--host ADDR] [--unix PATH]\n"
                  "                 [--connect-timeout-ms MS] "
                  "[--idle-timeout-ms MS]\n");
  exit(1);
}

static void parse(int argc, char **argv, struct ex_opts *o) {
  const char *backend = NULL;
  unsigned long ms;
  for (int i = 1; i < argc; i += 2) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int c = v ? ex_common_opt(o, a, v) : -1;
    if (c == 1)
      continue;
    if (c < 0)
      usage();
    if (!strcmp(a, "--backend"))
      backend = v;
    else if (!strcmp(a, "--connect-timeout-ms") &&
             ex_parse_uint(v, 86400000, &ms))
      g_connect_timeout_ns = ms * 1000000ull;
    else if (!strcmp(a, "--idle-timeout-ms") && ex_parse_uint(v, 86400000, &ms))
      g_idle_ns = ms * 1000000ull;
    else
      usage();
  }
  if (!backend)
    usage();
  if (ex_resolve_hostport(backend, &g_backend, &g_backend_len) < 0) {
    fprintf(stderr, "tcp_proxy: bad --backend '%s' (HOST:PORT)\n", backend);
    exit(1);
  }
}

int main(int argc, char **argv) {
  struct ex_opts o;
  ex_opts_init(&o);
  parse(argc, argv, &o);
  g_rt = ex_rt_create("tcp_proxy", &o);
  weft_listener *l = ex_listen("tcp_proxy", g_rt, &o, on_accept, NULL);
  return ex_serve("tcp_proxy", g_rt, l, NULL, NULL);
}

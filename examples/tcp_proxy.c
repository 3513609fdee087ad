/*
 * tcp_proxy - a TCP proxy on weft: each client connection is joined to a
 * new connection to the backend, and bytes flow both ways.
 *
 *   tcp_proxy --backend HOST:PORT [--port P] [--threads N] [--host ADDR]
 *             [--connect-timeout-ms MS] [--idle-timeout-ms MS]
 *
 * A pair (client, backend) lives on one strand: the client's, which
 * weft_tcp_connect is given for the backend and the idle timer is created
 * on, so the pair's state needs no lock. Each direction has a 64 KiB
 * buffer and one operation in flight (read, then write, then read again
 * when the write is complete): a slow reader slows the writer through TCP
 * instead of growing memory. EOF on one side is passed on as a half-close
 * (weft_tcp_shutdown) of the other; when both directions have ended, or on
 * an error, the idle timeout (default 60 s, 0: none) or a failed connect
 * (timeout default 5 s), both sides are closed.
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
 * read from side i and is being written to side 1 - i.
 *
 * Lifetime: ops counts the callbacks pending with the pair as arg (the
 * connect, one read or write per direction, the close callbacks). Closing
 * destroys the timer first (on the strand, so no firing of it runs later),
 * then closes the backend, and the client only from the backend's close
 * callback: the client's strand, which the backend and the timer borrow,
 * outlives both. The pair is freed when the client's close was started
 * and ops is 0. A close by weft_rt_shutdown reaches us through a pending
 * callback (-ECANCELED); if weft_tcp_close then fails (-EALREADY), no
 * close callback of ours is counted for that side. */
struct pair {
  weft_tcp *c[2];
  weft_timer *timer;   /* NULL when there is no idle timeout, or closing */
  uint64_t last_io_ns; /* last read of data on either side */
  unsigned ops;
  bool closing;        /* pair_close was called */
  bool client_closing; /* weft_tcp_close was called for the client */
  bool eof[2];         /* side i sent FIN and it was passed on */
  char buf[2][BUF_SIZE];
};

static void on_read(void *arg, weft_tcp *c, long n);
static void on_timer(void *arg, int status, uint64_t missed);

static void pair_maybe_free(struct pair *p) {
  if (p->client_closing && p->ops == 0)
    free(p);
}

static void on_client_closed(void *arg, weft_tcp *c) {
  (void)c;
  struct pair *p = arg;
  p->ops--;
  pair_maybe_free(p);
}

static void client_close(struct pair *p) {
  p->client_closing = true;
  if (weft_tcp_close(p->c[0], 0, on_client_closed, p) == 0)
    p->ops++;
}

static void on_backend_closed(void *arg, weft_tcp *c) {
  (void)c;
  struct pair *p = arg;
  p->ops--;
  client_close(p);
  pair_maybe_free(p);
}

/* Closes both sides (see struct pair); callers then run pair_maybe_free. */
static void pair_close(struct pair *p) {
  if (p->closing)
    return;
  p->closing = true;
  if (p->timer) {
    weft_timer_destroy(p->timer);
    p->timer = NULL;
  }
  if (p->c[1] && weft_tcp_close(p->c[1], 0, on_backend_closed, p) == 0) {
    p->ops++;
    return;
  }
  client_close(p);
}

/* Reads from side i into buf[i]. */
static void pair_read(struct pair *p, int i) {
  if (weft_tcp_read(p->c[i], p->buf[i], BUF_SIZE, on_read, p) == 0)
    p->ops++;
  else
    pair_close(p);
}

static void on_write(void *arg, weft_tcp *c, int status) {
  struct pair *p = arg;
  int from = c == p->c[1] ? 0 : 1; /* c is the side written to */
  p->ops--;
  if (!p->closing) {
    if (status < 0)
      pair_close(p);
    else
      pair_read(p, from);
  }
  pair_maybe_free(p);
}

static void on_read(void *arg, weft_tcp *c, long n) {
  struct pair *p = arg;
  int i = c == p->c[0] ? 0 : 1;
  p->ops--;
  if (p->closing) {
    pair_maybe_free(p);
    return;
  }
  if (n > 0) {
    p->last_io_ns = weft_now_ns();
    if (weft_tcp_write(p->c[1 - i], p->buf[i], (size_t)n, on_write, p) == 0)
      p->ops++;
    else
      pair_close(p);
  } else if (n == 0) {
    /* Nothing is queued on the other side in this direction (we read only
     * after a write completed), so its FIN goes out at once. */
    p->eof[i] = true;
    if (weft_tcp_shutdown(p->c[1 - i]) < 0 || p->eof[1 - i])
      pair_close(p);
  } else {
    pair_close(p);
  }
  pair_maybe_free(p);
}

/* Idle check: the timer is armed for last_io_ns + idle and re-armed from
 * there when data moved meanwhile, so reads never touch the timer. */
static void on_timer(void *arg, int status, uint64_t missed) {
  (void)missed;
  struct pair *p = arg;
  if (p->closing)
    return;
  uint64_t due = p->last_io_ns + g_idle_ns;
  if (status < 0 || weft_now_ns() >= due ||
      weft_timer_start_at(p->timer, due, 0, on_timer, p) < 0)
    pair_close(p);
  pair_maybe_free(p);
}

static void on_connect(void *arg, weft_tcp *c, int status) {
  struct pair *p = arg;
  p->ops--;
  if (!p->closing) {
    if (status < 0) {
      pair_close(p);
    } else {
      weft_tcp_nodelay(c, 1);
      p->last_io_ns = weft_now_ns();
      if (p->timer &&
          weft_timer_start(p->timer, g_idle_ns, 0, on_timer, p) < 0) {
        pair_close(p);
      } else {
        pair_read(p, 0);
        if (!p->closing)
          pair_read(p, 1);
      }
    }
  }
  pair_maybe_free(p);
}

static void on_accept(void *arg, weft_tcp *c) {
  (void)arg;
  struct pair *p = calloc(1, sizeof(*p));
  if (!p) {
    weft_tcp_close(c, 1, ex_on_close_noop, NULL);
    return;
  }
  p->c[0] = c;
  weft_tcp_nodelay(c, 1);
  weft_strand *s = weft_tcp_strand(c);
  int r = 0;
  if (g_idle_ns && (r = weft_timer_create(g_rt, s, &p->timer)) < 0)
    p->timer = NULL;
  if (r == 0)
    r = weft_tcp_connect(g_rt, s, (struct sockaddr *)&g_backend, g_backend_len,
                         g_connect_timeout_ns, on_connect, p, &p->c[1]);
  if (r == 0) {
    p->ops++;
  } else {
    p->c[1] = NULL;
    pair_close(p);
  }
  pair_maybe_free(p);
}

static void usage(void) {
  fprintf(stderr, "usage: tcp_proxy --backend HOST:PORT [--port P] "
                  "[--threads N] [--host ADDR]\n"
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
  sigset_t sigs;
  ex_block_signals(&sigs);
  g_rt = ex_rt_create("tcp_proxy", &o);
  weft_listener *l = ex_listen("tcp_proxy", g_rt, &o, on_accept, NULL);
  ex_wait_signal(&sigs);
  return ex_stop("tcp_proxy", g_rt, l);
}

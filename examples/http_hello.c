/*
 * http_hello - the smallest useful HTTP/1.1 server on weft, and the server
 * of the HTTP benchmarks (wrk against it, nginx, Asio and libuv).
 *
 *   http_hello [--port P] [--threads N] [--host ADDR] [--unix PATH]
 *              [--metrics P]
 *
 * Every request (a header block ending in an empty line; bodies are not
 * supported) gets "Hello, World!" with keep-alive; a request with
 * "Connection: close" gets the same with that header, then the connection
 * is closed. A request that does not fit an 8 KiB buffer gets 431 and a
 * close. Pipelined requests are answered with one write per batch.
 *
 * The fast path allocates nothing: the responses are static bytes (one
 * array holds as many copies as a full buffer can hold requests), a read
 * and a write of those bytes are in flight at once, and the write needs no
 * completion callback. Memory per connection is its buffer: SMALL_SIZE
 * bytes inside struct hconn (1 KiB in all, within glibc's per-thread cache
 * of small blocks), replaced by a BUF_SIZE block only when a head
 * outgrows it, as nginx's client_header_buffer_size and
 * large_client_header_buffers do. When weft's
 * queue for the connection grows past QUEUE_LIMIT (a client pipelining
 * without reading), the next write is tracked and reading waits for it.
 * Per-connection state is freed in the close callback.
 *
 * With --metrics P, a second listener on the same host, port P (0: a free
 * one), is an admin endpoint: GET /metrics answers with the runtime's
 * counters in Prometheus's text format (weft_rt_metrics), for a scrape or
 * curl, then closes the connection.
 *
 * Prints "listening on PORT" (then "metrics on PORT"); SIGINT or SIGTERM
 * stops it (exit 0).
 */
#include <weft.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/uio.h>

#include "netutil.h"

#define BUF_SIZE 8192
#define SMALL_SIZE 960
/* The most requests a full buffer can hold: each ends in "\r\n\r\n". */
#define MAX_REQS (BUF_SIZE / 4)
/* Queued bytes above which reading waits for the writes. Below weft's
 * default high watermark (1 MiB) by more than the largest batch, so a
 * write is never refused with -ENOBUFS. */
#define QUEUE_LIMIT (256 * 1024)

#define BODY "Hello, World!"
#define HEAD                                                                   \
  "HTTP/1.1 200 OK\r\nContent-Length: 13\r\nContent-Type: text/plain\r\n"
static const char resp_keep[] = HEAD "\r\n" BODY;
static const char resp_close[] = HEAD "Connection: close\r\n\r\n" BODY;
static const char resp_431[] =
    "HTTP/1.1 431 Request Header Fields Too Large\r\n"
    "Content-Length: 0\r\nConnection: close\r\n\r\n";
#define KEEP_LEN (sizeof(resp_keep) - 1)

/* MAX_REQS copies of resp_keep, filled once before listening. */
static char many[MAX_REQS * KEEP_LEN];

/* One connection; touched only on its strand, freed in its close
 * callback. */
struct hconn {
  weft_tcp *c;
  bool last;    /* the final response is queued: close when it is sent */
  bool nodelay; /* TCP_NODELAY is set */
  size_t len;   /* bytes in buf */
  size_t scan;  /* buf[0, scan) holds no complete request */
  size_t cap;   /* SMALL_SIZE, or BUF_SIZE once buf was replaced */
  char *buf;    /* small, or a BUF_SIZE block of its own */
  char small[SMALL_SIZE];
};
_Static_assert(sizeof(struct hconn) <= 1024, "struct hconn outgrew 1 KiB");

static void on_read(void *arg, weft_tcp *c, long n);

static void hconn_free(void *data, weft_tcp *c) {
  (void)c;
  struct hconn *h = data;
  if (h->buf != h->small)
    free(h->buf);
  free(h);
}

static void hconn_read(struct hconn *h) {
  if (weft_tcp_read(h->c, h->buf + h->len, h->cap - h->len, on_read, h) < 0)
    weft_tcp_close(h->c, 0);
}

static void on_write(void *arg, weft_tcp *c, int status) {
  struct hconn *h = arg;
  if (status < 0 || h->last)
    weft_tcp_close(c, 0);
  else
    hconn_read(h);
}

/* Does the header block [p, p + n) have "Connection: close" (any case,
 * possibly one token of a list)? */
static bool wants_close(const char *p, size_t n) {
  const char *end = p + n;
  for (const char *line = p; line < end;) {
    const char *eol = memchr(line, '\n', (size_t)(end - line));
    if (!eol)
      eol = end;
    if (eol - line > 11 && !strncasecmp(line, "connection:", 11)) {
      const char *v = line + 11;
      while (v < eol) {
        while (v < eol && (*v == ' ' || *v == '\t' || *v == ','))
          v++;
        const char *t = v;
        while (v < eol && *v != ',' && *v != ' ' && *v != '\t' && *v != '\r')
          v++;
        if (v - t == 5 && !strncasecmp(t, "close", 5))
          return true;
        while (v < eol && *v != ',')
          v++;
      }
    }
    line = eol + 1;
  }
  return false;
}

/* Queues the responses to count requests (the last with Connection: close
 * if close), then reads on, unless the write is tracked. */
static void respond(struct hconn *h, size_t count, bool close) {
  bool track = close || weft_tcp_queued(h->c) > QUEUE_LIMIT;
  size_t keep = close ? count - 1 : count;
  weft_write_fn fn = track ? on_write : NULL;
  int r;
  /* Nagle's algorithm would hold a response back only behind an earlier
   * one not yet acknowledged: a connection that stays open needs
   * TCP_NODELAY, one closed after its first answer does not (nginx's
   * tcp_nodelay does the same), and is spared the system call. */
  if (!close && !h->nodelay) {
    weft_tcp_nodelay(h->c, 1);
    h->nodelay = true;
  }
  if (close && keep) {
    struct iovec iov[2] = {{many, keep * KEEP_LEN},
                           {(void *)resp_close, sizeof(resp_close) - 1}};
    r = weft_tcp_writev(h->c, iov, 2, fn, h);
  } else if (close) {
    r = weft_tcp_write(h->c, resp_close, sizeof(resp_close) - 1, fn, h);
  } else {
    r = weft_tcp_write(h->c, many, keep * KEEP_LEN, fn, h);
  }
  if (r < 0) {
    weft_tcp_close(h->c, 0);
    return;
  }
  h->last = close;
  if (!track)
    hconn_read(h);
}

/* Answers every complete request in the buffer and keeps the rest. */
static void serve(struct hconn *h) {
  size_t pos = 0, count = 0;
  bool close = false;
  while (!close) {
    size_t from = h->scan > pos + 3 ? h->scan - 3 : pos;
    const char *e = memmem(h->buf + from, h->len - from, "\r\n\r\n", 4);
    if (!e)
      break;
    size_t end = (size_t)(e - h->buf) + 4;
    close = wants_close(h->buf + pos, end - pos);
    count++;
    pos = end;
  }
  memmove(h->buf, h->buf + pos, h->len - pos);
  h->len -= pos;
  h->scan = h->len;
  if (count) {
    respond(h, count, close);
  } else if (h->len == h->cap && h->cap < BUF_SIZE) {
    char *big = malloc(BUF_SIZE);
    if (!big) {
      weft_tcp_close(h->c, 0);
      return;
    }
    memcpy(big, h->buf, h->len);
    h->buf = big;
    h->cap = BUF_SIZE;
    hconn_read(h);
  } else if (h->len == h->cap) {
    h->last = true;
    if (weft_tcp_write(h->c, resp_431, sizeof(resp_431) - 1, on_write, h) < 0)
      weft_tcp_close(h->c, 0);
  } else {
    hconn_read(h);
  }
}

static void on_read(void *arg, weft_tcp *c, long n) {
  struct hconn *h = arg;
  if (n <= 0) {
    weft_tcp_close(c, 0);
    return;
  }
  h->len += (size_t)n;
  serve(h);
}

static void on_accept(void *arg, weft_tcp *c) {
  (void)arg;
  struct hconn *h = malloc(sizeof(*h));
  if (!h) {
    weft_tcp_close(c, 1);
    return;
  }
  h->c = c;
  h->last = h->nodelay = false;
  h->len = h->scan = 0;
  h->buf = h->small;
  h->cap = sizeof(h->small);
  weft_tcp_set_data(c, h, hconn_free);
  hconn_read(h);
}

/* ---- the admin endpoint (--metrics) ------------------------------------- */

static weft_rt *g_rt;

struct mconn {
  size_t len;
  char head[160];
  char *body;
  char req[1024];
};

static void metrics_free(void *data, weft_tcp *c) {
  (void)c;
  struct mconn *m = data;
  free(m->body);
  free(m);
}

static void metrics_sent(void *arg, weft_tcp *c, int status) {
  (void)arg;
  (void)status;
  weft_tcp_close(c, 0);
}

/* The answer to a whole request head: the counters, or 404. */
static void metrics_answer(struct mconn *m, weft_tcp *c) {
  static const char not_found[] = "HTTP/1.1 404 Not Found\r\nContent-Length: "
                                  "0\r\nConnection: close\r\n\r\n";
  if (strncmp(m->req, "GET /metrics ", 13) != 0) {
    if (weft_tcp_write(c, not_found, sizeof(not_found) - 1, metrics_sent, m))
      weft_tcp_close(c, 0);
    return;
  }
  /* Room to spare: the counters may grow between the two calls. */
  long need = weft_rt_metrics(g_rt, WEFT_METRICS_PROMETHEUS, NULL, 0);
  size_t room = need > 0 ? (size_t)need + 4096 : 0;
  long n = room && (m->body = malloc(room))
               ? weft_rt_metrics(g_rt, WEFT_METRICS_PROMETHEUS, m->body, room)
               : -1;
  if (n < 0 || (size_t)n >= room) {
    weft_tcp_close(c, 0);
    return;
  }
  int h = snprintf(m->head, sizeof(m->head),
                   "HTTP/1.1 200 OK\r\nContent-Type: text/plain; "
                   "version=0.0.4\r\nContent-Length: %ld\r\nConnection: "
                   "close\r\n\r\n",
                   n);
  if (weft_tcp_write(c, m->head, (size_t)h, NULL, NULL) < 0 ||
      weft_tcp_write(c, m->body, (size_t)n, metrics_sent, m) < 0)
    weft_tcp_close(c, 0);
}

static void metrics_read(void *arg, weft_tcp *c, long n) {
  struct mconn *m = arg;
  if (n <= 0) {
    weft_tcp_close(c, 0);
    return;
  }
  m->len += (size_t)n;
  if (memmem(m->req, m->len, "\r\n\r\n", 4))
    metrics_answer(m, c);
  else if (m->len == sizeof(m->req) ||
           weft_tcp_read(c, m->req + m->len, sizeof(m->req) - m->len,
                         metrics_read, m) < 0)
    weft_tcp_close(c, 0);
}

static void metrics_accept(void *arg, weft_tcp *c) {
  (void)arg;
  struct mconn *m = calloc(1, sizeof(*m));
  if (!m) {
    weft_tcp_close(c, 1);
    return;
  }
  weft_tcp_set_data(c, m, metrics_free);
  if (weft_tcp_read(c, m->req, sizeof(m->req), metrics_read, m) < 0)
    weft_tcp_close(c, 0);
}

static void metrics_announce(void *arg) {
  struct sockaddr_storage ss;
  unsigned len = sizeof(ss);
  if (weft_listener_addr(arg, (struct sockaddr *)&ss, &len) < 0)
    return;
  printf("metrics on %u\n", ex_port_of(&ss));
  fflush(stdout);
}

static void usage(void) {
  fprintf(stderr, "usage: http_hello [--port P] [--threads N] [--host ADDR] "
                  "[--unix PATH] [--metrics P]\n");
  exit(1);
}

int main(int argc, char **argv) {
  struct ex_opts o;
  ex_opts_init(&o);
  long metrics_port = -1;
  for (int i = 1; i < argc; i += 2) {
    unsigned long v;
    if (i + 1 < argc && !strcmp(argv[i], "--metrics") &&
        ex_parse_uint(argv[i + 1], 65535, &v))
      metrics_port = (long)v;
    else if (i + 1 >= argc || ex_common_opt(&o, argv[i], argv[i + 1]) != 1)
      usage();
  }
  for (size_t i = 0; i < MAX_REQS; i++)
    memcpy(many + i * KEEP_LEN, resp_keep, KEEP_LEN);
  weft_rt *rt = g_rt = ex_rt_create("http_hello", &o);
  weft_listener *l = ex_listen("http_hello", rt, &o, on_accept, NULL);
  if (metrics_port < 0)
    return ex_serve("http_hello", rt, l, NULL, NULL);
  struct ex_opts mo = o;
  mo.port = (unsigned)metrics_port;
  mo.unix_path = NULL;
  weft_listener *ml = ex_listen("http_hello", rt, &mo, metrics_accept, NULL);
  return ex_serve_with("http_hello", rt, l, NULL, NULL, metrics_announce, ml);
}

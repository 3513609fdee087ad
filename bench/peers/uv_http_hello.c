/*
 * uv_http_hello.c - a minimal HTTP/1.1 "Hello, World!" server on libuv: the
 * peer of weft's examples/http_hello in bench/net.
 *
 * Layout: one uv_loop_t per thread, each with its own listening socket on
 * the same address bound with SO_REUSEPORT (made by hand and given to
 * uv_tcp_open: libuv 1.44 has no UV_TCP_REUSEPORT), so the kernel spreads
 * new connections over the loops and a connection lives on the loop that
 * accepted it. That is how libuv servers use several cores (a loop is
 * single-threaded; one loop would use one core).
 *
 * Each connection keeps reading; every complete request in its buffer
 * ("\r\n\r\n"-terminated, pipelined ones included) is answered, the answers
 * to one read going out in one uv_write of the static response (libuv keeps
 * writes in order). A request with "Connection: close" gets "Connection:
 * close" in its response; reading stops and the connection is closed once
 * that response is sent. Requests with bodies are not supported. A
 * connection, its buffer included, fits in 1 KiB (glibc's per-thread cache
 * of small blocks); a head that outgrows the buffer moves to a BUF_SIZE
 * block, as in examples/http_hello.c and nginx.
 *
 * Usage: uv_http_hello [--port P] [--threads N]  (port 0: pick one)
 * Prints "listening on PORT" once every loop listens; SIGINT or SIGTERM
 * stops it (exit status 0). Exit status 2 on bad flags, 1 on failure.
 */
#include <uv.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define BUF_SIZE 16384 /* a request's head must fit in it */
#define SMALL_SIZE 704 /* the buffer inside struct conn */
#define MAX_BATCH 64   /* responses in one write */

static char keep_alive[] = "HTTP/1.1 200 OK\r\n"
                           "Content-Length: 13\r\n"
                           "Content-Type: text/plain\r\n"
                           "\r\n"
                           "Hello, World!";
static char close_resp[] = "HTTP/1.1 200 OK\r\n"
                           "Content-Length: 13\r\n"
                           "Content-Type: text/plain\r\n"
                           "Connection: close\r\n"
                           "\r\n"
                           "Hello, World!";

struct conn {
  uv_tcp_t h;
  bool closing; /* a close response is queued: read no more */
  size_t len;   /* bytes in buf */
  size_t cap;   /* SMALL_SIZE, or BUF_SIZE once buf was replaced */
  char *buf;    /* small, or a BUF_SIZE block of its own */
  char small[SMALL_SIZE];
};
_Static_assert(sizeof(struct conn) <= 1024, "struct conn outgrew 1 KiB");

struct wreq {
  uv_write_t req;
  bool close_after;
};

struct worker {
  uv_loop_t loop;
  uv_tcp_t listener;
  uv_async_t stop;
  pthread_t th;
};

static void on_closed(uv_handle_t *h) { /* h is first: the conn */
  struct conn *c = (struct conn *)h;
  if (c->buf != c->small)
    free(c->buf);
  free(c);
}

static void conn_close(struct conn *c) {
  if (!uv_is_closing((uv_handle_t *)&c->h))
    uv_close((uv_handle_t *)&c->h, on_closed);
}

static size_t trim(const char **s, size_t n) {
  while (n && (**s == ' ' || **s == '\t'))
    (*s)++, n--;
  while (n && ((*s)[n - 1] == ' ' || (*s)[n - 1] == '\t'))
    n--;
  return n;
}

/* Whether the request head [p, end) (request line and headers, without the
 * final empty line) has a Connection header with the token "close". */
static bool wants_close(const char *p, const char *end) {
  const char *eol = memmem(p, (size_t)(end - p), "\r\n", 2);
  while (eol) {
    p = eol + 2;
    eol = memmem(p, (size_t)(end - p), "\r\n", 2);
    const char *le = eol ? eol : end;
    const char *colon = memchr(p, ':', (size_t)(le - p));
    if (!colon)
      continue;
    const char *name = p;
    size_t nlen = trim(&name, (size_t)(colon - p));
    if (nlen != 10 || strncasecmp(name, "connection", 10) != 0)
      continue;
    const char *v = colon + 1;
    while (v < le) {
      const char *comma = memchr(v, ',', (size_t)(le - v));
      const char *te = comma ? comma : le;
      const char *tok = v;
      size_t tlen = trim(&tok, (size_t)(te - v));
      if (tlen == 5 && strncasecmp(tok, "close", 5) == 0)
        return true;
      if (!comma)
        break;
      v = comma + 1;
    }
  }
  return false;
}

static void on_written(uv_write_t *req, int status) {
  struct wreq *w = (struct wreq *)req;
  struct conn *c = (struct conn *)req->handle;
  if (status < 0 || w->close_after)
    conn_close(c);
  free(w);
}

static int send_batch(struct conn *c, uv_buf_t *bufs, unsigned n,
                      bool close_after) {
  struct wreq *w = malloc(sizeof *w);
  if (!w)
    return -1;
  w->close_after = close_after;
  if (uv_write(&w->req, (uv_stream_t *)&c->h, bufs, n, on_written) < 0) {
    free(w);
    return -1;
  }
  return 0;
}

/* Answers every complete request in c->buf. */
static void respond(struct conn *c) {
  uv_buf_t bufs[MAX_BATCH];
  unsigned n = 0;
  size_t used = 0;
  for (;;) {
    char *head = c->buf + used;
    char *end = memmem(head, c->len - used, "\r\n\r\n", 4);
    if (!end)
      break;
    used = (size_t)(end - c->buf) + 4;
    if (wants_close(head, end)) {
      bufs[n++] = uv_buf_init(close_resp, sizeof close_resp - 1);
      c->closing = true;
      uv_read_stop((uv_stream_t *)&c->h);
      break;
    }
    bufs[n++] = uv_buf_init(keep_alive, sizeof keep_alive - 1);
    if (n == MAX_BATCH) {
      if (send_batch(c, bufs, n, false) < 0)
        return conn_close(c);
      n = 0;
    }
  }
  if (n && send_batch(c, bufs, n, c->closing) < 0)
    return conn_close(c);
  memmove(c->buf, c->buf + used, c->len - used);
  c->len -= used;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  struct conn *c = (struct conn *)h;
  (void)suggested;
  /* A full buffer moves to a BUF_SIZE block. A full BUF_SIZE block (a
   * request head larger than it, or no memory for the block) gives a
   * zero-length buffer, so the read fails with UV_ENOBUFS and the
   * connection closes. */
  if (c->len == c->cap && c->cap < BUF_SIZE) {
    char *big = malloc(BUF_SIZE);
    if (big) {
      memcpy(big, c->buf, c->len);
      c->buf = big;
      c->cap = BUF_SIZE;
    }
  }
  *buf = uv_buf_init(c->buf + c->len, (unsigned)(c->cap - c->len));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  struct conn *c = (struct conn *)s;
  (void)buf;
  if (n < 0)
    return conn_close(c);
  if (n == 0 || c->closing)
    return;
  c->len += (size_t)n;
  respond(c);
}

static void on_connection(uv_stream_t *server, int status) {
  if (status < 0)
    return;
  struct conn *c = malloc(sizeof *c);
  if (!c)
    return;
  c->closing = false;
  c->len = 0;
  c->buf = c->small;
  c->cap = sizeof(c->small);
  uv_tcp_init(server->loop, &c->h);
  c->h.data = NULL; /* a connection (see close_any) */
  if (uv_accept(server, (uv_stream_t *)&c->h) < 0)
    return conn_close(c);
  uv_tcp_nodelay(&c->h, 1);
  if (uv_read_start((uv_stream_t *)&c->h, on_alloc, on_read) < 0)
    conn_close(c);
}

static void close_any(uv_handle_t *h, void *arg) {
  (void)arg;
  if (uv_is_closing(h))
    return;
  /* Connections are the only handles with malloc'd memory. */
  if (h->type == UV_TCP && h->data == NULL)
    uv_close(h, on_closed);
  else
    uv_close(h, NULL);
}

static void on_stop(uv_async_t *a) { uv_walk(a->loop, close_any, NULL); }

static void *run_loop(void *arg) {
  struct worker *w = arg;
  uv_run(&w->loop, UV_RUN_DEFAULT);
  return NULL;
}

/* A socket on 127.0.0.1:port with SO_REUSEADDR and SO_REUSEPORT, bound;
 * -1 on failure. */
static int bound_socket(unsigned port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  int one = 1;
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
      setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0 ||
      bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int main(int argc, char **argv) {
  unsigned long port = 0, threads = 2;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--port") && i + 1 < argc)
      port = strtoul(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = strtoul(argv[++i], NULL, 10);
    else {
      fprintf(stderr, "usage: uv_http_hello [--port P] [--threads N]\n");
      return 2;
    }
  }
  if (port > 65535 || threads < 1 || threads > 1024) {
    fprintf(stderr, "uv_http_hello: bad --port or --threads\n");
    return 2;
  }

  /* SIGINT and SIGTERM are taken with sigwait below, never by a handler:
   * blocked here, before any thread starts, so every thread inherits that. */
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL);
  signal(SIGPIPE, SIG_IGN);

  struct worker *ws = calloc(threads, sizeof *ws);
  if (!ws)
    return 1;
  for (unsigned long i = 0; i < threads; i++) {
    struct worker *w = &ws[i];
    /* Port 0: the first socket picks the port, the others bind to it. */
    int fd = bound_socket((unsigned)port);
    struct sockaddr_in sa;
    socklen_t salen = sizeof sa;
    if (fd < 0 || getsockname(fd, (struct sockaddr *)&sa, &salen) < 0) {
      fprintf(stderr, "uv_http_hello: bind 127.0.0.1:%lu: %s\n", port,
              strerror(errno));
      return 1;
    }
    port = ntohs(sa.sin_port);
    int r = uv_loop_init(&w->loop);
    if (!r)
      r = uv_tcp_init(&w->loop, &w->listener);
    if (!r) {
      w->listener.data = w; /* not a connection (see close_any) */
      r = uv_tcp_open(&w->listener, fd);
    }
    if (!r)
      r = uv_listen((uv_stream_t *)&w->listener, SOMAXCONN, on_connection);
    if (!r) {
      r = uv_async_init(&w->loop, &w->stop, on_stop);
      w->stop.data = w;
    }
    if (r) {
      fprintf(stderr, "uv_http_hello: listen: %s\n", uv_strerror(r));
      return 1;
    }
  }
  for (unsigned long i = 0; i < threads; i++)
    if (pthread_create(&ws[i].th, NULL, run_loop, &ws[i]) != 0) {
      fprintf(stderr, "uv_http_hello: pthread_create failed\n");
      return 1;
    }
  printf("listening on %lu\n", port);
  fflush(stdout);

  int sig = 0;
  sigwait(&sigs, &sig);
  for (unsigned long i = 0; i < threads; i++)
    uv_async_send(&ws[i].stop);
  for (unsigned long i = 0; i < threads; i++) {
    pthread_join(ws[i].th, NULL);
    uv_loop_close(&ws[i].loop);
  }
  free(ws);
  return 0;
}

/*
 * floor_http.h - what bench/net's two floors share (floor_http_hello.c on
 * io_uring, floor_epoll_http_hello.c on epoll): the answers, the
 * "Connection: close" test, the parsing of requests into answers, the
 * listeners and main. Header-only; each floor includes it once.
 *
 * A floor's main: floor_main(argc, argv, name, worker) parses
 * --port P --threads N, opens one SO_REUSEPORT listener per thread (the
 * kernel spreads the connections), starts worker(&floor_threads[i]) on
 * each, prints "listening on PORT" and joins them; SIGINT or SIGTERM sets
 * floor_stopping, which the workers poll at least every 100 ms.
 */
#ifndef WEFT_FLOOR_HTTP_H
#define WEFT_FLOOR_HTTP_H

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

#define BODY "Hello, World!"
#define HEAD                                                                   \
  "HTTP/1.1 200 OK\r\nContent-Length: 13\r\nContent-Type: text/plain\r\n"
static const char resp_keep[] = HEAD "\r\n" BODY;
static const char resp_close[] = HEAD "Connection: close\r\n\r\n" BODY;
static const char resp_400[] = "HTTP/1.1 400 Bad Request\r\n"
                               "Content-Length: 0\r\nConnection: close\r\n\r\n";

#define PART_MAX 8192 /* a longer head gets 400 */

static const char *floor_name;
static volatile sig_atomic_t floor_stopping;

struct floor_thread {
  int lfd;
  unsigned port;
  pthread_t th;
};

static void floor_on_signal(int sig) {
  (void)sig;
  floor_stopping = 1;
}

static void die(const char *what, int err) {
  fprintf(stderr, "%s: %s: %s\n", floor_name, what, strerror(err));
  exit(1);
}

/* Whether the head [p, end) has a Connection header whose value is
 * "close" (any case; the benchmark's clients send exactly that). */
static bool wants_close(const char *p, const char *end) {
  static const char name[] = "\r\nconnection:";
  for (const char *q = p; end - q >= (long)sizeof(name) - 1; q++) {
    if (*q != '\r' || strncasecmp(q, name, sizeof(name) - 1))
      continue;
    const char *v = q + sizeof(name) - 1;
    while (v < end && *v == ' ')
      v++;
    return end - v >= 5 && !strncasecmp(v, "close", 5);
  }
  return false;
}

/* A connection's requests as they come: a head that came in pieces (the
 * benchmark's clients send each request in one write, a shell's printf
 * need not) is gathered in part. closing: answered with a close (or 400),
 * no more answers. */
struct floor_heads {
  char *part;
  size_t npart;
  bool closing;
};

/* How a floor sends an answer for a connection (ctx). */
typedef void (*floor_reply_fn)(void *ctx, const char *p, size_t n);

/* Answers every complete head in [p, end); returns where the first
 * incomplete one starts (end: none). */
static const char *floor_answer(struct floor_heads *h, floor_reply_fn reply,
                                void *ctx, const char *p, const char *end) {
  while (p < end && !h->closing) {
    const char *e = memmem(p, (size_t)(end - p), "\r\n\r\n", 4);
    if (!e)
      return p;
    if (wants_close(p, e)) {
      reply(ctx, resp_close, sizeof(resp_close) - 1);
      h->closing = true;
    } else {
      reply(ctx, resp_keep, sizeof(resp_keep) - 1);
    }
    p = e + 4;
  }
  return end;
}

/* n bytes received on a connection: the answers to its complete heads. */
static void floor_on_data(struct floor_heads *h, floor_reply_fn reply,
                          void *ctx, const char *p, size_t n) {
  if (!h->npart) {
    const char *rest = floor_answer(h, reply, ctx, p, p + n);
    n = (size_t)(p + n - rest);
    p = rest;
    if (!n)
      return;
  }
  if ((!h->part && !(h->part = malloc(PART_MAX))) || n > PART_MAX - h->npart) {
    reply(ctx, resp_400, sizeof(resp_400) - 1);
    h->closing = true;
    return;
  }
  memcpy(h->part + h->npart, p, n);
  h->npart += n;
  const char *rest = floor_answer(h, reply, ctx, h->part, h->part + h->npart);
  h->npart = (size_t)(h->part + h->npart - rest);
  memmove(h->part, rest, h->npart);
}

static int floor_listener(unsigned port, int type_flags) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | type_flags, 0);
  int one = 1;
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
      setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) ||
      bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 1024))
    die("listen", errno);
  return fd;
}

/* listen_flags: extra socket type flags of the listeners (SOCK_NONBLOCK). */
static int floor_main(int argc, char **argv, const char *name, int listen_flags,
                      void *(*worker)(void *)) {
  unsigned port = 8080, threads = 1;
  floor_name = name;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--port"))
      port = (unsigned)strtoul(argv[i + 1], NULL, 10);
    else if (!strcmp(argv[i], "--threads"))
      threads = (unsigned)strtoul(argv[i + 1], NULL, 10);
    else
      break;
  }
  if (argc % 2 == 0 || !port || port > 65535 || !threads || threads > 256) {
    fprintf(stderr, "usage: %s [--port P] [--threads N]\n", name);
    return 2;
  }
  struct sigaction sa = {.sa_handler = floor_on_signal};
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  struct floor_thread *t = calloc(threads, sizeof(*t));
  if (!t)
    die("calloc", ENOMEM);
  for (unsigned i = 0; i < threads; i++) {
    t[i].port = port;
    t[i].lfd = floor_listener(port, listen_flags);
  }
  for (unsigned i = 0; i < threads; i++)
    if (pthread_create(&t[i].th, NULL, worker, &t[i]))
      die("pthread_create", EAGAIN);
  printf("listening on %u\n", port);
  fflush(stdout);
  for (unsigned i = 0; i < threads; i++)
    pthread_join(t[i].th, NULL);
  return 0;
}

#endif

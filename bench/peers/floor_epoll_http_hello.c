/*
 * floor_epoll_http_hello - bench/net's floor on epoll: the HTTP server of
 * the benchmark with no runtime, for the least work per request that this
 * kernel allows without io_uring, so that bench/net can say how much of
 * weft's CPU on its epoll backend the kernel alone needs (floor_http_hello
 * is the same on io_uring).
 *
 *   floor_epoll_http_hello --port P --threads N
 *
 * Answers like examples/http_hello (the same bytes as floor_http_hello).
 * Each thread is alone with its connections: its own SO_REUSEPORT
 * listener and its own epoll instance, level-triggered, so that one
 * receive per readiness is enough (a short one needs no second call to
 * see EAGAIN). A readable connection gets one recv into the thread's
 * buffer, and the answers to every complete head in it go out in one
 * send: two system calls per request, and an epoll_wait for all that
 * were ready at once. No thread ever wakes another, no timer, no lock.
 *
 * A request is a head (bodies are not supported); a head that came in
 * pieces is gathered per connection, and one longer than 8 KiB gets 400
 * and a close. An answer the socket does not take whole closes the
 * connection (the benchmark's answers are under 200 bytes). SIGINT or
 * SIGTERM stops it (exit 0). Prints "listening on PORT".
 */
#include <errno.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "floor_http.h"

#define EVENTS 256
#define IN_MAX 65536
#define OUT_MAX 65536

struct conn {
  int fd;
  struct floor_heads h;
};

struct worker {
  int ep, lfd;
  char in[IN_MAX];
  char out[OUT_MAX];
  size_t nout;
  bool overflow; /* more pipelined answers than out holds */
};

/* floor_on_data's reply: gathered for one send (ctx: the worker; a reply
 * that does not fit ends the connection's answers). */
static void reply(void *ctx, const char *p, size_t n) {
  struct worker *w = ctx;
  if (w->nout + n > OUT_MAX) {
    w->overflow = true;
    return;
  }
  memcpy(w->out + w->nout, p, n);
  w->nout += n;
}

static void conn_close(struct conn *c) {
  close(c->fd); /* also takes it out of the epoll set */
  free(c->h.part);
  free(c);
}

static void on_readable(struct worker *w, struct conn *c) {
  ssize_t n = recv(c->fd, w->in, IN_MAX, 0);
  if (n < 0 && (errno == EAGAIN || errno == EINTR))
    return;
  if (n <= 0) { /* end of stream, or an error */
    conn_close(c);
    return;
  }
  w->nout = 0;
  w->overflow = false;
  floor_on_data(&c->h, reply, w, w->in, (size_t)n);
  if (w->overflow)
    c->h.closing = true;
  if (w->nout && send(c->fd, w->out, w->nout, MSG_NOSIGNAL) != (ssize_t)w->nout)
    c->h.closing = true;
  if (c->h.closing)
    conn_close(c);
}

static void on_accept(struct worker *w) {
  for (;;) {
    int fd = accept4(w->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
      return; /* EAGAIN: all taken; else (EMFILE...) try at the next event */
    struct conn *c = calloc(1, sizeof(*c));
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    if (!c || (c->fd = fd, epoll_ctl(w->ep, EPOLL_CTL_ADD, fd, &ev))) {
      close(fd);
      free(c);
    }
  }
}

static void *worker_main(void *arg) {
  struct floor_thread *t = arg;
  struct worker *w = malloc(sizeof(*w));
  if (!w)
    die("malloc", ENOMEM);
  w->lfd = t->lfd;
  w->ep = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event lev = {.events = EPOLLIN, .data.ptr = NULL};
  if (w->ep < 0 || epoll_ctl(w->ep, EPOLL_CTL_ADD, w->lfd, &lev))
    die("epoll", errno);
  struct epoll_event evs[EVENTS];
  while (!floor_stopping) {
    int n = epoll_wait(w->ep, evs, EVENTS, 100);
    if (n < 0 && errno != EINTR)
      die("epoll_wait", errno);
    for (int i = 0; i < n; i++) {
      if (evs[i].data.ptr)
        on_readable(w, evs[i].data.ptr);
      else
        on_accept(w);
    }
  }
  return NULL; /* the process exits: the kernel closes everything */
}

int main(int argc, char **argv) {
  return floor_main(argc, argv, "floor_epoll_http_hello", SOCK_NONBLOCK,
                    worker_main);
}

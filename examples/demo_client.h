/*
 * demo_client.h - the clients of the demo's socket cases, shared by the
 * weft programs (blocked_workers.c, accept_storm.c) and their Asio peers
 * (peers/asio_*.cpp), so that both sides are measured by the same code:
 * plain blocking sockets on threads of their own, never the runtime's.
 *
 *  - dc_echo_run: one connection that sends 64 bytes and waits for them to
 *    come back, over and over, until a deadline; it counts the echoes that
 *    complete inside a window and keeps the slowest one that overlaps it.
 *  - dc_storm_run: connection after connection until a deadline: connect,
 *    read the server's reply to its end (EOF), check it, close; it counts
 *    the connections answered and those that failed.
 *  - dc_number: the programs' option values, checked against a range.
 *
 * Header-only, and C that also compiles as C++.
 */
#ifndef WEFT_EXAMPLES_DEMO_CLIENT_H
#define WEFT_EXAMPLES_DEMO_CLIENT_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* The number s, if it is one within [lo, hi]; otherwise usage(), which
 * does not return. */
static inline double dc_number(const char *s, double lo, double hi,
                               void (*usage)(void)) {
  char *end;
  double v = strtod(s, &end);
  if (end == s || *end || !(v >= lo && v <= hi))
    usage();
  return v;
}

/* What the storm's server writes on every connection before it closes. */
#define DC_REPLY "hello\n"
#define DC_REPLY_LEN 6
/* The longest a client waits for the server before it counts a failure. */
#define DC_WAIT_MS 3000

static inline uint64_t dc_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Sleeps until CLOCK_MONOTONIC reaches t (ns). */
static inline void dc_sleep_until(uint64_t t) {
  struct timespec ts;
  ts.tv_sec = (time_t)(t / 1000000000u);
  ts.tv_nsec = (long)(t % 1000000000u);
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
    ;
}

/* A connected blocking socket to 127.0.0.1:port, or -errno. */
static inline int dc_connect(unsigned port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  return fd;
}

/* Waits until fd is readable, at most until the deadline (ns): 1 when it
 * is, 0 when the deadline came first, -errno. */
static inline int dc_wait_readable(int fd, uint64_t deadline) {
  for (;;) {
    uint64_t now = dc_now_ns();
    if (now >= deadline)
      return 0;
    struct pollfd p;
    p.fd = fd;
    p.events = POLLIN;
    p.revents = 0;
    int ms = (int)((deadline - now + 999999) / 1000000);
    int n = poll(&p, 1, ms);
    if (n > 0)
      return 1;
    if (n < 0 && errno != EINTR)
      return -errno;
  }
}

struct dc_echo {
  unsigned port;
  uint64_t w0, w1; /* the window (CLOCK_MONOTONIC ns) */
  uint64_t end;    /* stop at this time */
  /* results */
  uint64_t echoes;     /* echoes completed inside [w0, w1] */
  uint64_t slowest_ns; /* the slowest echo that overlapped the window; one
                          still waiting at the end counts until then */
  int err;             /* 0, or the -errno that stopped the client */
};

/* The echo client; a pthread start routine taking a struct dc_echo. */
static inline void *dc_echo_run(void *arg) {
  struct dc_echo *e = (struct dc_echo *)arg;
  char out[64], in[64];
  memset(out, 'x', sizeof(out));
  e->echoes = 0;
  e->slowest_ns = 0;
  e->err = 0;
  int fd = dc_connect(e->port);
  if (fd < 0) {
    e->err = fd;
    return NULL;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  while (dc_now_ns() < e->end && !e->err) {
    uint64_t t0 = dc_now_ns();
    if (send(fd, out, sizeof(out), MSG_NOSIGNAL) != (ssize_t)sizeof(out)) {
      e->err = -errno;
      break;
    }
    size_t got = 0;
    while (got < sizeof(in)) {
      int r = dc_wait_readable(fd, e->end);
      if (r <= 0) { /* the end came first (or an error): stop waiting */
        e->err = r;
        break;
      }
      ssize_t n = recv(fd, in + got, sizeof(in) - got, 0);
      if (n <= 0) {
        e->err = n == 0 ? -ECONNRESET : -errno;
        break;
      }
      got += (size_t)n;
    }
    uint64_t t1 = dc_now_ns();
    if (t0 < e->w1 && t1 > e->w0 && t1 - t0 > e->slowest_ns)
      e->slowest_ns = t1 - t0;
    if (got == sizeof(in) && t1 >= e->w0 && t1 <= e->w1)
      e->echoes++;
  }
  close(fd);
  return NULL;
}

struct dc_storm {
  unsigned port;
  uint64_t end; /* start no connection after this time */
  /* results */
  uint64_t answered; /* connections that got the whole reply, then EOF */
  uint64_t failed;   /* connections refused, reset, cut short or timed out */
  int first_err;     /* the -errno of the first failure (0: none) */
};

/* One storm client; a pthread start routine taking a struct dc_storm. */
static inline void *dc_storm_run(void *arg) {
  struct dc_storm *s = (struct dc_storm *)arg;
  s->answered = 0;
  s->failed = 0;
  s->first_err = 0;
  while (dc_now_ns() < s->end) {
    int err = 0;
    int fd = dc_connect(s->port);
    if (fd < 0) {
      err = fd;
    } else {
      char buf[64];
      size_t got = 0;
      uint64_t deadline = dc_now_ns() + (uint64_t)DC_WAIT_MS * 1000000u;
      for (;;) {
        int r = dc_wait_readable(fd, deadline);
        if (r <= 0) {
          err = r == 0 ? -ETIMEDOUT : r;
          break;
        }
        ssize_t n = recv(fd, buf + got, sizeof(buf) - got, 0);
        if (n < 0) {
          err = -errno;
          break;
        }
        if (n == 0)
          break; /* EOF: the reply is complete */
        got += (size_t)n;
        if (got == sizeof(buf)) {
          err = -EPROTO;
          break;
        }
      }
      if (!err && (got != DC_REPLY_LEN || memcmp(buf, DC_REPLY, got) != 0))
        err = -EPROTO;
      close(fd);
    }
    if (err) {
      s->failed++;
      if (!s->first_err)
        s->first_err = err;
    } else {
      s->answered++;
    }
  }
  return NULL;
}

#endif /* WEFT_EXAMPLES_DEMO_CLIENT_H */

/*
 * netutil.h - what the network examples (echo, http_hello, tcp_proxy, chat)
 * share: the common options (--port, --threads, --host, --unix), address
 * parsing, the runtime and listener set-up that prints "listening on PORT"
 * (or "listening on PATH" for a Unix socket), and
 * stopping on SIGINT or SIGTERM (weft_signal_watch; main waits in
 * weft_rt_wait).
 *
 * Header-only (static inline) so that each example stays one file to build.
 */
#ifndef WEFT_EXAMPLES_NETUTIL_H
#define WEFT_EXAMPLES_NETUTIL_H

#include <weft.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stddef.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

struct ex_opts {
  const char *host;      /* listening address; default 127.0.0.1 */
  const char *unix_path; /* listen on this Unix socket instead (or "@name") */
  unsigned port;         /* 0: a free port */
  unsigned threads;      /* 0: weft's default */
};

static inline void ex_opts_init(struct ex_opts *o) {
  o->host = "127.0.0.1";
  o->unix_path = NULL;
  o->port = 0;
  o->threads = 0;
}

/* Parses an unsigned decimal no larger than max; false if it is not one. */
static inline bool ex_parse_uint(const char *s, unsigned long max,
                                 unsigned long *out) {
  char *end;
  if (!*s || *s == '-' || *s == '+')
    return false;
  errno = 0;
  unsigned long v = strtoul(s, &end, 10);
  if (errno || *end || v > max)
    return false;
  *out = v;
  return true;
}

/* Handles one of the common options (name with its value); returns 1 if it
 * was one, 0 if name is not a common option, -1 if the value is bad. */
static inline int ex_common_opt(struct ex_opts *o, const char *name,
                                const char *val) {
  unsigned long v;
  if (!strcmp(name, "--host")) {
    o->host = val;
    return 1;
  }
  if (!strcmp(name, "--unix")) {
    o->unix_path = val;
    return 1;
  }
  if (!strcmp(name, "--port")) {
    if (!ex_parse_uint(val, 65535, &v))
      return -1;
    o->port = (unsigned)v;
    return 1;
  }
  if (!strcmp(name, "--threads")) {
    if (!ex_parse_uint(val, WEFT_MAX_WORKERS, &v))
      return -1;
    o->threads = (unsigned)v;
    return 1;
  }
  return 0;
}

/* Resolves host (a numeric IPv4 or IPv6 address, or a name) and port into
 * ss. Returns 0 or -EINVAL; runs before the runtime exists, so it may
 * block on the resolver. */
static inline int ex_resolve(const char *host, unsigned port,
                             struct sockaddr_storage *ss, unsigned *len) {
  memset(ss, 0, sizeof(*ss));
  struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
  struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
  if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons((uint16_t)port);
    *len = sizeof(*a4);
    return 0;
  }
  if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons((uint16_t)port);
    *len = sizeof(*a6);
    return 0;
  }
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
  if (getaddrinfo(host, NULL, &hints, &res) != 0)
    return -EINVAL;
  memcpy(ss, res->ai_addr, res->ai_addrlen);
  *len = (unsigned)res->ai_addrlen;
  freeaddrinfo(res);
  if (ss->ss_family == AF_INET)
    a4->sin_port = htons((uint16_t)port);
  else if (ss->ss_family == AF_INET6)
    a6->sin6_port = htons((uint16_t)port);
  else
    return -EINVAL;
  return 0;
}

/* Parses "HOST:PORT" or "[V6ADDR]:PORT" and resolves it. 0 or -EINVAL. */
static inline int ex_resolve_hostport(const char *hp,
                                      struct sockaddr_storage *ss,
                                      unsigned *len) {
  char host[256];
  const char *colon = strrchr(hp, ':');
  unsigned long port;
  if (!colon || !ex_parse_uint(colon + 1, 65535, &port) || port == 0)
    return -EINVAL;
  size_t n = (size_t)(colon - hp);
  if (n >= 2 && hp[0] == '[' && hp[n - 1] == ']') {
    hp++;
    n -= 2;
  }
  if (n == 0 || n >= sizeof(host))
    return -EINVAL;
  memcpy(host, hp, n);
  host[n] = '\0';
  return ex_resolve(host, (unsigned)port, ss, len);
}

/* Creates the runtime with o->threads workers; exits with a message on
 * failure. */
static inline weft_rt *ex_rt_create(const char *prog, const struct ex_opts *o) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = o->threads;
  weft_rt *rt;
  int r = weft_rt_create(&rt, &cfg);
  if (r < 0) {
    fprintf(stderr, "%s: weft_rt_create: %s\n", prog, weft_strerror(r));
    exit(1);
  }
  return rt;
}

/* Listens on the Unix socket o->unix_path. Exits with a message on
 * failure (after destroying rt). A socket file left by an earlier run that
 * is gone is replaced. */
static inline weft_listener *ex_listen_unix(const char *prog, weft_rt *rt,
                                            const struct ex_opts *o,
                                            weft_accept_fn fn, void *arg) {
  struct sockaddr_un a;
  weft_listener *l;
  int r = weft_unix_addr(&a, o->unix_path);
  if (r > 0)
    r = weft_tcp_listen(rt, (struct sockaddr *)&a, (unsigned)r, NULL, fn, arg,
                        &l);
  if (r < 0) {
    fprintf(stderr, "%s: listen on %s: %s\n", prog, o->unix_path,
            weft_strerror(r));
    weft_rt_destroy(rt);
    exit(1);
  }
  return l;
}

/* Listens on o->host:o->port (or o->unix_path). Exits with a message on
 * failure (after destroying rt). */
static inline weft_listener *ex_listen(const char *prog, weft_rt *rt,
                                       const struct ex_opts *o,
                                       weft_accept_fn fn, void *arg) {
  if (o->unix_path)
    return ex_listen_unix(prog, rt, o, fn, arg);
  struct sockaddr_storage ss;
  unsigned len;
  weft_listener *l;
  int r = ex_resolve(o->host, o->port, &ss, &len);
  if (r < 0) {
    fprintf(stderr, "%s: bad --host '%s'\n", prog, o->host);
  } else if ((r = weft_tcp_listen(rt, (struct sockaddr *)&ss, len, NULL, fn,
                                  arg, &l)) < 0) {
    fprintf(stderr, "%s: listen on %s:%u: %s\n", prog, o->host, o->port,
            weft_strerror(r));
  }
  if (r < 0) {
    weft_rt_destroy(rt);
    exit(1);
  }
  return l;
}

/* The port of an IPv4 or IPv6 address. */
static inline unsigned ex_port_of(const struct sockaddr_storage *ss) {
  return ss->ss_family == AF_INET6
             ? ntohs(((const struct sockaddr_in6 *)ss)->sin6_port)
             : ntohs(((const struct sockaddr_in *)ss)->sin_port);
}

/* Prints "listening on PORT" (or the Unix socket's path, or "@name") and
 * flushes: what scripts and tests wait for. */
static inline void ex_print_listening(weft_listener *l) {
  struct sockaddr_storage ss;
  unsigned len = sizeof(ss);
  if (weft_listener_addr(l, (struct sockaddr *)&ss, &len) < 0)
    return;
  if (ss.ss_family == AF_UNIX) {
    const struct sockaddr_un *u = (const struct sockaddr_un *)&ss;
    size_t n = len - offsetof(struct sockaddr_un, sun_path);
    if (n > 0 && u->sun_path[0] == '\0')
      printf("listening on @%.*s\n", (int)(n - 1), u->sun_path + 1);
    else
      printf("listening on %s\n", u->sun_path);
  } else {
    printf("listening on %u\n", ex_port_of(&ss));
  }
  fflush(stdout);
}

/* What the first SIGINT or SIGTERM stops: weft runs ex_on_stop for it on
 * a strand (both signals' watchers share it, so it runs once). */
struct ex_stopper {
  weft_rt *rt;
  weft_listener *l;
  weft_fn before; /* the example's own first step, or NULL */
  void *arg;
  bool stopping; /* on the strand only */
};

static inline void ex_on_stop(void *arg, int signo, uint64_t count) {
  struct ex_stopper *st = arg;
  (void)signo;
  (void)count;
  if (st->stopping)
    return;
  st->stopping = true;
  if (st->before)
    st->before(st->arg);
  if (st->l)
    weft_listener_close(st->l, NULL, NULL);
  /* NOWAIT: a handler cannot wait for its own runtime; main waits. */
  weft_rt_shutdown(st->rt, WEFT_SHUTDOWN_DRAIN | WEFT_SHUTDOWN_NOWAIT);
}

/* Prints "listening on ..." once SIGINT and SIGTERM are watched (so a
 * signal sent as soon as the line is read stops the server cleanly; with
 * l NULL, announce(announce_arg) says it instead; with both, announce
 * prints what follows that line), then
 * serves until SIGINT or SIGTERM: then before(arg) runs (if not NULL),
 * the listener closes, and the runtime shuts down (DRAIN: weft closes
 * every connection and UDP socket still open, their pending callbacks run with
 * -ECANCELED, then their close callbacks); this waits for that, destroys
 * the runtime and returns 0, or 1 after a message. */
static inline int ex_serve_with(const char *prog, weft_rt *rt, weft_listener *l,
                                weft_fn before, void *arg, weft_fn announce,
                                void *announce_arg) {
  static struct ex_stopper st;
  st.rt = rt;
  st.l = l;
  st.before = before;
  st.arg = arg;
  weft_strand *s;
  weft_signal *w;
  int r = weft_strand_create(rt, &s);
  if (!r)
    r = weft_signal_watch(rt, s, SIGINT, ex_on_stop, &st, &w);
  if (!r)
    r = weft_signal_watch(rt, s, SIGTERM, ex_on_stop, &st, &w);
  if (r < 0) {
    fprintf(stderr, "%s: weft_signal_watch: %s\n", prog, weft_strerror(r));
    weft_rt_destroy(rt);
    return 1;
  }
  if (l)
    ex_print_listening(l);
  if (announce)
    announce(announce_arg);
  r = weft_rt_wait(rt, UINT64_MAX);
  if (r < 0)
    fprintf(stderr, "%s: weft_rt_wait: %s\n", prog, weft_strerror(r));
  weft_strand_release(s);
  int d = weft_rt_destroy(rt); /* drops the watchers */
  if (d < 0)
    fprintf(stderr, "%s: weft_rt_destroy: %s\n", prog, weft_strerror(d));
  return r < 0 || d < 0;
}

static inline int ex_serve(const char *prog, weft_rt *rt, weft_listener *l,
                           weft_fn before, void *arg) {
  return ex_serve_with(prog, rt, l, before, arg, NULL, NULL);
}

#endif /* WEFT_EXAMPLES_NETUTIL_H */

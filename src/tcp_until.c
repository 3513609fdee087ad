/*
 * tcp_until.c - reading until a delimiter (weft_tcp_read_until): a read
 * that goes on into the caller's buffer, one weft_tcp_read at a time,
 * until the buffer holds the delimiter or is full. Owns struct
 * weft__until, allocated on a connection's first such read and freed when
 * it closes. Everything here runs on the connection's strand.
 *
 * Bytes after the delimiter stay in the caller's buffer (`have` says how
 * many it holds), so the next message is never lost and weft keeps none
 * of its own. When the bytes already held answer the call, the answer is
 * posted to the strand rather than called inside the call; meanwhile the
 * read counts as in flight (ready: other reads get -EBUSY), and a close
 * answers it first, with the close's status (weft__until_cancel), as it
 * does every read in flight, before the close callback.
 */
#include "tcp_until.h"

#include "tcp.h"
#include "tcp_timeout.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct weft__until {
  char *buf;
  size_t len, have;
  const void *delim;
  size_t dlen;
  weft_until_fn fn;
  void *arg;
  size_t found; /* ready: the message's length */
  bool ready;   /* the answer is posted (until_ready) */
};

/* The end of the first delimiter in buf[0, have) at or after from, or 0. */
static size_t find(const struct weft__until *u, size_t from) {
  if (u->have < u->dlen)
    return 0;
  const char *p = memmem(u->buf + from, u->have - from, u->delim, u->dlen);
  return p ? (size_t)(p - u->buf) + u->dlen : 0;
}

static void deliver(struct weft__conn *c, long n) {
  struct weft__until *u = weft__tcp_until(c);
  u->ready = false;
  weft__calling((void *)u->fn);
  u->fn(u->arg, (weft_tcp *)c, n, u->have);
}

/* The read callback of each step. */
static void until_read(void *arg, weft_tcp *tcp, long n) {
  struct weft__conn *c = arg;
  struct weft__until *u = weft__tcp_until(c);
  if (n <= 0) {
    deliver(c, n); /* end of file (0), an error, or the close's status */
    return;
  }
  /* A delimiter can straddle what was held and what came. */
  size_t from = u->have > u->dlen - 1 ? u->have - (u->dlen - 1) : 0;
  u->have += (size_t)n;
  size_t end = find(u, from);
  if (end) {
    deliver(c, (long)end);
    return;
  }
  if (u->have == u->len) {
    deliver(c, -EMSGSIZE);
    return;
  }
  int r = weft_tcp_read(tcp, u->buf + u->have, u->len - u->have, until_read, c);
  /* Refused because the connection closes (a close asked for in this run
   * of the strand, or a shutdown): the wait ends as the close ends every
   * operation in flight. */
  if (r)
    deliver(c, r == -EBADF || r == -ESHUTDOWN ? weft__tcp_close_status(c) : r);
}

/* The answer for a delimiter already held; a close may have answered
 * first (weft__until_cancel), leaving nothing to do. */
static void until_ready(void *arg) {
  struct weft__conn *c = arg;
  struct weft__until *u = weft__tcp_until(c);
  if (!u || !u->ready)
    return;
  deliver(c, u->found ? (long)u->found : -EMSGSIZE);
}

bool weft__until_pending(const struct weft__conn *c) {
  struct weft__until *u = weft__tcp_until(c);
  return u && u->ready;
}

void weft__until_cancel(struct weft__conn *c, int status) {
  if (weft__until_pending(c))
    deliver(c, status);
}

int weft_tcp_read_until(weft_tcp *tcp, void *buf, size_t len, size_t have,
                        const void *delim, size_t dlen, weft_until_fn fn,
                        void *arg) {
  struct weft__conn *c = weft__conn_of(tcp);
  int r = weft__tcp_usable(c, "weft_tcp_read_until");
  if (r)
    return r;
  if (!buf || !delim || !fn || !dlen || dlen > len || have > len ||
      len > ((size_t)1 << 30))
    return -EINVAL;
  if (c->reading || weft__until_pending(c))
    return -EBUSY;
  struct weft__until *u = weft__tcp_until(c);
  if (!u &&
      (!weft__tcp_more(c) || !(u = c->more->until = calloc(1, sizeof(*u)))))
    return -ENOMEM;
  u->buf = buf;
  u->len = len;
  u->have = have;
  u->delim = delim;
  u->dlen = dlen;
  u->fn = fn;
  u->arg = arg;
  size_t end = find(u, 0);
  if (!end && have < len)
    return weft_tcp_read(tcp, u->buf + have, len - have, until_read, c);
  /* Answered by what is held (found, or full without it): from the
   * strand, after this call has returned. */
  u->found = end;
  r = weft_post_ex(c->s.strand, until_ready, until_ready, c);
  if (r)
    return r;
  u->ready = true; /* busy meanwhile; a close answers it first */
  return 0;
}

void weft__until_free(struct weft__conn *c) {
  if (!c->more)
    return;
  free(c->more->until);
  c->more->until = NULL;
}

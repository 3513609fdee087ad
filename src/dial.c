/*
 * dial.c - connecting by name (weft_tcp_dial): a lookup (resolve.c), then
 * a connect (tcp.c) to each address in turn until one succeeds. Owns the
 * dial request and, when the caller gave no strand, the strand it makes.
 *
 * Order (after RFC 8305, section 4): the addresses as getaddrinfo sorted
 * them (RFC 6724), interleaved by family starting with the first one's,
 * so a host whose IPv6 addresses all fail reaches its IPv4 ones after one
 * attempt, not after all of them. Attempts run one after another, each
 * with its own timeout; they are not raced with a stagger as in Happy
 * Eyeballs, which would hold several sockets per connect.
 *
 * Everything runs on the dial's strand (the lookup's callback and every
 * attempt's connect callback), but weft_tcp_dial_cancel may come from any
 * thread: `lock` guards what it reads (stage, lookup, conn, cancelled),
 * and `refs` keeps the request while a cancel is inside it (the dial
 * holds one reference until fn has returned).
 *
 * A strand the dial makes is marked as weft's (strand.h: released with
 * its last socket): the next attempt is opened inside the failed one's
 * connect callback, so a socket holds the strand from the first attempt
 * on. A dial that never opened a socket releases it itself.
 */
#include "rt.h"
#include "strand.h"
#include "thread.h"

#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ADDRS 16

enum { D_LOOKUP, D_CONNECT, D_DONE };

struct weft_dial {
  weft_rt *rt;
  weft_strand *strand;
  bool own_strand, opened; /* made the strand; opened a socket on it */
  weft_connect_fn fn;
  void *arg;
  uint64_t attempt_ns;
  pthread_mutex_t lock;
  int stage;
  bool cancelled;
  weft_lookup *lookup;
  weft_tcp *conn; /* the attempt in flight */
  _Atomic uint32_t refs;
  int err; /* the last attempt's */
  unsigned n, next;
  struct sockaddr_storage addrs[MAX_ADDRS];
  unsigned lens[MAX_ADDRS];
};

static void dial_unref(struct weft_dial *d) {
  if (weft__fetch_sub(&d->refs, 1, WA_AR) == 1) {
    pthread_mutex_destroy(&d->lock);
    free(d);
  }
}

/* Calls fn once with the result; on the dial's strand. */
static void finish(struct weft_dial *d, weft_tcp *conn, int status) {
  pthread_mutex_lock(&d->lock);
  d->stage = D_DONE;
  d->conn = NULL;
  bool cancelled = d->cancelled;
  pthread_mutex_unlock(&d->lock);
  /* A cancel that returned 0 (it came before D_DONE, maybe after the
   * caller's own look at the flag) promised fn -ECANCELED: a connection
   * that got through is closed. */
  if (cancelled && status != -ECANCELED) {
    if (conn)
      weft_tcp_close(conn, 0);
    conn = NULL;
    status = -ECANCELED;
  }
  weft__calling((void *)d->fn);
  d->fn(d->arg, conn, status);
  if (d->own_strand && !d->opened)
    weft_strand_release(d->strand);
  dial_unref(d);
}

static void on_attempt(void *arg, weft_tcp *conn, int status);

/* Opens the next attempt that can be opened; false when none is left. */
static bool attempt_next(struct weft_dial *d) {
  while (d->next < d->n) {
    unsigned i = d->next++;
    weft_tcp *c;
    pthread_mutex_lock(&d->lock);
    int r = d->cancelled
                ? -ECANCELED
                : weft_tcp_connect(d->rt, d->strand,
                                   (struct sockaddr *)&d->addrs[i], d->lens[i],
                                   d->attempt_ns, on_attempt, d, &c);
    if (!r) {
      d->stage = D_CONNECT;
      d->conn = c;
      d->opened = true;
    }
    pthread_mutex_unlock(&d->lock);
    if (!r)
      return true;
    d->err = r == -ESHUTDOWN ? -ECANCELED : r; /* a shutdown cancels it */
    if (r == -ECANCELED || r == -ESHUTDOWN)
      return false;
  }
  return false;
}

static void on_attempt(void *arg, weft_tcp *conn, int status) {
  struct weft_dial *d = arg;
  pthread_mutex_lock(&d->lock);
  bool cancelled = d->cancelled;
  d->conn = NULL; /* it closes itself (failed) or is the user's now */
  pthread_mutex_unlock(&d->lock);
  if (!status && cancelled) {
    weft_tcp_close(conn, 0); /* -EALREADY if the cancel's close came first */
    status = -ECANCELED;
  }
  if (!status) {
    finish(d, conn, 0);
    return;
  }
  d->err = cancelled ? -ECANCELED : status;
  /* This failed connection holds the strand until the next one opens. */
  if (cancelled || !attempt_next(d))
    finish(d, NULL, d->err);
}

/* Takes the addresses of res, interleaved by family (RFC 8305): the
 * first address's family, then the other, and so on. */
static void take_addrs(struct weft_dial *d, const struct addrinfo *res) {
  const struct addrinfo *side[2][MAX_ADDRS];
  unsigned cnt[2] = {0, 0};
  for (const struct addrinfo *a = res; a; a = a->ai_next) {
    int k = a->ai_family != res->ai_family;
    if (a->ai_addrlen <= sizeof(struct sockaddr_storage) && cnt[k] < MAX_ADDRS)
      side[k][cnt[k]++] = a;
  }
  for (unsigned i = 0; d->n < MAX_ADDRS && (i < cnt[0] || i < cnt[1]); i++)
    for (int k = 0; k < 2 && d->n < MAX_ADDRS; k++)
      if (i < cnt[k]) {
        memcpy(&d->addrs[d->n], side[k][i]->ai_addr, side[k][i]->ai_addrlen);
        d->lens[d->n++] = side[k][i]->ai_addrlen;
      }
}

static void on_resolved(void *arg, int status, struct addrinfo *res) {
  struct weft_dial *d = arg;
  pthread_mutex_lock(&d->lock);
  d->lookup = NULL;
  if (d->cancelled)
    status = -ECANCELED;
  pthread_mutex_unlock(&d->lock);
  if (status) {
    finish(d, NULL, status);
    return;
  }
  take_addrs(d, res);
  d->err = WEFT_EAI_NONAME; /* no address a socket could be made for */
  if (!attempt_next(d))
    finish(d, NULL, d->err);
}

int weft_tcp_dial(weft_rt *rt, weft_strand *s, const char *host,
                  const char *service, uint64_t attempt_ns, weft_connect_fn fn,
                  void *arg, weft_dial **out) {
  if (!rt || !host || !service || !fn)
    return -EINVAL;
  if (weft__forked(rt))
    return -ECHILD;
  int sr = weft__strand_usable(rt, s);
  if (sr)
    return sr;
  struct weft_dial *d = calloc(1, sizeof(*d));
  if (!d)
    return -ENOMEM;
  d->rt = rt;
  d->fn = fn;
  d->arg = arg;
  d->attempt_ns = attempt_ns;
  d->strand = s;
  pthread_mutex_init(&d->lock, NULL);
  weft__store(&d->refs, 1, WA_RLX);
  int r = 0;
  if (!s) {
    r = weft_strand_create(rt, &d->strand);
    if (!r) {
      d->own_strand = true;
      d->strand->weft_made = true;
    }
  }
  struct addrinfo hints = {.ai_flags = AI_ADDRCONFIG,
                           .ai_socktype = SOCK_STREAM};
  if (!r) {
    /* Under the lock: on_resolved, which may run at once, takes it. */
    pthread_mutex_lock(&d->lock);
    r = weft_resolve(rt, d->strand, host, service, &hints, on_resolved, d,
                     &d->lookup);
    pthread_mutex_unlock(&d->lock);
  }
  if (r) {
    if (d->own_strand)
      weft_strand_release(d->strand);
    pthread_mutex_destroy(&d->lock);
    free(d);
    return r;
  }
  if (out)
    *out = d; /* a value only: fn may have run, and d gone, by now */
  return 0;
}

int weft_tcp_dial_cancel(weft_dial *d) {
  if (!d)
    return -EINVAL;
  if (weft__forked(d->rt))
    return -ECHILD;
  weft__fetch_add(&d->refs, 1, WA_RLX);
  pthread_mutex_lock(&d->lock);
  int r = 0;
  if (d->stage == D_DONE || d->cancelled) {
    r = -EALREADY;
  } else {
    /* fn gets -ECANCELED whatever these return: on_resolved and
     * on_attempt see the flag (a result that won, a lookup a shutdown
     * keeps running). */
    d->cancelled = true;
    if (d->lookup)
      weft_resolve_cancel(d->lookup);
    else if (d->conn)
      weft_tcp_close(d->conn, 0);
  }
  pthread_mutex_unlock(&d->lock);
  dial_unref(d);
  return r;
}

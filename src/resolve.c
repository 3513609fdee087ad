/*
 * resolve.c - name resolution (weft_resolve): getaddrinfo(3) on the
 * resolver's pool (blocking.c), which has threads and a queue of its own,
 * so a silent name server holds at most resolve_threads threads and never
 * one that weft_blocking's jobs (files) need. Owns the lookup requests.
 *
 * getaddrinfo cannot be interrupted, so a cancel does not stop a running
 * lookup: it answers the user at once and leaves the lookup to finish on
 * its thread, whose result is then freed unseen. Who calls the user's fn
 * is decided on one word, `state`: the lookup's end (its done, on any
 * worker) and weft_resolve_cancel race a CAS from PENDING, and the winner
 * alone posts fn to the user's strand (with the result, or -ECANCELED);
 * the loser never touches that strand, which the user may release as
 * soon as fn has run. A request is freed by
 * the last of its two possible holders: the pool job (always) and a
 * cancel's posted handler (when the cancel won); `refs` counts them. The
 * cancel takes its reference before its CAS, so the job's done, which
 * drops its own after the CAS, cannot free the request under it. Every
 * atomic here is seq_cst: a cancel is rare, and the argument stays that
 * simple.
 */
#include "blocking.h"
#include "rt.h"
#include "strand.h"
#include "thread.h"

#include <errno.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { R_PENDING, R_DONE, R_CANCELLED };

struct weft_lookup {
  weft_rt *rt;
  weft_strand *strand;
  weft_resolve_fn fn;
  void *arg;
  weft_job job;
  _Atomic uint32_t state;
  _Atomic uint32_t refs;
  bool has_hints;
  struct addrinfo hints;
  int status; /* the lookup's, written by the pool thread before done */
  struct addrinfo *res;
  const char *host, *service; /* copies, in this allocation */
  char strings[];
};

static void req_unref(struct weft_lookup *r) {
  if (weft__fetch_sub(&r->refs, 1, WA_SC) == 1)
    free(r);
}

/* getaddrinfo's EAI_* as weft's errors. */
static int eai_error(int eai, int saved_errno) {
  switch (eai) {
  case 0:
    return 0;
  case EAI_NONAME:
  case EAI_NODATA:
  case EAI_SERVICE:
  case EAI_ADDRFAMILY:
    return WEFT_EAI_NONAME;
  case EAI_AGAIN:
    return WEFT_EAI_AGAIN;
  case EAI_FAIL:
    return WEFT_EAI_FAIL;
  case EAI_MEMORY:
    return -ENOMEM;
  case EAI_SYSTEM:
    return saved_errno > 0 ? -saved_errno : -EIO;
  case EAI_OVERFLOW:
    return -EOVERFLOW;
  default: /* EAI_BADFLAGS, EAI_FAMILY, EAI_SOCKTYPE */
    return -EINVAL;
  }
}

/* On a resolver thread. Returns 0: a cancelled job's done gets
 * -ECANCELED instead, which is how done tells the two apart. */
static long lookup(void *arg) {
  struct weft_lookup *r = arg;
  errno = 0;
  int eai = getaddrinfo(r->host, r->service, r->has_hints ? &r->hints : NULL,
                        &r->res);
  r->status = eai_error(eai, errno);
  if (r->status)
    r->res = NULL;
  return 0;
}

/* The result, on the user's strand. */
static void result_run(void *arg) {
  struct weft_lookup *r = arg;
  weft__calling((void *)r->fn);
  r->fn(r->arg, r->status, r->res);
  if (r->res)
    freeaddrinfo(r->res);
  req_unref(r);
}

/* On any worker: a lookup that lost to a cancel must not touch the user's
 * strand, which the user may release once told -ECANCELED. */
static void lookup_done(void *arg, long result) {
  struct weft_lookup *r = arg;
  if (result) { /* cancelled in the queue, by weft_resolve_cancel or a
                 * CANCEL shutdown: getaddrinfo never ran */
    r->status = (int)result;
    r->res = NULL;
  }
  uint32_t pending = R_PENDING;
  if (!weft__cas(&r->state, &pending, R_DONE, WA_SC, WA_SC)) {
    if (r->res)
      freeaddrinfo(r->res);
    req_unref(r);
    return;
  }
  if (!r->strand) {
    result_run(r);
    return;
  }
  struct weft__shard *local = weft__local_begin(r->rt);
  struct weft__node *n;
  while (!(n = weft__node_new(r->rt, local, result_run, result_run, r))) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL); /* out of memory: retry, never lose fn */
  }
  weft__node_post_unhold(r->rt, local, r->strand, n);
  weft__local_end(local);
}

static void cancelled(void *arg) {
  struct weft_lookup *r = arg;
  weft__calling((void *)r->fn);
  r->fn(r->arg, -ECANCELED, NULL);
  req_unref(r);
}

static int check(weft_rt *rt, weft_strand *s, const char *host,
                 const char *service, const struct addrinfo *hints,
                 weft_resolve_fn fn) {
  if (!rt || !fn || (!host && !service))
    return -EINVAL;
  if (hints && (hints->ai_addr || hints->ai_canonname || hints->ai_next ||
                hints->ai_addrlen))
    return -EINVAL; /* getaddrinfo(3): those must be 0 or NULL */
  if (weft__forked(rt))
    return -ECHILD;
  int sr = weft__strand_usable(rt, s);
  if (sr)
    return sr;
  /* The name service is the network, which a simulation has not yet. */
  return weft__simulated(rt) ? -ENOTSUP : 0;
}

int weft_resolve(weft_rt *rt, weft_strand *s, const char *host,
                 const char *service, const struct addrinfo *hints,
                 weft_resolve_fn fn, void *arg, weft_lookup **out) {
  int err = check(rt, s, host, service, hints, fn);
  if (err)
    return err;
  size_t hl = host ? strlen(host) + 1 : 0;
  size_t sl = service ? strlen(service) + 1 : 0;
  struct weft_lookup *r = calloc(1, sizeof(*r) + hl + sl);
  if (!r)
    return -ENOMEM;
  r->rt = rt;
  r->strand = s;
  r->fn = fn;
  r->arg = arg;
  if (hints) {
    r->has_hints = true;
    r->hints = *hints;
  }
  if (host)
    r->host = memcpy(r->strings, host, hl);
  if (service)
    r->service = memcpy(r->strings + hl, service, sl);
  weft__store(&r->state, R_PENDING, WA_RLX);
  weft__store(&r->refs, 1, WA_RLX);
  weft__strand_hold(s); /* dropped after fn's post */
  err = weft__blocking_submit(rt, rt->resolver, lookup, r, NULL, lookup_done,
                              &r->job);
  if (err) {
    weft__strand_unhold(s);
    free(r);
    return err;
  }
  if (out)
    *out = r; /* a value only: fn may have run, and r gone, by now */
  return 0;
}

int weft_resolve_cancel(weft_lookup *r) {
  if (!r)
    return -EINVAL;
  weft_rt *rt = r->rt;
  if (weft__forked(rt))
    return -ECHILD;
  /* The post below must reach a runtime that has not finished: inside a
   * handler the runtime cannot finish; outside, count as busy work. */
  struct weft__shard *local = weft__local_begin(rt);
  if (!local && weft__busy_enter(rt)) {
    weft__local_end(local);
    return -ESHUTDOWN;
  }
  weft__fetch_add(&r->refs, 1, WA_SC);
  uint32_t pending = R_PENDING;
  int ret = 0;
  weft_job job = 0;
  if (weft__cas(&r->state, &pending, R_CANCELLED, WA_SC, WA_SC)) {
    /* fn is ours to call. */
    job = r->job; /* read while our reference keeps r */
    struct weft__node *n;
    while (!(n = weft__node_new(rt, local, cancelled, cancelled, r))) {
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL); /* out of memory: retry, never lose fn */
    }
    weft__node_post_unhold(rt, local, r->strand, n);
  } else {
    req_unref(r);
    ret = -EALREADY;
  }
  /* After local's use ends: the cancel's delivery brackets the shard on
   * its own, and the monitor may hand it on between its end and ours. A
   * queued job leaves the pool now rather than run for nobody (its done
   * still comes, with -ECANCELED). The runtime cannot finish meanwhile:
   * inside a handler by construction, outside by the busy count. */
  weft__local_end(local);
  if (job)
    weft__blocking_cancel_in(rt, rt->resolver, job);
  if (!local)
    weft__busy_drop(rt, 1);
  return ret;
}

/*
 * trace.c - the flight recorder's rings, their threads, and the dump
 * (trace.h says what each owns).
 *
 * Reading a ring while its thread writes it. The writer, for event k:
 *     claim = k + 1; the event's four words, each a release store;
 *     done = k + 1 (release).
 * A reader:
 *     d = done (acquire); copy events [max(0, d - size), d), each word
 *     an acquire load; c = claim; keep event j only if j >= c - size.
 * Each event j < d was written whole before the writer's store of j + 1
 * <= d in done, which the acquire load of d reads from (or a later
 * store), so the copy sees its words unless the writer has since
 * overwritten them, which it does only as event j + size. If the copy
 * read any word of event k = j + size, it read a release store that
 * followed the writer's store of k + 1 in claim; that acquire load makes
 * the claim visible to the later load of c, so c >= k + 1 and j is
 * dropped (j + size = k < c). A copy that saw only event j's words is
 * kept or dropped by the same test: dropping more than needed, never
 * keeping a torn event. All words are atomics, so a torn read is never a
 * data race; on x86 these releases and acquires are plain moves, and no
 * standalone fence is used (GCC's ThreadSanitizer does not support one).
 * The newest event is read too: a stuck handler's run is the last its
 * thread wrote.
 */
#include "trace.h"

#include "hist.h"
#include "log.h"
#include "rt.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

_Thread_local struct weft__ring *weft__tls_ring
    __attribute__((tls_model("initial-exec")));

#define DEFAULT_TRACE_BYTES ((size_t)256 * 1024)
#define STALL_DUMP_GAP_NS (10ull * 1000000000u)

int weft__trace_init(weft_rt *rt, const weft_config *c) {
  struct weft__trace *tr = &rt->trace;
  pthread_mutex_init(&tr->lock, NULL);
  const char *env = getenv("WEFT_TRACE");
  if ((c->flags & WEFT_CONFIG_NO_TRACE) || (env && !strcmp(env, "off")))
    return 0;
  size_t bytes = c->trace_bytes ? c->trace_bytes : DEFAULT_TRACE_BYTES;
  size_t events = 1;
  while (events * 2 * sizeof(struct weft__ev) <= bytes)
    events *= 2;
  const char *dir = c->trace_dir ? c->trace_dir : getenv("WEFT_TRACE_DIR");
  if (dir && *dir && !(tr->dir = strdup(dir)))
    return -ENOMEM;
  tr->events = events;
  tr->ns0 = weft__now_ns();
  tr->tick0 = weft__ticks();
  return 0;
}

void weft__trace_free(weft_rt *rt) {
  struct weft__trace *tr = &rt->trace;
  for (unsigned i = 0; i < tr->nrings; i++)
    free(tr->rings[i]);
  free(tr->rings);
  free(tr->dir);
  pthread_mutex_destroy(&tr->lock);
}

/* A free ring for (role, index): the one it had, else a new one. Lock
 * held. NULL: no memory. */
static struct weft__ring *ring_take(struct weft__trace *tr, int role,
                                    unsigned index) {
  for (unsigned i = 0; i < tr->nrings; i++) {
    struct weft__ring *r = tr->rings[i];
    if (!r->in_use && r->role == role && r->index == index)
      return r;
  }
  if (tr->nrings == tr->cap) {
    unsigned cap = tr->cap ? 2 * tr->cap : 16;
    struct weft__ring **n = realloc(tr->rings, cap * sizeof(*n));
    if (!n)
      return NULL;
    tr->rings = n;
    tr->cap = cap;
  }
  /* The monitor and pool threads write a few events a stall or a job, and
   * a pool may run 64 threads: an eighth of a worker's ring each. */
  size_t events = role == WEFT_RING_WORKER || tr->events < 1024
                      ? tr->events
                      : tr->events / 8;
  size_t size = sizeof(struct weft__ring) + events * sizeof(struct weft__ev);
  struct weft__ring *r = aligned_alloc(WEFT_CACHELINE, (size + 63) & ~63ul);
  if (!r)
    return NULL;
  memset(r, 0, sizeof(*r)); /* events: kept only once written (above) */
  r->mask = events - 1;
  r->owner = tr;
  r->role = role;
  r->index = index;
  tr->rings[tr->nrings++] = r;
  return r;
}

void weft__trace_attach(weft_rt *rt, int role, unsigned index) {
  struct weft__trace *tr = &rt->trace;
  weft__tls_ring = NULL;
  if (!tr->events)
    return;
  pthread_mutex_lock(&tr->lock);
  struct weft__ring *r = ring_take(tr, role, index);
  if (r) {
    r->in_use = true;
    weft__store(&r->tid, (int)syscall(SYS_gettid), WA_RLX);
  }
  pthread_mutex_unlock(&tr->lock);
  weft__tls_ring = r;
}

void weft__trace_detach(void) {
  struct weft__ring *r = weft__tls_ring;
  if (!r)
    return;
  weft__trace_flush();
  weft__tls_ring = NULL;
  pthread_mutex_lock(&r->owner->lock);
  r->in_use = false;
  pthread_mutex_unlock(&r->owner->lock);
}

/* ---- the dump ------------------------------------------------------------ */

struct rec {
  uint64_t t, w, a, b;
};

/* A ring's kept events, oldest first (the argument above); returns how
 * many, at most tr->events, into out. */
static size_t ring_copy_once(const struct weft__ring *r, struct rec *out) {
  uint64_t size = r->mask + 1;
  uint64_t hi = weft__load(&r->done, WA_ACQ);
  uint64_t lo = hi > size ? hi - size : 0;
  for (uint64_t j = lo; j < hi; j++) {
    const struct weft__ev *e = &r->ev[j & r->mask];
    out[j - lo] =
        (struct rec){weft__load(&e->t, WA_ACQ), weft__load(&e->w, WA_ACQ),
                     weft__load(&e->a, WA_ACQ), weft__load(&e->b, WA_ACQ)};
  }
  uint64_t c = weft__load(&r->claim, WA_RLX);
  uint64_t keep = c > size ? c - size : 0;
  if (keep <= lo)
    return hi - lo;
  if (keep >= hi)
    return 0;
  memmove(out, out + (keep - lo), (hi - keep) * sizeof(*out));
  return hi - keep;
}

/* A thread running millions of events a second overwrites its whole ring
 * in a millisecond: a copy that lost its CPU meanwhile keeps little. Up to
 * four tries, for at least half a ring or the whole of a ring not full. */
static size_t ring_copy(const struct weft__ring *r, struct rec *out) {
  size_t size = r->mask + 1, n = 0;
  for (int i = 0; i < 4; i++) {
    uint64_t done = weft__load(&r->done, WA_RLX);
    n = ring_copy_once(r, out);
    if (n >= size / 2 || n >= done)
      break;
  }
  return n;
}

/* Buffered writes to a descriptor; the first error sticks. */
struct out {
  int fd, err;
  size_t n;
  char buf[1 << 16];
};

static void out_flush(struct out *o) {
  size_t done = 0;
  while (!o->err && done < o->n) {
    ssize_t w = write(o->fd, o->buf + done, o->n - done);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      o->err = w < 0 ? -errno : -EIO;
    else
      done += (size_t)w;
  }
  o->n = 0;
}

__attribute__((format(printf, 2, 3))) static void
out_put(struct out *o, const char *fmt, ...) {
  if (sizeof(o->buf) - o->n < 1024)
    out_flush(o);
  va_list ap;
  va_start(ap, fmt);
  int w = vsnprintf(o->buf + o->n, sizeof(o->buf) - o->n, fmt, ap);
  va_end(ap);
  if (w > 0)
    o->n += (size_t)w < sizeof(o->buf) - o->n ? (size_t)w
                                              : sizeof(o->buf) - o->n - 1;
}

static const char *const type_names[WEFT_EV_COUNT] = {
    [WEFT_EV_RUN] = "run",       [WEFT_EV_END] = "end",
    [WEFT_EV_PARK] = "park",     [WEFT_EV_UNPARK] = "unpark",
    [WEFT_EV_WAKE] = "wake",     [WEFT_EV_STEAL] = "steal",
    [WEFT_EV_STALL] = "stall",   [WEFT_EV_HANDOFF] = "handoff",
    [WEFT_EV_LOST] = "lost",     [WEFT_EV_TIMER] = "timer",
    [WEFT_EV_SUBMIT] = "submit", [WEFT_EV_COMPLETE] = "complete",
    [WEFT_EV_JOB] = "job",       [WEFT_EV_JOB_END] = "job_end",
};

/* Which of an event's words are code or object addresses. */
static bool a_is_addr(unsigned type) {
  return type == WEFT_EV_RUN || type == WEFT_EV_END || type == WEFT_EV_STALL ||
         type == WEFT_EV_TIMER || type == WEFT_EV_JOB ||
         type == WEFT_EV_JOB_END;
}
static bool b_is_addr(unsigned type) {
  return type == WEFT_EV_RUN || type == WEFT_EV_STALL;
}

static int cmp_u64(const void *x, const void *y) {
  uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return a < b ? -1 : a > b;
}

/* One "sym" line per distinct function address the events name. */
static int put_syms(struct out *o, struct rec *const *ev, const size_t *n,
                    unsigned nrings) {
  size_t total = 0, k = 0;
  for (unsigned i = 0; i < nrings; i++)
    total += n[i];
  uint64_t *addr = malloc((total ? total : 1) * sizeof(*addr));
  if (!addr)
    return -ENOMEM;
  for (unsigned i = 0; i < nrings; i++)
    for (size_t j = 0; j < n[i]; j++)
      if (a_is_addr(ev[i][j].w & 0xff) && ev[i][j].a)
        addr[k++] = ev[i][j].a;
  qsort(addr, k, sizeof(*addr), cmp_u64);
  char name[512];
  for (size_t j = 0; j < k; j++)
    if (!j || addr[j] != addr[j - 1])
      out_put(o, "sym 0x%" PRIx64 " %s\n", addr[j],
              weft__addr_name((const void *)(uintptr_t)addr[j], name,
                              sizeof(name)));
  free(addr);
  return 0;
}

/* Ticks to CLOCK_MONOTONIC ns, scaled between the recorder's start and
 * now: over a long run more exact than the process's scale (hist.c, timed
 * over 200 us to a part in a thousand, seconds an hour), which serves a
 * dump made less than 10 ms after the start. */
struct scale {
  uint64_t tick0, ns0;
  double ns_per_tick;
};

static struct scale scale_now(const struct weft__trace *tr, uint64_t *now) {
  struct scale s = {tr->tick0, tr->ns0, (double)weft__tick_mult / 4294967296.0};
  uint64_t ns = weft__now_ns(), tick = weft__ticks();
  if (weft__trace_tsc && ns - tr->ns0 >= 10000000u && tick > tr->tick0)
    s.ns_per_tick = (double)(ns - tr->ns0) / (double)(tick - tr->tick0);
  *now = ns;
  return s;
}

static uint64_t to_ns(const struct scale *s, uint64_t t) {
  return s->ns0 + (uint64_t)((double)(int64_t)(t - s->tick0) * s->ns_per_tick);
}

static void put_event(struct out *o, const struct scale *s, unsigned ring,
                      uint64_t t, uint64_t w, uint64_t a0, uint64_t b0) {
  unsigned type = w & 0xff, shard = (w >> 8) & 0xffff;
  char sh[16] = "-", a[24], b[24];
  if (shard != WEFT_TRACE_NO_SHARD)
    snprintf(sh, sizeof(sh), "%u", shard);
  snprintf(a, sizeof(a), a_is_addr(type) ? "0x%" PRIx64 : "%" PRIu64, a0);
  if (b_is_addr(type))
    snprintf(b, sizeof(b), "0x%" PRIx64, b0);
  else
    snprintf(b, sizeof(b), "%" PRId64, (int64_t)b0);
  out_put(o, "ev %" PRIu64 " %u %u %s %s %s %s\n", to_ns(s, t), ring,
          (unsigned)(w >> 32), sh, type_names[type], a, b);
}

/* A folded run (WEFT_EV_FOLDED) is written as the end it holds, named as
 * the ring's run before it (0: that run was overwritten), then the run. */
static void put_events(struct out *o, const struct scale *s, unsigned ring,
                       const struct rec *ev, size_t n) {
  uint64_t run_a = 0;
  for (size_t j = 0; j < n && !o->err; j++) {
    unsigned type = ev[j].w & 0xff;
    if (!type || type >= WEFT_EV_COUNT)
      continue;
    if (type == WEFT_EV_RUN && (ev[j].w & WEFT_EV_FOLDED))
      put_event(o, s, ring, ev[j].t, (ev[j].w & ~(uint64_t)0xff) | WEFT_EV_END,
                run_a, 1);
    if (type == WEFT_EV_RUN)
      run_a = ev[j].a;
    put_event(o, s, ring, ev[j].t, ev[j].w, ev[j].a, ev[j].b);
  }
}

static const char *const role_names[] = {"worker", "monitor", "pool"};

static int dump(struct weft__trace *tr, unsigned nshards, int fd) {
  pthread_mutex_lock(&tr->lock);
  unsigned nrings = tr->nrings;
  struct weft__ring **rings = malloc((nrings ? nrings : 1) * sizeof(*rings));
  if (rings) /* rings are freed only with the runtime: usable unlocked */
    memcpy(rings, tr->rings, nrings * sizeof(*rings));
  pthread_mutex_unlock(&tr->lock);
  struct rec **ev = calloc(nrings ? nrings : 1, sizeof(*ev));
  size_t *n = calloc(nrings ? nrings : 1, sizeof(*n));
  struct out *o = malloc(sizeof(*o));
  int err = rings && ev && n && o ? 0 : -ENOMEM;
  for (unsigned i = 0; i < nrings && !err; i++) {
    if (!(ev[i] = malloc(tr->events * sizeof(struct rec))))
      err = -ENOMEM;
    else
      n[i] = ring_copy(rings[i], ev[i]);
  }
  if (!err) {
    uint64_t now;
    struct scale s = scale_now(tr, &now);
    *o = (struct out){.fd = fd};
    out_put(o, "weft-trace 1\npid %d\ndumped_ns %" PRIu64 "\nshards %u\n",
            (int)getpid(), now, nshards);
    for (unsigned i = 0; i < nrings; i++)
      out_put(o, "ring %u %s %u %d\n", i, role_names[rings[i]->role],
              rings[i]->index, weft__load(&rings[i]->tid, WA_RLX));
    err = put_syms(o, ev, n, nrings);
    for (unsigned i = 0; i < nrings && !err; i++)
      put_events(o, &s, i, ev[i], n[i]);
    out_flush(o);
    if (!err)
      err = o->err;
  }
  for (unsigned i = 0; ev && i < nrings; i++)
    free(ev[i]);
  free(ev);
  free(n);
  free(o);
  free(rings);
  return err;
}

int weft_rt_trace_dump(weft_rt *rt, int fd) {
  if (!rt || fd < 0)
    return -EINVAL;
  if (weft__forked(rt))
    return -ECHILD;
  if (!rt->trace.events)
    return -ENOTSUP;
  return dump(&rt->trace, rt->nshards, fd);
}

bool weft__trace_stall_dumps(const weft_rt *rt) {
  return rt->trace.events && rt->trace.dir;
}

void weft__trace_stall_dump(weft_rt *rt) {
  struct weft__trace *tr = &rt->trace;
  if (!weft__trace_stall_dumps(rt))
    return;
  uint64_t now = weft__now_ns();
  pthread_mutex_lock(&tr->lock);
  bool due = !tr->dumps || now - tr->last_dump >= STALL_DUMP_GAP_NS;
  unsigned seq = due ? ++tr->dumps : 0;
  if (due)
    tr->last_dump = now;
  pthread_mutex_unlock(&tr->lock);
  if (!due)
    return;
  char path[4096];
  int fd = -1;
  /* O_EXCL: never overwrite a dump of an earlier process with our pid */
  for (int tries = 0; fd < 0 && tries < 100; tries++, seq += 1000) {
    snprintf(path, sizeof(path), "%s/weft-trace-%d-%u.txt", tr->dir,
             (int)getpid(), seq);
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST)
      break;
  }
  int err = fd < 0 ? -errno : dump(tr, rt->nshards, fd);
  if (fd >= 0 && close(fd) != 0 && !err)
    err = -errno;
  /* A dump cut short (a full disk) would mislead, and keep the space the
   * next one needs: the file made here goes. */
  if (err && fd >= 0)
    unlink(path);
  if (err)
    weft__log(rt, WEFT_LOG_ERROR, "stall: could not write %s: %s", path,
              weft_strerror(err));
  else
    weft__log(rt, WEFT_LOG_WARN, "stall: flight recorder written to %s", path);
}

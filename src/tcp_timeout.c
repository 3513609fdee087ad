/*
 * tcp_timeout.c - a connection's timeouts (tcp_timeout.h). Owns struct
 * weft__tmo, allocated once per connection by weft_tcp_set_timeouts and
 * freed when the connection closes.
 */
#include "tcp_timeout.h"

#include "clock.h"
#include "rt.h"
#include "tcp_send.h"

#include <errno.h>
#include <stdlib.h>

static inline uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

static inline uint64_t add_sat(uint64_t a, uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* The earliest deadline the connection's state has now; UINT64_MAX: none. */
static uint64_t next_deadline(const struct weft__conn *c) {
  const struct weft__tmo *t = weft__tcp_tmo(c);
  uint64_t d = UINT64_MAX;
  if (t->idle)
    d = add_sat(t->last_io, t->idle);
  if (t->read && c->reading)
    d = min_u64(d, add_sat(t->read_since, t->read));
  if (t->write && weft__send_queued(c))
    d = min_u64(d, add_sat(t->write_since, t->write));
  return d;
}

static void fire(void *arg, int status, uint64_t missed);

/* Arms the timer at d if that is earlier than where it is armed. */
static void arm_by(struct weft__conn *c, uint64_t d) {
  struct weft__tmo *t = weft__tcp_tmo(c);
  if (d >= t->armed_at)
    return;
  if (weft_timer_start_at(t->timer, d, 0, fire, c) == 0)
    t->armed_at = d;
}

static void fire(void *arg, int status, uint64_t missed) {
  struct weft__conn *c = arg;
  (void)missed;
  struct weft__tmo *t = weft__tcp_tmo(c);
  /* A shutdown, closing anyway, or a close asked for whose EV_CLOSE is
   * still on its way: that close, abortive or not, and its -ECANCELED
   * are the user's, not this timeout's. Relaxed: a close asked on this
   * strand is before this load in program order; one from another thread
   * that the load misses races the timeout, and either may end the
   * operations (close_begin still honours its abortive flag). */
  if (status || !t || c->s.state != ST_OPEN ||
      weft__load(&c->close_req, WA_RLX))
    return;
  t->armed_at = UINT64_MAX;
  uint64_t d = next_deadline(c);
  if (d <= weft__now_ns()) {
    t->fired = true;
    weft__tcp_close_self(c);
    return;
  }
  if (d != UINT64_MAX)
    arm_by(c, d);
}

void weft__tmo_read_started(struct weft__conn *c) {
  struct weft__tmo *t = weft__tcp_tmo(c);
  t->read_since = weft__now_ns();
  if (t->read)
    arm_by(c, add_sat(t->read_since, t->read));
}

void weft__tmo_write_queued(struct weft__conn *c) {
  struct weft__tmo *t = weft__tcp_tmo(c);
  t->write_since = weft__now_ns();
  if (t->write)
    arm_by(c, add_sat(t->write_since, t->write));
}

void weft__tmo_progress(struct weft__conn *c, bool sent) {
  struct weft__tmo *t = weft__tcp_tmo(c);
  uint64_t now = weft__now_ns();
  t->last_io = now;
  if (sent)
    t->write_since = now;
}

void weft__tmo_free(struct weft__conn *c) {
  struct weft__tmo *t = weft__tcp_tmo(c);
  if (!t)
    return;
  weft_timer_destroy(t->timer);
  free(t);
  c->more->tmo = NULL;
}

int weft_tcp_set_timeouts(weft_tcp *tcp, uint64_t idle_ns, uint64_t read_ns,
                          uint64_t write_ns) {
  struct weft__conn *c = weft__conn_of(tcp);
  int r = weft__tcp_on_strand(c, "weft_tcp_set_timeouts");
  if (r)
    return r;
  if (c->s.state != ST_OPEN || weft__load(&c->close_req, WA_RLX))
    return c->s.state < ST_OPEN ? -ENOTCONN : -EBADF;
  uint64_t now = weft__now_ns();
  struct weft__tmo *t = weft__tcp_tmo(c);
  if (!t) {
    if (!idle_ns && !read_ns && !write_ns)
      return 0;
    if (!weft__tcp_more(c) || !(t = calloc(1, sizeof(*t))))
      return -ENOMEM;
    r = weft_timer_create(weft__sock_rt(&c->s), c->s.strand, &t->timer);
    if (r) {
      free(t);
      return r;
    }
    c->more->tmo = t;
    t->read_since = t->write_since = now;
  }
  t->idle = idle_ns;
  t->read = read_ns;
  t->write = write_ns;
  t->last_io = now;
  /* Re-armed from scratch: a longer setting must not fire at the old
   * deadline (fire would only re-arm, but a shorter one must not wait). */
  weft_timer_cancel(t->timer);
  t->armed_at = UINT64_MAX;
  uint64_t d = next_deadline(c);
  if (d != UINT64_MAX)
    arm_by(c, d);
  return 0;
}

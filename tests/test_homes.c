/*
 * test_homes: which shard a strand or a timer belongs to, and where its
 * memory comes from (internal.h, "Homes").
 *
 *  - Made outside the runtime, strands and timers without strand are homed
 *    on the shards in turn (one turn for both kinds); a strand's timers on
 *    its strand's home.
 *  - Made in a handler, they too are homed on the shards in turn, the
 *    worker's first on its own shard; a timer on a strand made elsewhere
 *    still follows its strand. (Homed on the creator's shard always, 1000
 *    strands made by one handler had all their timers on one wheel.)
 *  - Memory: a timer comes from its home's pool, and so does a strand made
 *    outside; a strand made in a handler comes from the pool of the shard
 *    it ran on (its thread's cache: no lock). No 128-byte block (a line,
 *    and the one the adjacent-line prefetcher pulls in with it) holds
 *    objects of two pools, for objects from the arena's reserve and from
 *    slabs, and after frees and new objects.
 *  - Freed by a thread of another shard (outside, or a handler on another
 *    shard), a strand's or a timer's memory goes back to the pool it came
 *    from: the next object made from that pool outside reuses it.
 *  - Timers of every home fire exactly once each, on their strands.
 */
#include "testutil.h"

#include "shard.h"
#include "strand.h"

#define WORKERS 3u
#define PER_HOME 200u /* more than the reserve's batch: slabs too */
#define BLOCK ((uintptr_t)128)

struct obj {
  uintptr_t addr;
  unsigned home;
};

static int cmp_obj(const void *a, const void *b) {
  uintptr_t x = ((const struct obj *)a)->addr;
  uintptr_t y = ((const struct obj *)b)->addr;
  return x < y ? -1 : x > y;
}

/* No 128-byte block holds objects of two homes. */
static void check_blocks(struct obj *o, size_t n) {
  qsort(o, n, sizeof(*o), cmp_obj);
  for (size_t i = 1; i < n; i++)
    if (o[i].addr / BLOCK == o[i - 1].addr / BLOCK &&
        o[i].home != o[i - 1].home)
      fail_msg("%p (home %u) and %p (home %u) share a 128-byte block",
               (void *)o[i - 1].addr, o[i - 1].home, (void *)o[i].addr,
               o[i].home);
}

static unsigned timer_home(weft_timer *t) { return weft__timer_home(t)->idx; }

static void test_outside_in_turn(void **state) {
  (void)state;
  enum { N = WORKERS * PER_HOME };
  weft_rt *rt;
  tu_rt_create(&rt, WORKERS, 0);
  static weft_strand *s[N];
  static weft_timer *st[N], *t[N];
  static struct obj o[3 * N];
  unsigned count[WORKERS] = {0}, tcount[WORKERS] = {0};
  for (unsigned i = 0; i < N; i++) {
    tu_strand_create(rt, &s[i]);
    tu_assert_rc(weft_timer_create(rt, s[i], &st[i]), 0);
    tu_assert_rc(weft_timer_create(rt, NULL, &t[i]), 0);
    assert_true(s[i]->home < WORKERS);
    assert_int_equal(s[i]->pool, s[i]->home);
    /* in turn: each strand or timer without strand on the next shard */
    if (i)
      assert_int_equal(s[i]->home, (timer_home(t[i - 1]) + 1) % WORKERS);
    assert_int_equal(timer_home(t[i]), (s[i]->home + 1) % WORKERS);
    assert_int_equal(timer_home(st[i]), s[i]->home);
    count[s[i]->home]++;
    tcount[timer_home(t[i])]++;
    o[3 * i] = (struct obj){(uintptr_t)s[i], s[i]->home};
    o[3 * i + 1] = (struct obj){(uintptr_t)st[i], s[i]->home};
    o[3 * i + 2] = (struct obj){(uintptr_t)t[i], timer_home(t[i])};
  }
  for (unsigned h = 0; h < WORKERS; h++) {
    assert_int_equal(count[h], PER_HOME);
    assert_int_equal(tcount[h], PER_HOME);
  }
  check_blocks(o, 3 * N);

  /* Free every other one, make as many again: still apart. */
  for (unsigned i = 0; i < N; i += 2) {
    weft_timer_destroy(st[i]);
    weft_timer_destroy(t[i]);
    weft_strand_release(s[i]);
    tu_strand_create(rt, &s[i]);
    tu_assert_rc(weft_timer_create(rt, s[i], &st[i]), 0);
    tu_assert_rc(weft_timer_create(rt, NULL, &t[i]), 0);
  }
  for (unsigned i = 0; i < N; i++) {
    o[3 * i] = (struct obj){(uintptr_t)s[i], s[i]->home};
    o[3 * i + 1] = (struct obj){(uintptr_t)st[i], timer_home(st[i])};
    o[3 * i + 2] = (struct obj){(uintptr_t)t[i], timer_home(t[i])};
    assert_int_equal(timer_home(st[i]), s[i]->home);
  }
  check_blocks(o, 3 * N);
  for (unsigned i = 0; i < N; i++) {
    weft_timer_destroy(st[i]);
    weft_timer_destroy(t[i]);
  }
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  weft_rt_destroy(rt);
}

/* ---- made in a handler ---- */

/* Makes strands outside until one is homed on h; releases the others. */
static weft_strand *strand_homed(weft_rt *rt, unsigned h) {
  for (;;) {
    weft_strand *s;
    tu_strand_create(rt, &s);
    if (s->home == h)
      return s;
    weft_strand_release(s);
  }
}

#define IN_HANDLER 20

struct inside {
  weft_rt *rt;
  weft_strand *other; /* made outside, homed elsewhere */
  unsigned shard;     /* the shard the handler ran on */
  weft_strand *s[IN_HANDLER];
  weft_timer *t[IN_HANDLER], *ot;
};

static void make_inside(void *arg) {
  struct inside *in = arg;
  in->shard = weft__self()->shard->idx;
  for (int i = 0; i < IN_HANDLER; i++) {
    TU_CHECK_RC(weft_strand_create(in->rt, &in->s[i]), 0);
    TU_CHECK_RC(weft_timer_create(in->rt, NULL, &in->t[i]), 0);
  }
  TU_CHECK_RC(weft_timer_create(in->rt, in->other, &in->ot), 0);
}

static void test_in_handler(void **state) {
  (void)state;
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  weft_strand *runner;
  struct inside in = {.rt = rt};
  tu_strand_create(rt, &runner);
  tu_strand_create(rt, &in.other);
  /* The handler may run on either shard. Until it has run once on the
   * one `other` is not homed on, home `other` on the one it last ran on
   * not: a thread that keeps taking the runner meets it the next time. */
  for (int tries = 0;; tries++) {
    tu_on_strand(runner, make_inside, &in);
    TU_ASSERT_NO_ASYNC_ERRORS();
    /* a worker's first object is homed on its own shard */
    if (tries == 0)
      assert_int_equal(in.s[0]->home, in.shard);
    for (int i = 0; i < IN_HANDLER; i++) {
      if (i)
        assert_int_equal(in.s[i]->home, (timer_home(in.t[i - 1]) + 1) % 2);
      assert_int_equal(timer_home(in.t[i]), (in.s[i]->home + 1) % 2);
      /* homed in turn, but made from this worker's own pool */
      assert_int_equal(in.s[i]->pool, in.shard);
    }
    for (int i = 0; i < IN_HANDLER; i++) {
      weft_timer_destroy(in.t[i]);
      weft_strand_release(in.s[i]);
    }
    /* a strand's timer follows the strand, wherever it was made */
    assert_int_equal(timer_home(in.ot), in.other->home);
    weft_timer_destroy(in.ot);
    if (in.shard != in.other->home)
      break;
    assert_true(tries < 1000);
    weft_strand_release(in.other);
    in.other = strand_homed(rt, 1 - in.shard);
  }
  weft_strand_release(in.other);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  weft_rt_destroy(rt);
}

/* ---- freed by another home's thread ---- */

#ifndef WEFT_DEBUG /* a debug build never reuses a strand's memory */
/* A strand and its timer on each of two homes. */
struct freer {
  weft_strand *s[2];
  weft_timer *t[2];
  int freed; /* the pair of the home the handler did not run on */
};

static void free_there(void *arg) {
  struct freer *f = arg;
  unsigned shard = weft__self()->shard->idx;
  f->freed = f->s[0]->home == shard ? 1 : 0;
  weft_timer_destroy(f->t[f->freed]);
  weft_strand_release(f->s[f->freed]);
}

/* Two strands made in a handler, from the pool of the shard it ran on;
 * homes go in turn, so on two shards one of them is homed elsewhere. */
struct made {
  weft_rt *rt;
  weft_strand *s[2];
  unsigned shard;
};

static void make_two(void *arg) {
  struct made *m = arg;
  m->shard = weft__self()->shard->idx;
  TU_CHECK_RC(weft_strand_create(m->rt, &m->s[0]), 0);
  TU_CHECK_RC(weft_strand_create(m->rt, &m->s[1]), 0);
}

static void test_freed_elsewhere(void **state) {
  (void)state;
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  /* From outside. */
  weft_strand *s = strand_homed(rt, 1);
  weft_timer *t;
  tu_assert_rc(weft_timer_create(rt, s, &t), 0);
  uintptr_t sa = (uintptr_t)s, ta = (uintptr_t)t;
  weft_timer_destroy(t);
  weft_strand_release(s);
  s = strand_homed(rt, 1);
  assert_true((uintptr_t)s == sa);
  tu_assert_rc(weft_timer_create(rt, s, &t), 0);
  assert_true((uintptr_t)t == ta);

  /* From a handler on the other shard. */
  struct freer f = {.s = {strand_homed(rt, 0), s}, .t = {NULL, t}};
  tu_assert_rc(weft_timer_create(rt, f.s[0], &f.t[0]), 0);
  weft_strand *runner;
  tu_strand_create(rt, &runner);
  tu_on_strand(runner, free_there, &f);
  int k = f.freed;
  sa = (uintptr_t)f.s[k];
  ta = (uintptr_t)f.t[k];
  s = strand_homed(rt, (unsigned)k);
  assert_true((uintptr_t)s == sa);
  tu_assert_rc(weft_timer_create(rt, s, &t), 0);
  assert_true((uintptr_t)t == ta);
  weft_timer_destroy(t);
  weft_timer_destroy(f.t[1 - k]);

  /* Made in a handler, released outside: back to the handler's shard's
   * pool, whatever its home, where an outside strand homed there finds
   * it (outside, a pool's objects come from its depot, one at a time). */
  struct made m = {.rt = rt};
  tu_on_strand(runner, make_two, &m);
  TU_ASSERT_NO_ASYNC_ERRORS();
  int away = m.s[0]->home == m.shard ? 1 : 0;
  assert_int_not_equal(m.s[away]->home, m.shard);
  assert_int_equal(m.s[0]->pool, m.shard);
  assert_int_equal(m.s[1]->pool, m.shard);
  sa = (uintptr_t)m.s[away];
  weft_strand_release(m.s[1 - away]);
  weft_strand_release(m.s[away]); /* the newest in its pool's depot */
  s = strand_homed(rt, m.shard);
  assert_true((uintptr_t)s == sa);
  weft_strand_release(s);
  weft_strand_release(runner); /* not before: it may be homed on k */
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  weft_rt_destroy(rt);
}
#endif

/* ---- they still fire ---- */

#define FIRE_N 64

struct fired {
  weft_strand *s;
  atomic_uint calls;
  tu_count *total;
};

static void on_fire(void *arg, int status, uint64_t missed) {
  struct fired *f = arg;
  (void)missed;
  TU_CHECKF(status == 0, "status %d", status);
  TU_CHECK(weft_strand_current() == f->s);
  atomic_fetch_add(&f->calls, 1);
  atomic_fetch_add(f->total, 1);
}

static void test_fire_once(void **state) {
  (void)state;
  weft_rt *rt;
  tu_rt_create(&rt, WORKERS, 0);
  static struct fired f[FIRE_N];
  static weft_timer *t[FIRE_N];
  tu_count total = 0;
  for (int i = 0; i < FIRE_N; i++) {
    tu_strand_create(rt, &f[i].s);
    f[i].total = &total;
    atomic_init(&f[i].calls, 0);
    tu_assert_rc(weft_timer_create(rt, f[i].s, &t[i]), 0);
    tu_assert_rc(
        weft_timer_start(t[i], 1000u * (unsigned)(i % 7), 0, on_fire, &f[i]),
        0);
  }
  tu_wait_count(&total, FIRE_N, "timers of every home to fire");
  TU_ASSERT_NO_ASYNC_ERRORS();
  for (int i = 0; i < FIRE_N; i++) {
    assert_int_equal(atomic_load(&f[i].calls), 1);
    weft_timer_destroy(t[i]);
  }
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  weft_rt_destroy(rt);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_outside_in_turn),
      cmocka_unit_test(test_in_handler),
#ifndef WEFT_DEBUG
      cmocka_unit_test(test_freed_elsewhere),
#endif
      cmocka_unit_test(test_fire_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

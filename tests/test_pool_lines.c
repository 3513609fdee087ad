/*
 * test_pool_lines: no two pool objects share a cache line.
 *
 * Pool objects (handler nodes, strands, timers and their firings, sockets)
 * are allocated on one thread and often freed on another, so neighbours in
 * a slab end up in different threads' caches. pool.c rounds every object
 * to whole cache lines so that a write to one never takes a line from the
 * thread using its neighbour (40-byte nodes packed at 48 bytes made two
 * self-posting strands on two workers 4x slower; commit "pool: objects
 * fill whole cache lines").
 *
 *  - Sizes: for object sizes from 1 byte to a socket's, each pool's object
 *    size is a whole number of lines, at least the size asked for.
 *  - Objects: three batches' worth through a thread cache, more through
 *    the cache of threads outside the runtime, from the arena's reserved
 *    region and from slabs: every object starts on a line and no two
 *    objects touch the same line. Freed and allocated again, they still
 *    do not.
 *  - The walk (weft__pool_each, the shutdown sweep's): it visits every
 *    object carved, handed out or cached, each once, from the reserved
 *    region and from slabs, and each starts zeroed (past the free list's
 *    two words, which the pool writes).
 *  - A runtime: its four pools' objects are whole lines; strands and
 *    timers it hands out start on a line.
 */
#include "testutil.h"

#include "shard.h"
#include "strand.h"
#include "tcp.h"

#define LINE ((uintptr_t)WEFT_CACHELINE)
#define NOBJ (3 * WEFT_POOL_BATCH + 7)

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
  return x < y ? -1 : x > y;
}

/* Every object in o[0..n) starts on a line, and the lines of any two,
 * [start, start + objsize), are disjoint. */
static void assert_own_lines(void **o, size_t n, size_t objsize) {
  uintptr_t *a = malloc(n * sizeof(*a));
  assert_non_null(a);
  for (size_t i = 0; i < n; i++) {
    assert_non_null(o[i]);
    a[i] = (uintptr_t)o[i];
    assert_int_equal(a[i] % LINE, 0);
  }
  qsort(a, n, sizeof(*a), cmp_ptr);
  for (size_t i = 1; i < n; i++)
    assert_true(a[i] >= a[i - 1] + objsize);
  free(a);
}

struct walk {
  void **o; /* the objects handed out */
  size_t n, visits, zeroed;
  size_t objsize;
  unsigned *seen; /* per handed-out object: times visited */
};

static void visit(void *obj, void *arg) {
  struct walk *w = arg;
  w->visits++;
  assert_int_equal((uintptr_t)obj % LINE, 0);
  const unsigned char *b = obj;
  size_t k = sizeof(struct weft__freeobj);
  while (k < w->objsize && b[k] == 0)
    k++;
  w->zeroed += k == w->objsize;
  for (size_t i = 0; i < w->n; i++)
    if (w->o[i] == obj)
      w->seen[i]++;
}

/* Every object carved so far is handed out (o[0..n)) or in a cache: the
 * walk visits exactly those, once each, all still zero. */
static void check_walk(struct weft__pool *p, void **o, size_t n,
                       size_t cached) {
  unsigned *seen = calloc(n, sizeof(*seen));
  assert_non_null(seen);
  struct walk w = {.o = o, .n = n, .objsize = p->objsize, .seen = seen};
  weft__pool_each(p, visit, &w);
  assert_int_equal(w.visits, n + cached);
  assert_int_equal(w.zeroed, w.visits);
  for (size_t i = 0; i < n; i++)
    assert_int_equal(seen[i], 1);
  free(seen);
}

static void check_size(size_t asked, bool reserve) {
  struct weft__pool p;
  assert_int_equal(weft__pool_init(&p, asked), 0);
  assert_int_equal(p.objsize % LINE, 0);
  assert_true(p.objsize >= asked);
  void *region = NULL;
  if (reserve) { /* as rt.c's arena: line-aligned, one batch */
    size_t bytes = WEFT_POOL_BATCH * p.objsize;
    region = aligned_alloc(LINE, bytes);
    assert_non_null(region);
    weft__pool_reserve(&p, region, bytes);
  }
  struct weft__pool_cache c = {0};
  void *o[2 * NOBJ];
  for (size_t i = 0; i < NOBJ; i++)
    o[i] = weft__pool_alloc(&p, &c);
  for (size_t i = NOBJ; i < 2 * NOBJ; i++)
    o[i] = weft__pool_alloc(&p, NULL); /* outside: the loose cache */
  assert_own_lines(o, 2 * NOBJ, p.objsize);
  check_walk(&p, o, 2 * NOBJ, c.count + p.loose.count);
  /* Freed in another order and taken again (spilled batches included). */
  for (size_t i = 0; i < 2 * NOBJ; i += 2)
    weft__pool_free(&p, &c, o[i]);
  for (size_t i = 1; i < 2 * NOBJ; i += 2)
    weft__pool_free(&p, &c, o[i]);
  for (size_t i = 0; i < 2 * NOBJ; i++)
    o[i] = weft__pool_alloc(&p, i & 1 ? NULL : &c);
  assert_own_lines(o, 2 * NOBJ, p.objsize);
  weft__pool_destroy(&p);
  free(region);
}

static void test_sizes_and_objects(void **state) {
  (void)state;
  size_t sizes[] = {1,
                    sizeof(struct weft__node),
                    48,
                    63,
                    64,
                    65,
                    sizeof(struct weft_timer),
                    200,
                    sizeof(struct weft__conn),
                    sizeof(struct weft__sendbuf),
                    sizeof(struct weft__wstate)};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    check_size(sizes[i], false);
    check_size(sizes[i], true);
  }
}

static void test_runtime_objects(void **state) {
  (void)state;
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.workers = 2;
  weft_rt *rt;
  assert_int_equal(weft_rt_create(&rt, &cfg), 0);
  struct weft__pool *pools[] = {&rt->node_pool,
                                &rt->shards[0].strand_pool,
                                &rt->shards[1].timer_pool,
                                &rt->net.conn_pool,
                                &rt->net.lsock_pool,
                                &rt->net.send_pool,
                                &rt->net.wstate_pool};
  for (size_t i = 0; i < sizeof(pools) / sizeof(pools[0]); i++)
    assert_int_equal(pools[i]->objsize % LINE, 0);
  weft_strand *s[8];
  weft_timer *t[8];
  for (int i = 0; i < 8; i++) {
    assert_int_equal(weft_strand_create(rt, &s[i]), 0);
    assert_int_equal(weft_timer_create(rt, s[i], &t[i]), 0);
    assert_int_equal((uintptr_t)s[i] % LINE, 0);
    assert_int_equal((uintptr_t)t[i] % LINE, 0);
  }
  for (int i = 0; i < 8; i++)
    weft_timer_destroy(t[i]);
  assert_int_equal(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  weft_rt_destroy(rt);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sizes_and_objects),
      cmocka_unit_test(test_runtime_objects),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

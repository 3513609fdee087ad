/*
 * test_abi: a program built against another version of weft.h keeps
 * working. The structs weft reads (weft_config) and writes (weft_stats,
 * weft_shard_stats) cross the library boundary with the size the caller
 * was compiled with (the _sized entry points behind weft_rt_create,
 * weft_config_init, weft_rt_stats, weft_rt_shard_stats):
 *  - a smaller (older) weft_config: the fields it lacks take their
 *    defaults, and the bytes after it are never read (garbage there, which
 *    would be refused if read, changes nothing);
 *  - a larger (newer) weft_config: zero past this library's struct is
 *    accepted, anything else refused with -E2BIG and nothing created;
 *  - weft_config_init on a smaller struct writes only its size;
 *  - a smaller weft_stats or weft_shard_stats: exactly its size is
 *    written, the bytes after it keep their values; a larger one: the
 *    bytes past this library's struct are zeroed.
 */
#include "testutil.h"

#define CANARY 0xa5
#define NPOSTS 100

static tu_count g_ran;

static void count_fn(void *arg) {
  (void)arg;
  atomic_fetch_add(&g_ran, 1);
}

static bool all_bytes(const unsigned char *p, size_t n, unsigned char v) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != v)
      return false;
  return true;
}

static void test_config_older(void **state) {
  (void)state;
  union {
    weft_config cfg;
    unsigned char b[sizeof(weft_config) + 64];
  } u;
  memset(&u, 0xff, sizeof(u));
  /* A header from before backend, stack_size and eager_workers: the bytes
   * from backend on are garbage (-1 would be -EINVAL if read). */
  size_t old = offsetof(weft_config, backend);
  weft_config_init_sized(&u.cfg, old);
  assert_true(all_bytes(u.b, old, 0));
  assert_true(all_bytes(u.b + old, sizeof(u) - old, 0xff));
  u.cfg.workers = 2;
  weft_rt *rt = NULL;
  tu_assert_rc(weft_rt_create_sized(&rt, &u.cfg, old), 0);
  assert_non_null(rt);
  assert_int_equal(weft_rt_workers(rt), 2);
  assert_int_not_equal(weft_rt_backend(rt), -EINVAL);
  tu_assert_rc(weft_rt_destroy(rt), 0);
}

static void test_config_newer(void **state) {
  (void)state;
  union {
    weft_config cfg;
    unsigned char b[sizeof(weft_config) + 32];
  } u;
  memset(&u, 0, sizeof(u));
  u.cfg.workers = 1;
  weft_rt *rt = NULL;
  /* A newer header whose new fields are left at zero (their defaults). */
  tu_assert_rc(weft_rt_create_sized(&rt, &u.cfg, sizeof(u)), 0);
  assert_non_null(rt);
  assert_int_equal(weft_rt_workers(rt), 1);
  tu_assert_rc(weft_rt_destroy(rt), 0);
  /* One it does not know, set: refused, nothing created. */
  u.b[sizeof(weft_config) + 31] = 1;
  rt = (weft_rt *)&u; /* overwritten with NULL on failure */
  tu_assert_rc(weft_rt_create_sized(&rt, &u.cfg, sizeof(u)), -E2BIG);
  assert_null(rt);
}

static void test_stats_sizes(void **state) {
  (void)state;
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);

  union {
    weft_stats st;
    unsigned char b[sizeof(weft_stats) + 64];
  } u;
  /* An older header: weft_stats ended before thread_start_errors. */
  size_t old = offsetof(weft_stats, thread_start_errors);
  memset(&u, CANARY, sizeof(u));
  tu_assert_rc(weft_rt_stats_sized(rt, &u.st, old), 0);
  assert_int_equal(u.st.shards, 2);
  assert_true(all_bytes(u.b + old, sizeof(u) - old, CANARY));
  /* A newer one, larger: zero past ours. */
  memset(&u, CANARY, sizeof(u));
  tu_assert_rc(weft_rt_stats_sized(rt, &u.st, sizeof(u)), 0);
  assert_int_equal(u.st.shards, 2);
  assert_true(all_bytes(u.b + sizeof(weft_stats), 64, 0));
  /* The reserved tail of the per-shard counters reads as 0. */
  for (size_t i = 0; i < sizeof(u.st.total.reserved) / 8; i++)
    assert_int_equal(u.st.total.reserved[i], 0);

  /* Per shard, through an older header that ended before io_enters: the
   * fields it has are written (the shards' handlers add up), the rest of
   * the caller's memory is not. */
  for (int i = 0; i < NPOSTS; i++)
    tu_assert_rc(weft_post_rt(rt, count_fn, NULL), 0);
  tu_wait_count(&g_ran, NPOSTS, "the posted handlers");
  union {
    weft_shard_stats st;
    unsigned char b[sizeof(weft_shard_stats) + 16];
  } v;
  size_t old_shard = offsetof(weft_shard_stats, io_enters);
  /* A shard counts a handler once it has returned, so the last may be
   * counted a moment after the test saw it run; and one whose thread
   * lost the shard meanwhile (a handoff, on a loaded machine) is counted
   * in handlers_run_after_handoff instead. So read again until all are,
   * or the deadline. */
  uint64_t ran, deadline = tu_deadline_ns(TU_WAIT_S);
  for (;;) {
    weft_stats all;
    tu_stats(rt, &all);
    ran = all.handlers_run_after_handoff;
    for (unsigned i = 0; i < 2; i++) {
      memset(&v, CANARY, sizeof(v));
      tu_assert_rc(weft_rt_shard_stats_sized(rt, i, &v.st, old_shard), 0);
      assert_true(all_bytes(v.b + old_shard, sizeof(v) - old_shard, CANARY));
      assert_true(v.st.handlers_run <= NPOSTS);
      ran += v.st.handlers_run;
    }
    if (ran >= NPOSTS || tu_now_ns() > deadline)
      break;
    tu_sleep_ms(1);
  }
  assert_true(ran >= NPOSTS);
  tu_assert_rc(weft_rt_shard_stats_sized(rt, 2, &v.st, sizeof(v)), -ERANGE);
  tu_assert_rc(weft_rt_destroy(rt), 0);
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_older),
      cmocka_unit_test(test_config_newer),
      cmocka_unit_test(test_stats_sizes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

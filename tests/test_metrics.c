/*
 * test_metrics: weft_rt_metrics, the counters as JSON and as Prometheus
 * text.
 *
 *  - After 1000 handlers on a strand of a 2-shard runtime: the JSON is one
 *    object with balanced braces and brackets, "shards":2, a "total" and a
 *    "per_shard" array of 2 objects, and per_shard's handlers_run plus
 *    handlers_run_after_handoff adds up to at least total's, at least 1000.
 *  - The Prometheus text: every line is a # HELP or # TYPE comment or a
 *    sample "weft_name{labels} value" whose name had its # TYPE; the
 *    handlers_run series exist for shards 0 and 1 and "none" (the counts
 *    in no shard) and add up to at least 1000; timers_fired has a "none"
 *    series too;
 *    counters end in _total; the blocking pool's busy time is in seconds.
 *  - snprintf's contract: NULL and 0 give the length; a 10-byte buffer
 *    gets the first 9 bytes and a NUL, and the same length back.
 *  - Bad input: rt NULL, an unknown format, buf NULL with len 5: -EINVAL.
 */
#include "testutil.h"

#include <ctype.h>

#define N 1000

static tu_count g_ran;

static void bump(void *arg) {
  (void)arg;
  atomic_fetch_add(&g_ran, 1);
}

/* The text in a buffer of its own (NUL-terminated). */
static char *metrics(weft_rt *rt, int format) {
  long n = weft_rt_metrics(rt, format, NULL, 0);
  assert_true(n > 0);
  size_t room = (size_t)n + 4096; /* the counters may grow meanwhile */
  char *buf = malloc(room);
  assert_non_null(buf);
  long m = weft_rt_metrics(rt, format, buf, room);
  assert_true(m > 0 && (size_t)m < room);
  assert_int_equal(strlen(buf), (size_t)m);
  return buf;
}

/* The number after `key` in s, at its first occurrence after from. */
static uint64_t num_after(const char *s, const char *key) {
  const char *p = strstr(s, key);
  if (!p)
    fail_msg("no %s in: %s", key, s);
  return strtoull(p + strlen(key), NULL, 10);
}

static void check_json(const char *j) {
  assert_int_equal(j[0], '{');
  size_t len = strlen(j);
  assert_true(len > 2 && j[len - 1] == '\n' && j[len - 2] == '}');
  int depth = 0;
  for (const char *p = j; *p; p++) {
    depth += (*p == '{' || *p == '[') - (*p == '}' || *p == ']');
    assert_true(depth >= 0);
  }
  assert_int_equal(depth, 0);
  assert_int_equal(num_after(j, "\"shards\":"), 2);
  uint64_t total = num_after(strstr(j, "\"total\":"), "\"handlers_run\":");
  const char *ps = strstr(j, "\"per_shard\":[");
  assert_non_null(ps);
  const char *s1 = strstr(ps, "},{");
  assert_non_null(s1);
  assert_null(strstr(s1 + 3, "},{")); /* two objects */
  uint64_t sum = num_after(ps, "\"handlers_run\":") +
                 num_after(s1, "\"handlers_run\":") +
                 num_after(j, "\"handlers_run_after_handoff\":");
  assert_true(total >= N);
  assert_true(sum >= total); /* the shards were read after the total */
  const char *lat = strstr(j, "\"latency\":{\"sched_delay\":{\"count\":");
  assert_non_null(lat);
  assert_true(num_after(lat, "\"count\":") >= 1); /* weft_post_rt's */
  assert_non_null(strstr(lat, "\"pool_wait\":{"));
  assert_non_null(strstr(lat, "\"p99_ns\":"));
}

static void check_prometheus(const char *t) {
  char typed[64][64];
  unsigned ntyped = 0;
  uint64_t shard_runs = 0;
  unsigned shard_series = 0;
  bool busy = false, none_timers = false;
  unsigned summaries = 0, quantiles = 0;
  const char *line = t;
  while (*line) {
    const char *end = strchr(line, '\n');
    assert_non_null(end); /* every line ends */
    char l[512];
    size_t n = (size_t)(end - line);
    assert_true(n > 0 && n < sizeof l);
    memcpy(l, line, n);
    l[n] = '\0';
    line = end + 1;
    char name[64], kind[16];
    if (!strncmp(l, "# HELP weft_", 11))
      continue;
    if (sscanf(l, "# TYPE %63s %15s", name, kind) == 2) {
      assert_true(!strcmp(kind, "counter") || !strcmp(kind, "gauge") ||
                  !strcmp(kind, "summary"));
      if (!strcmp(kind, "summary"))
        summaries++;
      if (!strcmp(kind, "counter"))
        assert_non_null(strstr(name, "_total"));
      assert_true(ntyped < 64);
      snprintf(typed[ntyped++], sizeof typed[0], "%s", name);
      continue;
    }
    /* A sample: name, optional {labels}, a space, a number. */
    size_t k = strspn(l, "abcdefghijklmnopqrstuvwxyz_");
    assert_true(k > 5 && !strncmp(l, "weft_", 5));
    memcpy(name, l, k);
    name[k] = '\0';
    assert_true(ntyped > 0);
    /* its # TYPE came first; a summary's _sum and _count belong to it */
    size_t tl = strlen(typed[ntyped - 1]);
    assert_true(!strncmp(typed[ntyped - 1], name, tl) &&
                (!name[tl] || !strcmp(name + tl, "_sum") ||
                 !strcmp(name + tl, "_count")));
    const char *v = l + k;
    unsigned shard = 0;
    double q;
    bool labelled = *v == '{', none = !strncmp(v, "{shard=\"none\"}", 14);
    if (labelled && sscanf(v, "{quantile=\"%lf\"}", &q) == 1) {
      assert_true(q > 0 && q < 1);
      quantiles++;
      v = strchr(v, '}') + 1;
    } else if (labelled) {
      assert_true(none || sscanf(v, "{shard=\"%u\"}", &shard) == 1);
      v = strchr(v, '}') + 1;
    }
    assert_int_equal(*v, ' ');
    char *num_end;
    double d = strtod(v + 1, &num_end);
    assert_true(*num_end == '\0' && d >= 0);
    if (!strcmp(name, "weft_handlers_run_total")) {
      assert_true(labelled && shard < 2);
      shard_runs += (uint64_t)d;
      shard_series++;
    }
    if (!strcmp(name, "weft_timers_fired_total") && none)
      none_timers = true;
    if (!strcmp(name, "weft_blocking_busy_seconds_total"))
      busy = strchr(v, '.') != NULL;
  }
  assert_int_equal(shard_series, 3); /* shards 0 and 1, and none */
  assert_true(shard_runs >= N);
  assert_true(none_timers);
  assert_null(strstr(t, "after_handoff")); /* as the shard="none" series */
  assert_true(busy);
  assert_int_equal(summaries, WEFT_HIST_KINDS);
  assert_int_equal(quantiles, 4 * WEFT_HIST_KINDS);
}

static void test_formats(void **state) {
  (void)state;
  tu_reset_async_errors();
  weft_rt *rt;
  tu_rt_create(&rt, 2, 0);
  weft_strand *s;
  tu_strand_create(rt, &s);
  atomic_store(&g_ran, 0);
  for (int i = 0; i < N; i++)
    tu_assert_rc(weft_post(s, bump, NULL), 0);
  /* without strand: its scheduling delay is measured (a strand's are
   * sampled, one in 16) before it runs */
  tu_assert_rc(weft_post_rt(rt, bump, NULL), 0);
  tu_wait_count(&g_ran, N + 1, "the handlers");

  char *j = metrics(rt, WEFT_METRICS_JSON);
  check_json(j);
  char *p = metrics(rt, WEFT_METRICS_PROMETHEUS);
  check_prometheus(p);

  char small[10];
  long n = weft_rt_metrics(rt, WEFT_METRICS_JSON, small, sizeof small);
  assert_true(n > (long)sizeof small);
  assert_int_equal(strlen(small), sizeof small - 1);
  assert_memory_equal(small, j, sizeof small - 1);

  assert_int_equal(weft_rt_metrics(NULL, WEFT_METRICS_JSON, NULL, 0), -EINVAL);
  assert_int_equal(weft_rt_metrics(rt, 0, NULL, 0), -EINVAL);
  assert_int_equal(weft_rt_metrics(rt, 3, NULL, 0), -EINVAL);
  assert_int_equal(weft_rt_metrics(rt, WEFT_METRICS_PROMETHEUS, NULL, 5),
                   -EINVAL);
  free(j);
  free(p);
  weft_strand_release(s);
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(rt), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_formats),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

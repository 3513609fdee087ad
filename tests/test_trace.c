/*
 * test_trace: the flight recorder (weft_rt_trace_dump, weft_config's
 * trace_bytes and trace_dir) and its converter (tools/weft-trace).
 *
 *  - A stall, dumped while the stuck handler still runs: the dump holds
 *    that handler's run without an end on its thread, the monitor's stall
 *    and handoff of its shard to another thread, and runs of other strands
 *    after the handoff, none of them on the stuck thread; every ring's
 *    events are in time order. tools/weft-trace turns the dump into JSON
 *    that Python's json module loads, with a traceEvents list.
 *  - trace_dir: after the stall the monitor writes a dump there by itself
 *    and logs its name.
 *  - Once the workers have nothing to run, every run in a worker's ring
 *    has its end (an end held for the next item's start is written when
 *    the thread goes looking for work instead).
 *  - Small rings keep only their newest events (at most a ring), in order.
 *  - Dumps made while every thread writes (ThreadSanitizer checks the
 *    rings' protocol).
 *  - Bad input and a recorder turned off.
 */
#include "testutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define THRESHOLD_NS (20u * 1000000u)
#define CHAINS 4

/* ---- a parsed dump --------------------------------------------------------
 */

typedef struct tev {
  uint64_t t;
  unsigned ring;
  int shard; /* -1: none */
  char type[16];
  uint64_t a;
  int64_t b;
} tev;

typedef struct tdump {
  unsigned nrings;
  char role[64][16];
  unsigned index[64];
  size_t n, cap;
  tev *ev;
  bool header;
} tdump;

static void dump_parse(const char *path, tdump *d) {
  memset(d, 0, sizeof(*d));
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[1024];
  while (fgets(line, sizeof(line), f)) {
    if (!strcmp(line, "weft-trace 1\n"))
      d->header = true;
    unsigned id, idx;
    char role[16], sh[16];
    if (sscanf(line, "ring %u %15s %u", &id, role, &idx) == 3 && id < 64) {
      strcpy(d->role[id], role);
      d->index[id] = idx;
      if (id + 1 > d->nrings)
        d->nrings = id + 1;
      continue;
    }
    tev e;
    char a[32], b[32];
    unsigned tid;
    if (sscanf(line, "ev %" SCNu64 " %u %u %15s %15s %31s %31s", &e.t, &e.ring,
               &tid, sh, e.type, a, b) != 7)
      continue;
    e.shard = sh[0] == '-' ? -1 : atoi(sh);
    e.a = strtoull(a, NULL, 0);
    e.b = strtoll(b, NULL, 0);
    if (d->n == d->cap) {
      d->cap = d->cap ? 2 * d->cap : 4096;
      d->ev = realloc(d->ev, d->cap * sizeof(tev));
      assert_non_null(d->ev);
    }
    d->ev[d->n++] = e;
  }
  fclose(f);
}

static void dump_free(tdump *d) { free(d->ev); }

/* Each ring's events in time order (a dump lists one ring after another). */
static void check_ring_order(const tdump *d) {
  for (size_t i = 1; i < d->n; i++)
    if (d->ev[i].ring == d->ev[i - 1].ring)
      assert_true(d->ev[i].t >= d->ev[i - 1].t);
}

static const tev *find(const tdump *d, const char *type, uint64_t a) {
  for (size_t i = 0; i < d->n; i++)
    if (!strcmp(d->ev[i].type, type) && d->ev[i].a == a)
      return &d->ev[i];
  return NULL;
}

/* ---- the workload ---------------------------------------------------------
 */

static tu_gate g_gate;
static tu_count g_entered, g_chain_runs, g_chains_done;
static atomic_bool g_stop;
static weft_strand *g_chain[CHAINS];

__attribute__((noinline)) static void trace_stuck(void *arg) {
  (void)arg;
  atomic_fetch_add(&g_entered, 1);
  tu_gate_pass(&g_gate); /* blocked in a wait: the monitor hands off */
}

__attribute__((noinline)) static void trace_chain(void *arg) {
  uintptr_t i = (uintptr_t)arg;
  uint64_t until = tu_now_ns() + 20000;
  while (tu_now_ns() < until)
    ;
  atomic_fetch_add(&g_chain_runs, 1);
  if (atomic_load(&g_stop))
    atomic_fetch_add(&g_chains_done, 1);
  else
    assert_int_equal(weft_post(g_chain[i], trace_chain, arg), 0);
}

static void chains_start(weft_rt *rt) {
  atomic_store(&g_stop, false);
  atomic_store(&g_chains_done, 0);
  for (uintptr_t i = 0; i < CHAINS; i++) {
    assert_int_equal(weft_strand_create(rt, &g_chain[i]), 0);
    assert_int_equal(weft_post(g_chain[i], trace_chain, (void *)i), 0);
  }
}

static void chains_stop(void) {
  atomic_store(&g_stop, true);
  tu_wait_count(&g_chains_done, CHAINS, "chains to stop");
  for (int i = 0; i < CHAINS; i++)
    weft_strand_release(g_chain[i]);
}

static tu_count g_dump_logged;

static void on_log(void *ctx, int level, const char *msg) {
  (void)ctx;
  if (level == WEFT_LOG_WARN && strstr(msg, "flight recorder written to"))
    atomic_fetch_add(&g_dump_logged, 1);
}

static void dump_to(weft_rt *rt, const char *path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  assert_true(fd >= 0);
  assert_int_equal(weft_rt_trace_dump(rt, fd), 0);
  close(fd);
}

/* The dump of a stall in progress (the header's first case). */
static void check_stall_dump(const tdump *d) {
  assert_true(d->header);
  check_ring_order(d);
  const tev *run = find(d, "run", (uintptr_t)trace_stuck);
  assert_non_null(run);
  /* No end after it in its ring. (The item before it may end at the same
   * tick: an end held for the next item's start, strand.c's item_end.) */
  for (size_t i = (size_t)(run - d->ev) + 1; i < d->n; i++)
    if (d->ev[i].ring == run->ring)
      assert_string_not_equal(d->ev[i].type, "end");
  const tev *stall = find(d, "stall", (uintptr_t)trace_stuck);
  assert_non_null(stall);
  assert_string_equal(d->role[stall->ring], "monitor");
  assert_int_equal(stall->shard, run->shard);
  assert_true(stall->t > run->t);
  const tev *hand = NULL;
  for (size_t i = 0; i < d->n && !hand; i++)
    if (!strcmp(d->ev[i].type, "handoff") && d->ev[i].shard == run->shard)
      hand = &d->ev[i];
  assert_non_null(hand);
  assert_true(hand->t > run->t);
  assert_string_equal(d->role[run->ring], "worker");
  assert_int_equal(hand->a, d->index[run->ring]); /* from the stuck thread */
  assert_int_not_equal(hand->b, hand->a);
  /* Meanwhile: other strands run, never on the stuck thread, and the
   * shard it lost is held by another thread. */
  unsigned after = 0;
  for (size_t i = 0; i < d->n; i++) {
    const tev *e = &d->ev[i];
    if (strcmp(e->type, "run") || e->t <= hand->t)
      continue;
    assert_int_not_equal(e->ring, run->ring);
    if (e->a == (uintptr_t)trace_chain)
      after++;
  }
  assert_true(after > 0);
}

static void run_converter(const char *dump, const char *json) {
  char cmd[2048];
  snprintf(cmd, sizeof(cmd), "python3 %s/tools/weft-trace %s -o %s",
           WEFT_SOURCE_DIR, dump, json);
  int st = system(cmd);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  snprintf(cmd, sizeof(cmd),
           "python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
           "sys.exit(0 if d[\"traceEvents\"] else 1)' %s",
           json);
  st = system(cmd);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* The dump the monitor wrote into dir by itself, into path. */
static bool stall_dump_found(const char *dir, char *path, size_t len) {
  DIR *dp = opendir(dir);
  assert_non_null(dp);
  struct dirent *de;
  bool found = false;
  while ((de = readdir(dp)))
    if (!strncmp(de->d_name, "weft-trace-", 11)) {
      snprintf(path, len, "%s/%s", dir, de->d_name);
      found = true;
    }
  closedir(dp);
  return found;
}

static void test_stall_trace(void **state) {
  (void)state;
  char dir[] = "/tmp/weft-trace-test-XXXXXX";
  assert_non_null(mkdtemp(dir));
  weft_config c;
  weft_config_init(&c);
  c.workers = 2;
  c.stall_threshold_ns = THRESHOLD_NS;
  c.trace_dir = dir;
  c.log_fn = on_log;
  weft_rt *rt;
  assert_int_equal(weft_rt_create(&rt, &c), 0);
  tu_gate_init(&g_gate);
  chains_start(rt);
  weft_strand *s;
  assert_int_equal(weft_strand_create(rt, &s), 0);
  assert_int_equal(weft_post(s, trace_stuck, NULL), 0);
  tu_wait_count(&g_entered, 1, "the stuck handler to start");
  weft_stats st;
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  do {
    tu_sleep_ms(5);
    tu_stats(rt, &st);
  } while (!st.total.handoffs && tu_now_ns() < deadline);
  assert_true(st.total.handoffs >= 1);
  tu_wait_count(&g_chain_runs, atomic_load(&g_chain_runs) + 200,
                "other strands to run after the handoff");
  char path[256], json[300], found[512];
  snprintf(path, sizeof(path), "%s/manual.txt", dir);
  snprintf(json, sizeof(json), "%s/manual.json", dir);
  dump_to(rt, path);
  tu_gate_open(&g_gate);
  chains_stop();
  weft_strand_release(s);
  tdump d;
  dump_parse(path, &d);
  check_stall_dump(&d);
  dump_free(&d);
  run_converter(path, json);

  tu_wait_count(&g_dump_logged, 1, "the monitor's stall dump");
  assert_true(stall_dump_found(dir, found, sizeof(found)));
  dump_parse(found, &d);
  assert_true(d.header);
  assert_non_null(find(&d, "stall", (uintptr_t)trace_stuck));
  dump_free(&d);
  weft_rt_destroy(rt);
  tu_gate_destroy(&g_gate);
  char cmd[300];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ---- every run ends ------------------------------------------------------ */

#define SHORT_N 2000

static tu_count g_short;

static void short_handler(void *arg) {
  (void)arg;
  atomic_fetch_add(&g_short, 1);
}

/* Whether every run in d's worker rings is followed by its end before the
 * next run; the first event of a ring may be an end whose run the ring
 * no longer holds. */
static bool every_run_ends(const tdump *d) {
  bool open = false;
  for (size_t i = 0; i < d->n; i++) {
    const tev *e = &d->ev[i];
    if (strcmp(d->role[e->ring], "worker"))
      continue;
    if (i && d->ev[i - 1].ring != e->ring && open)
      return false; /* the last run of the ring before ended nowhere */
    if (!strcmp(e->type, "run")) {
      if (open)
        return false;
      open = true;
    } else if (!strcmp(e->type, "end")) {
      open = false;
    }
  }
  return !open;
}

/* Each end of a run (named by its first handler, or 0: a turn resumed
 * after a cut link) that ran handlers names short_handler, on the run's
 * shard; returns the handlers they count, which should be every one run.
 * Ends of one-handler turns are most often folded into the next run
 * (trace.h, WEFT_EV_FOLDED) and the dump writes them out. */
static size_t short_ends(const tdump *d) {
  size_t ends = 0; /* handlers */
  const tev *run = NULL;
  for (size_t i = 0; i < d->n; i++) {
    const tev *e = &d->ev[i];
    if (run && run->ring != e->ring)
      run = NULL;
    if (!strcmp(e->type, "run")) {
      run = e;
    } else if (!strcmp(e->type, "end") && run && e->b) {
      assert_int_equal(e->a, (uintptr_t)short_handler);
      assert_true(e->b >= 1);
      assert_int_equal(e->shard, run->shard);
      ends += (size_t)e->b;
      run = NULL;
    }
  }
  return ends;
}

static void test_every_run_ends(void **state) {
  (void)state;
  weft_config c;
  weft_config_init(&c);
  c.workers = 2;
  weft_rt *rt;
  assert_int_equal(weft_rt_create(&rt, &c), 0);
  weft_strand *s[8];
  for (int i = 0; i < 8; i++)
    assert_int_equal(weft_strand_create(rt, &s[i]), 0);
  for (int i = 0; i < SHORT_N; i++)
    assert_int_equal(weft_post(s[i % 8], short_handler, NULL), 0);
  tu_wait_count(&g_short, SHORT_N, "the short handlers");
  char path[] = "/tmp/weft-trace-ends-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  unlink(path);
  /* The workers go looking for work, then park, soon after the last
   * handler: from then on the dump must hold every end. */
  uint64_t deadline = tu_deadline_ns(TU_WAIT_S);
  for (;;) {
    assert_int_equal(ftruncate(fd, 0), 0);
    assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
    assert_int_equal(weft_rt_trace_dump(rt, fd), 0);
    char proc[64];
    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
    tdump d;
    dump_parse(proc, &d);
    check_ring_order(&d);
    assert_non_null(find(&d, "run", (uintptr_t)short_handler));
    bool ok = every_run_ends(&d);
    size_t ends = short_ends(&d);
    dump_free(&d);
    if (ok) {
      assert_int_equal(ends, SHORT_N);
      break;
    }
    assert_true(tu_now_ns() < deadline);
    tu_sleep_ms(5);
  }
  close(fd);
  for (int i = 0; i < 8; i++)
    weft_strand_release(s[i]);
  weft_rt_destroy(rt);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* Small rings: only the newest events, in order, at most a ring of them. */
static void test_small_rings(void **state) {
  (void)state;
  weft_config c;
  weft_config_init(&c);
  c.workers = 2;
  c.trace_bytes = 4096; /* 128 events */
  weft_rt *rt;
  assert_int_equal(weft_rt_create(&rt, &c), 0);
  atomic_store(&g_chain_runs, 0);
  chains_start(rt);
  tu_wait_count(&g_chain_runs, 2000, "chain handlers");
  char path[] = "/tmp/weft-trace-small-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(weft_rt_trace_dump(rt, fd), 0);
  close(fd);
  chains_stop();
  weft_rt_destroy(rt);
  tdump d;
  dump_parse(path, &d);
  unlink(path);
  check_ring_order(&d);
  unsigned per[64] = {0};
  for (size_t i = 0; i < d.n; i++)
    per[d.ev[i].ring]++;
  bool some = false;
  for (unsigned r = 0; r < d.nrings; r++) {
    assert_true(per[r] <= 128);
    some |= per[r] > 0;
  }
  assert_true(some);
  dump_free(&d);
}

/* A thread dumps again and again while every worker writes its ring. */
static void *dumper(void *arg) {
  weft_rt *rt = arg;
  int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
  for (int i = 0; i < (int)TU_SCALED(50, 5); i++)
    if (weft_rt_trace_dump(rt, fd) != 0)
      tu_async_fail(__FILE__, __LINE__, "a dump failed");
  close(fd);
  return NULL;
}

static void test_dump_while_writing(void **state) {
  (void)state;
  weft_config c;
  weft_config_init(&c);
  c.workers = 2;
  c.trace_bytes = 8192;
  weft_rt *rt;
  assert_int_equal(weft_rt_create(&rt, &c), 0);
  chains_start(rt);
  pthread_t t[2];
  for (int i = 0; i < 2; i++)
    assert_int_equal(pthread_create(&t[i], NULL, dumper, rt), 0);
  for (int i = 0; i < 2; i++)
    pthread_join(t[i], NULL);
  chains_stop();
  weft_rt_destroy(rt);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_bad_input(void **state) {
  (void)state;
  weft_config c;
  weft_config_init(&c);
  weft_rt *rt;
  c.trace_bytes = 100;
  assert_int_equal(weft_rt_create(&rt, &c), -EINVAL);
  c.trace_bytes = 0;
  c.flags = WEFT_CONFIG_NO_TRACE;
  c.workers = 1;
  assert_int_equal(weft_rt_create(&rt, &c), 0);
  int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
  assert_int_equal(weft_rt_trace_dump(rt, fd), -ENOTSUP);
  weft_rt_destroy(rt);
  assert_int_equal(weft_rt_trace_dump(NULL, fd), -EINVAL);
  tu_rt_create(&rt, 1, 0);
  assert_int_equal(weft_rt_trace_dump(rt, -1), -EINVAL);
  int ro = open("/dev/null", O_RDONLY | O_CLOEXEC);
  assert_int_equal(weft_rt_trace_dump(rt, ro), -EBADF);
  close(ro);
  close(fd);
  weft_rt_destroy(rt);
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stall_trace),
      cmocka_unit_test(test_every_run_ends),
      cmocka_unit_test(test_small_rings),
      cmocka_unit_test(test_dump_while_writing),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

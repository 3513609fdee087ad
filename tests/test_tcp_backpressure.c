/*
 * test_tcp_backpressure: write watermarks. weft.h: "a write that would take
 * the queued bytes above high fails with -ENOBUFS (unless the queue is
 * empty), and fn(arg, c) runs once the queue has drained to low or less".
 *
 * A weft connection (accepted, small socket buffers inherited from the
 * listener) writes 4 KiB chunks to a plain peer that does not read yet,
 * with low 64 KiB and high 256 KiB, in a loop on its strand while
 * weft_tcp_write succeeds. Checked:
 *   - weft_tcp_queued() never exceeds high (a write into an empty queue may
 *     take it to one chunk), a refused write leaves it unchanged, and the
 *     loop ends with -ENOBUFS;
 *   - the drain callback has not run while the peer read nothing; once the
 *     peer reads it runs, on the strand, with queued <= low, and writing
 *     resumes (several rounds of -ENOBUFS and drain, 4 MiB in all, scaled);
 *   - every write callback runs exactly once, with 0; each refused write
 *     is followed by exactly one drain callback; the peer receives every
 *     byte in order, then EOF (weft_tcp_shutdown);
 *   - the first write, larger than high, is accepted (the queue is empty);
 *   - the watermarks may be set again in the close callback (still on the
 *     strand): what that holds is freed with the connection (ASan's leak
 *     check).
 */
#include "testutil.h"

#define NWORKERS 2
#define SMALL_BUF 4096
#define CHUNK 4096
#define LOW (64u << 10)
#define HIGH (256u << 10)

typedef struct bp {
  weft_tcp *c;
  unsigned char *data; /* the whole stream, written chunk by chunk */
  uint64_t total, queued_off;
  uint64_t writes, write_cbs, enobufs, drains, drains_before_read;
  size_t max_queued;
  bool shut;
  atomic_bool peer_started;
  atomic_uint_fast64_t enobufs_seen; /* for the test thread */
  tu_event done;                     /* +1 when every write callback has run */
} bp;

/* The first write is larger than high: it goes into an empty queue. */
#define FIRST_LEN (HIGH + (64u << 10))

static bool on_strand_of(weft_tcp *c) {
  return weft_strand_current() != NULL &&
         weft_strand_current() == weft_tcp_strand(c);
}

static void written(void *arg, weft_tcp *c, int status) {
  bp *b = arg;
  TU_CHECK(on_strand_of(c));
  TU_CHECKF(status == 0, "write callback %" PRIu64 ": %d (%s)", b->write_cbs,
            status, weft_strerror(status));
  b->write_cbs++;
  if (b->shut && b->write_cbs == b->writes)
    tu_event_add(&b->done, 1);
}

/* Writes chunks while weft_tcp_write accepts them. */
static void pump(bp *b) {
  while (b->queued_off < b->total) {
    size_t before = weft_tcp_queued(b->c);
    size_t len = b->writes == 0 ? FIRST_LEN : CHUNK;
    if (len > b->total - b->queued_off)
      len = (size_t)(b->total - b->queued_off);
    int rc = weft_tcp_write(b->c, b->data + b->queued_off, len, written, b);
    size_t after = weft_tcp_queued(b->c);
    if (after > b->max_queued)
      b->max_queued = after;
    if (rc == -ENOBUFS) {
      TU_CHECKF(after == before, "a refused write changed queued: %zu -> %zu",
                before, after);
      TU_CHECKF(b->writes > 0, "the first write, into an empty queue, was "
                               "refused");
      b->enobufs++;
      atomic_store(&b->enobufs_seen, b->enobufs);
      return;
    }
    TU_CHECKF(rc == 0, "weft_tcp_write: %d (%s)", rc, weft_strerror(rc));
    if (rc != 0)
      return;
    TU_CHECKF(after <= HIGH || (before == 0 && after <= len),
              "queued %zu bytes (%zu before the write), above the high "
              "watermark %u",
              after, before, HIGH);
    b->writes++;
    b->queued_off += len;
  }
  if (!b->shut) {
    b->shut = true;
    TU_CHECK_RC(weft_tcp_shutdown(b->c), 0);
    if (b->write_cbs == b->writes)
      tu_event_add(&b->done, 1);
  }
}

static void drained(void *arg, weft_tcp *c) {
  bp *b = arg;
  TU_CHECK(on_strand_of(c) && c == b->c);
  size_t q = weft_tcp_queued(c);
  TU_CHECKF(q <= LOW, "drain callback with %zu bytes queued, above low %u", q,
            LOW);
  TU_CHECKF(b->enobufs > b->drains,
            "drain callback %" PRIu64 " without a refused write before it",
            b->drains + 1);
  b->drains++;
  if (!atomic_load(&b->peer_started))
    b->drains_before_read++;
  pump(b);
}

static void start(void *arg) {
  bp *b = arg;
  TU_CHECK_RC(weft_tcp_set_watermarks(b->c, LOW, HIGH, drained, b), 0);
  pump(b);
}

/* ------------------------------------------------------------------- test */

typedef struct accept_slot {
  _Atomic(weft_tcp *) c;
  tu_event ev;
} accept_slot;

static void accept_one(void *arg, weft_tcp *c) {
  accept_slot *s = arg;
  TU_CHECK(on_strand_of(c));
  weft_tcp *none = NULL;
  TU_CHECKF(atomic_compare_exchange_strong(&s->c, &none, c),
            "a second connection was accepted");
  tu_event_add(&s->ev, 1);
}

static void closed(void *arg, weft_tcp *c) {
  TU_CHECK_RC(weft_tcp_set_watermarks(c, 1, 2, NULL, NULL), 0);
  tu_event_add(arg, 1);
}

static void listener_done(void *arg) { tu_event_add(arg, 1); }

static void test_backpressure(void **state) {
  (void)state;
  tu_reset_async_errors();
  tu_phase("backpressure");
  weft_rt *rt;
  tu_rt_create(&rt, NWORKERS, 0);
  tu_assert_backend(rt);
  accept_slot slot = {.c = NULL};
  tu_event_init(&slot.ev);
  weft_listener *l;
  uint16_t port = tu_tcp_listen(rt, NULL, accept_one, &slot, &l);
  if (tu_shrink_listener_bufs(port, SMALL_BUF, SMALL_BUF) < 1)
    fail_msg("no listening socket found on port %u", (unsigned)port);
  int fd = tu_sock_connect(port, SMALL_BUF, 0);
  assert_true(fd >= 0);
  tu_event_wait(&slot.ev, 1, "the accept callback");

  static bp b;
  memset(&b, 0, sizeof b);
  b.c = atomic_load(&slot.c);
  b.total = TU_SCALED(4u << 20, 1u << 20);
  b.data = malloc(b.total);
  assert_non_null(b.data);
  tu_pattern_fill(b.data, b.total, 0xBAC4, 0);
  tu_event_init(&b.done);
  tu_on_strand(weft_tcp_strand(b.c), start, &b);
  /* the loop on the strand has ended, with -ENOBUFS */
  assert_int_equal(atomic_load(&b.enobufs_seen), 1);

  atomic_store(&b.peer_started, true);
  uint64_t got = tu_recv_pattern(fd, 0xBAC4, b.total);
  tu_event_wait(&b.done, 1, "every write callback");
  print_message("[ INFO     ] %" PRIu64 " writes, %" PRIu64 " refused, %" PRIu64
                " drain callbacks, at most %zu bytes queued\n",
                b.writes, b.enobufs, b.drains, b.max_queued);
  assert_int_equal(got, b.total);
  assert_int_equal(b.queued_off, b.total);
  assert_int_equal(b.write_cbs, b.writes);
  assert_int_equal(b.drains_before_read, 0);
  assert_true(b.drains >= 1);
  assert_int_equal(b.drains, b.enobufs);

  tu_event ev;
  tu_event_init(&ev);
  tu_tcp_set_data(b.c, &ev, closed);
  tu_assert_rc(weft_tcp_close(b.c, 0), 0);
  tu_event_wait(&ev, 1, "the close callback");
  tu_assert_rc(weft_listener_close(l, listener_done, &ev), 0);
  tu_event_wait(&ev, 2, "the listener's done callback");
  close(fd);
  tu_stat_wait w = {rt, 0};
  tu_wait_until(tu_pred_tcp_live_le, &w, "every connection to be freed");
  tu_assert_rc(weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(rt), 0);
  tu_event_destroy(&ev);
  tu_event_destroy(&b.done);
  tu_event_destroy(&slot.ev);
  free(b.data);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_backpressure),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_fs: file operations (weft_fs_*), on each backend, and on io_uring
 * with the ring path turned off (WEFT_URING_FILES=pool, test_fs_pool).
 *
 *  - Round trip, started on a strand (the ring path where there is one):
 *    1 MiB written as 16 writes of 64 KiB in flight at once, fsync and
 *    fdatasync, fstat and stat (size, regular file), 256 reads of 4 KiB at
 *    random offsets in flight at once, a readv into two buffers, a read
 *    across the end (short) and at the end (0), reads at the file position
 *    (-1) in order, a writev, close; every callback exactly once, on the
 *    strand; the bytes are what was written.
 *  - From a thread outside the runtime (the pool path): the same calls
 *    work, their callbacks run on the strand given.
 *  - Errors, as results: open of a missing file (-ENOENT), stat of one
 *    (-ENOENT), read of a directory (-EISDIR), read of a closed descriptor
 *    (-EBADF); as the calls' own: NULL arguments, bad offsets and iovec
 *    counts, a strand of another runtime.
 *  - A strand released while a read of a pipe waits (on the strand, and
 *    from outside): the callback still comes, once, on that strand.
 *  - A CANCEL shutdown with 200 operations issued: each callback exactly
 *    once (a result or -ECANCELED).
 *  - Closes on a strand of descriptors another thread keeps reusing: each
 *    close's result 0, once; under ThreadSanitizer, no report of the
 *    reuse (a close the ring makes is announced to it).
 */
#include <sys/socket.h>
#include <sys/stat.h>

#include "testutil.h"

#define NWORKERS 2
#define FILE_SIZE (1u << 20)
#define PIECE (64u * 1024)

static char g_dir[64], g_path[128];

static int dir_setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/weft-fs-XXXXXX");
  if (!mkdtemp(g_dir))
    return -1;
  snprintf(g_path, sizeof g_path, "%s/data", g_dir);
  return 0;
}

static int dir_teardown(void **state) {
  (void)state;
  unlink(g_path);
  rmdir(g_dir);
  return 0;
}

static weft_rt *rt_make(void) {
  weft_rt *rt;
  tu_rt_create(&rt, NWORKERS, 0);
  tu_assert_backend(rt);
  return rt;
}

/* One operation's result, set on the strand. */
typedef struct op {
  struct ctx *c;
  long result;
  unsigned calls;
  bool on_strand;
} op;

typedef struct ctx {
  weft_rt *rt;
  weft_strand *s;
  tu_event ev; /* one per callback */
} ctx;

static void op_done(void *arg, long result) {
  op *o = arg;
  o->result = result;
  o->calls++;
  o->on_strand = weft_strand_current() == o->c->s;
  tu_event_add(&o->c->ev, 1);
}

/* A runtime, a strand on it, and the callbacks' event. */
static void ctx_init(ctx *c) {
  c->rt = rt_make();
  tu_strand_create(c->rt, &c->s);
  tu_event_init(&c->ev);
}

/* Runs fn(arg) on the strand (or, with outside, on this thread), then waits
 * for want callbacks in all. */
typedef struct step {
  ctx *c;
  void (*fn)(struct step *);
  int rc; /* the calls' own results, 0 if all accepted */
  op ops[300];
  unsigned nops;
  int fd;
  unsigned char *buf;
  struct stat st;
} step;

static op *next_op(step *p) {
  op *o = &p->ops[p->nops++];
  memset(o, 0, sizeof *o);
  o->c = p->c;
  o->result = 12345;
  return o;
}

static void step_handler(void *arg) {
  step *p = arg;
  p->fn(p);
}

static void run_step(step *p, bool outside, const char *what) {
  uint64_t before = tu_event_get(&p->c->ev);
  p->nops = 0;
  p->rc = 0;
  if (outside)
    p->fn(p);
  else
    tu_on_strand(p->c->s, step_handler, p);
  tu_assert_rc(p->rc, 0);
  tu_event_wait(&p->c->ev, before + p->nops, what);
  for (unsigned i = 0; i < p->nops; i++) {
    assert_int_equal(p->ops[i].calls, 1);
    assert_true(p->ops[i].on_strand);
  }
}

static void acc(step *p, int rc) {
  if (rc && !p->rc)
    p->rc = rc;
}

/* ------------------------------------------------------------- the steps */

static void s_open(step *p) {
  acc(p, weft_fs_open(p->c->rt, p->c->s, g_path, O_CREAT | O_RDWR | O_TRUNC,
                      0600, op_done, next_op(p)));
}

static void s_write(step *p) {
  for (unsigned i = 0; i < FILE_SIZE / PIECE; i++)
    acc(p, weft_fs_write(p->c->rt, p->c->s, p->fd, p->buf + i * PIECE, PIECE,
                         (int64_t)i * PIECE, op_done, next_op(p)));
}

static void s_sync(step *p) {
  acc(p, weft_fs_fsync(p->c->rt, p->c->s, p->fd, 0, op_done, next_op(p)));
  acc(p, weft_fs_fsync(p->c->rt, p->c->s, p->fd, 1, op_done, next_op(p)));
}

static void s_fstat(step *p) {
  acc(p, weft_fs_stat(p->c->rt, p->c->s, NULL, p->fd, &p->st, op_done,
                      next_op(p)));
}

static void s_stat(step *p) {
  acc(p,
      weft_fs_stat(p->c->rt, p->c->s, g_path, -1, &p->st, op_done, next_op(p)));
}

#define NREADS 256
static unsigned char g_rbuf[NREADS][4096];
static uint32_t g_roff[NREADS];

static void s_reads(step *p) {
  uint64_t seed = 3;
  for (unsigned i = 0; i < NREADS; i++) {
    g_roff[i] = (uint32_t)(tu_rand(&seed) % (FILE_SIZE - 4096));
    acc(p, weft_fs_read(p->c->rt, p->c->s, p->fd, g_rbuf[i], 4096, g_roff[i],
                        op_done, next_op(p)));
  }
}

static unsigned char g_v1[1000], g_v2[3000];

static void s_readv(step *p) {
  struct iovec iov[2] = {{g_v1, sizeof g_v1}, {g_v2, sizeof g_v2}};
  acc(p, weft_fs_readv(p->c->rt, p->c->s, p->fd, iov, 2, 5000, op_done,
                       next_op(p)));
}

static unsigned char g_tail[8192];

static void s_ends(step *p) {
  acc(p, weft_fs_read(p->c->rt, p->c->s, p->fd, g_tail, sizeof g_tail,
                      FILE_SIZE - 100, op_done, next_op(p)));
  acc(p, weft_fs_read(p->c->rt, p->c->s, p->fd, g_tail, sizeof g_tail,
                      FILE_SIZE, op_done, next_op(p)));
}

static unsigned char g_pos[10];

static void s_pos(step *p) { /* one at a time: they share the position */
  acc(p, weft_fs_read(p->c->rt, p->c->s, p->fd, g_pos, sizeof g_pos, -1,
                      op_done, next_op(p)));
}

static void s_writev(step *p) {
  static const char a[] = "hello, ", b[] = "file";
  struct iovec iov[2] = {{(void *)a, 7}, {(void *)b, 4}};
  acc(p, weft_fs_writev(p->c->rt, p->c->s, p->fd, iov, 2, FILE_SIZE, op_done,
                        next_op(p)));
}

static void s_close(step *p) {
  acc(p, weft_fs_close(p->c->rt, p->c->s, p->fd, op_done, next_op(p)));
}

static void s_read_closed(step *p) {
  acc(p, weft_fs_read(p->c->rt, p->c->s, p->fd, g_tail, 10, 0, op_done,
                      next_op(p)));
}

static void round_trip(bool outside) {
  ctx c;
  ctx_init(&c);
  static step p;
  memset(&p, 0, sizeof p);
  p.c = &c;
  p.buf = malloc(FILE_SIZE);
  assert_non_null(p.buf);
  uint64_t seed = 11;
  for (unsigned i = 0; i < FILE_SIZE; i++)
    p.buf[i] = (unsigned char)tu_rand(&seed);

  p.fn = s_open;
  run_step(&p, outside, "the open");
  assert_true(p.ops[0].result >= 0);
  p.fd = (int)p.ops[0].result;
  p.fn = s_write;
  run_step(&p, outside, "16 writes");
  for (unsigned i = 0; i < p.nops; i++)
    assert_int_equal(p.ops[i].result, PIECE);
  p.fn = s_sync;
  run_step(&p, outside, "fsync and fdatasync");
  assert_int_equal(p.ops[0].result, 0);
  assert_int_equal(p.ops[1].result, 0);
  p.fn = s_fstat;
  run_step(&p, outside, "fstat");
  assert_int_equal(p.ops[0].result, 0);
  assert_int_equal(p.st.st_size, FILE_SIZE);
  assert_true(S_ISREG(p.st.st_mode));
  memset(&p.st, 0, sizeof p.st);
  p.fn = s_stat;
  run_step(&p, outside, "stat");
  assert_int_equal(p.ops[0].result, 0);
  assert_int_equal(p.st.st_size, FILE_SIZE);
  struct stat real;
  assert_int_equal(stat(g_path, &real), 0);
  assert_int_equal(p.st.st_ino, real.st_ino);
  assert_int_equal(p.st.st_dev, real.st_dev);
  assert_int_equal(p.st.st_mode, real.st_mode);
  p.fn = s_reads;
  run_step(&p, outside, "256 reads");
  for (unsigned i = 0; i < NREADS; i++) {
    assert_int_equal(p.ops[i].result, 4096);
    assert_memory_equal(g_rbuf[i], p.buf + g_roff[i], 4096);
  }
  p.fn = s_readv;
  run_step(&p, outside, "readv");
  assert_int_equal(p.ops[0].result, 4000);
  assert_memory_equal(g_v1, p.buf + 5000, 1000);
  assert_memory_equal(g_v2, p.buf + 6000, 3000);
  p.fn = s_ends;
  run_step(&p, outside, "reads at the end");
  assert_int_equal(p.ops[0].result, 100);
  assert_int_equal(p.ops[1].result, 0);
  /* At the file position: 0..9, then 10..19 (the descriptor's own offset
   * starts at 0: every other operation gave one). */
  p.fn = s_pos;
  run_step(&p, outside, "a read at the position");
  assert_int_equal(p.ops[0].result, 10);
  assert_memory_equal(g_pos, p.buf, 10);
  run_step(&p, outside, "a second read at the position");
  assert_int_equal(p.ops[0].result, 10);
  assert_memory_equal(g_pos, p.buf + 10, 10);
  p.fn = s_writev;
  run_step(&p, outside, "writev");
  assert_int_equal(p.ops[0].result, 11);
  p.fn = s_close;
  run_step(&p, outside, "close");
  assert_int_equal(p.ops[0].result, 0);
  p.fn = s_read_closed;
  run_step(&p, outside, "a read of a closed descriptor");
  assert_int_equal(p.ops[0].result, -EBADF);
  /* What writev appended. */
  char tail[12] = {0};
  int fd = open(g_path, O_RDONLY | O_CLOEXEC);
  assert_int_equal(pread(fd, tail, 11, FILE_SIZE), 11);
  close(fd);
  assert_string_equal(tail, "hello, file");

  weft_strand_release(c.s);
  tu_assert_rc(weft_rt_shutdown(c.rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(c.rt), 0);
  tu_event_destroy(&c.ev);
  free(p.buf);
}

static void test_on_strand(void **state) {
  (void)state;
  tu_reset_async_errors();
  round_trip(false);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

static void test_outside(void **state) {
  (void)state;
  tu_reset_async_errors();
  round_trip(true);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ---------------------------------------------------------------- errors */

static struct stat g_st;

static void s_errors(step *p) {
  weft_rt *rt = p->c->rt;
  weft_strand *s = p->c->s;
  char missing[160];
  snprintf(missing, sizeof missing, "%s/missing", g_dir);
  acc(p, weft_fs_open(rt, s, missing, O_RDONLY, 0, op_done, next_op(p)));
  acc(p, weft_fs_stat(rt, s, missing, -1, &g_st, op_done, next_op(p)));
  acc(p, weft_fs_read(rt, s, p->fd, g_tail, 10, 0, op_done, next_op(p)));
}

static void test_errors(void **state) {
  (void)state;
  tu_reset_async_errors();
  ctx c;
  ctx_init(&c);
  static step p;
  memset(&p, 0, sizeof p);
  p.c = &c;
  p.fd = open(g_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  assert_true(p.fd >= 0);
  p.fn = s_errors;
  run_step(&p, false, "the failing operations");
  assert_int_equal(p.ops[0].result, -ENOENT);
  assert_int_equal(p.ops[1].result, -ENOENT);
  assert_int_equal(p.ops[2].result, -EISDIR);
  close(p.fd);

  weft_rt *other = rt_make();
  weft_strand *os;
  tu_strand_create(other, &os);
  op o;
  struct iovec iov = {g_tail, 1};
  tu_assert_rc(weft_fs_open(NULL, NULL, g_path, 0, 0, op_done, &o), -EINVAL);
  tu_assert_rc(weft_fs_open(c.rt, NULL, NULL, 0, 0, op_done, &o), -EINVAL);
  tu_assert_rc(weft_fs_open(c.rt, NULL, g_path, 0, 0, NULL, &o), -EINVAL);
  tu_assert_rc(weft_fs_open(c.rt, os, g_path, 0, 0, op_done, &o), -EXDEV);
  tu_assert_rc(weft_fs_read(c.rt, NULL, 0, g_tail, 1, -2, op_done, &o),
               -EINVAL);
  tu_assert_rc(weft_fs_read(c.rt, NULL, -1, g_tail, 1, 0, op_done, &o),
               -EINVAL);
  tu_assert_rc(weft_fs_read(c.rt, NULL, 0, NULL, 1, 0, op_done, &o), -EINVAL);
  tu_assert_rc(weft_fs_readv(c.rt, NULL, 0, &iov, 0, 0, op_done, &o), -EINVAL);
  tu_assert_rc(weft_fs_writev(c.rt, NULL, 0, &iov, 1025, 0, op_done, &o),
               -EINVAL);
  tu_assert_rc(weft_fs_readv(c.rt, NULL, 0, NULL, 1, 0, op_done, &o), -EINVAL);
  tu_assert_rc(weft_fs_stat(c.rt, NULL, NULL, -1, &g_st, op_done, &o), -EINVAL);
  tu_assert_rc(weft_fs_stat(c.rt, NULL, "", -1, &g_st, op_done, &o), -EINVAL);
  tu_assert_rc(weft_fs_stat(c.rt, NULL, g_path, -1, NULL, op_done, &o),
               -EINVAL);
  tu_assert_rc(weft_fs_close(c.rt, NULL, -1, op_done, &o), -EINVAL);
  tu_assert_rc(weft_fs_fsync(c.rt, NULL, -1, 0, op_done, &o), -EINVAL);
  weft_strand_release(os);
  tu_assert_rc(weft_rt_shutdown(other, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(other), 0);

  weft_strand_release(c.s);
  tu_assert_rc(weft_rt_shutdown(c.rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_fs_open(c.rt, NULL, g_path, 0, 0, op_done, &o), -ESHUTDOWN);
  tu_assert_rc(weft_rt_destroy(c.rt), 0);
  tu_event_destroy(&c.ev);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------------------- a strand released */

static char g_pipebuf[8];

static void s_pipe_read(step *p) {
  acc(p, weft_fs_read(p->c->rt, p->c->s, p->fd, g_pipebuf, 5, -1, op_done,
                      next_op(p)));
}

/* A read of a pipe holds its strand: released while the read waits for
 * bytes, the strand still takes the callback (no post to a reclaimed
 * strand, which a WEFT_DEBUG build aborts on and ASan reports). */
static void test_release_pending(void **state) {
  (void)state;
  tu_reset_async_errors();
  for (int outside = 0; outside < 2; outside++) {
    ctx c;
    ctx_init(&c);
    int pfd[2];
    assert_int_equal(pipe2(pfd, O_CLOEXEC), 0);
    static step p;
    memset(&p, 0, sizeof p);
    p.c = &c;
    p.fd = pfd[0];
    p.fn = s_pipe_read;
    if (outside)
      p.fn(&p);
    else
      tu_on_strand(c.s, step_handler, &p);
    tu_assert_rc(p.rc, 0);
    weft_strand_release(c.s);
    usleep(20000); /* let an early reclaim happen, were there one */
    assert_int_equal(tu_event_get(&c.ev), 0); /* the pipe is empty */
    assert_int_equal(write(pfd[1], "hello", 5), 5);
    tu_event_wait(&c.ev, 1, "the read on the released strand");
    assert_int_equal(p.ops[0].calls, 1);
    assert_int_equal(p.ops[0].result, 5);
    assert_true(p.ops[0].on_strand);
    assert_memory_equal(g_pipebuf, "hello", 5);
    tu_assert_rc(weft_rt_shutdown(c.rt, WEFT_SHUTDOWN_DRAIN), 0);
    tu_assert_rc(weft_rt_destroy(c.rt), 0);
    close(pfd[0]);
    close(pfd[1]);
    tu_event_destroy(&c.ev);
  }
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* ------------------------------------------- closes made by the ring */

/* Descriptors this thread created, closed on a strand (through the ring on
 * io_uring) while another thread, which nothing orders with this one,
 * keeps opening and closing: it is given the numbers the ring frees. A
 * close that ThreadSanitizer does not see leaves the number open in its
 * model, and that thread's open of it is then reported as a data race
 * (the TSan build halts on it); io_uring.c announces its closes. */
#define NPAIRS 32
#define CLOSE_ROUNDS 20

static int g_close_fds[2 * NPAIRS];
static atomic_bool g_opener_stop;

static void *opener(void *arg) {
  (void)arg;
  while (!atomic_load_explicit(&g_opener_stop, memory_order_relaxed)) {
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd >= 0)
      close(fd);
  }
  return NULL;
}

static void s_close_all(step *p) {
  for (unsigned i = 0; i < 2 * NPAIRS; i++)
    acc(p,
        weft_fs_close(p->c->rt, p->c->s, g_close_fds[i], op_done, next_op(p)));
}

static void test_ring_close_reuse(void **state) {
  (void)state;
  tu_reset_async_errors();
  ctx c;
  ctx_init(&c);
  atomic_store_explicit(&g_opener_stop, false, memory_order_relaxed);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, opener, NULL), 0);
  static step p;
  for (unsigned r = 0; r < CLOSE_ROUNDS; r++) {
    for (unsigned i = 0; i < NPAIRS; i++)
      assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0,
                                  &g_close_fds[2 * i]),
                       0);
    memset(&p, 0, sizeof p);
    p.c = &c;
    p.fn = s_close_all;
    run_step(&p, false, "the closes");
    for (unsigned i = 0; i < p.nops; i++)
      assert_int_equal(p.ops[i].result, 0);
  }
  atomic_store_explicit(&g_opener_stop, true, memory_order_relaxed);
  assert_int_equal(pthread_join(t, NULL), 0);
  weft_strand_release(c.s);
  tu_assert_rc(weft_rt_shutdown(c.rt, WEFT_SHUTDOWN_DRAIN), 0);
  tu_assert_rc(weft_rt_destroy(c.rt), 0);
  tu_event_destroy(&c.ev);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

/* -------------------------------------------------------------- shutdown */

static void s_many(step *p) {
  for (unsigned i = 0; i < 200; i++)
    acc(p, weft_fs_read(p->c->rt, p->c->s, p->fd, g_rbuf[i % NREADS], 4096,
                        (int64_t)(i % 200) * 4096, op_done, next_op(p)));
}

static void test_shutdown(void **state) {
  (void)state;
  tu_reset_async_errors();
  int fd = open(g_path, O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, 200 * 4096), 0);
  ctx c;
  ctx_init(&c);
  static step p;
  memset(&p, 0, sizeof p);
  p.c = &c;
  p.fd = fd;
  p.fn = s_many;
  tu_on_strand(c.s, step_handler, &p);
  tu_assert_rc(p.rc, 0);
  tu_assert_rc(weft_rt_shutdown(c.rt, WEFT_SHUTDOWN_CANCEL), 0);
  weft_strand_release(c.s);
  tu_assert_rc(weft_rt_destroy(c.rt), 0);
  assert_int_equal(tu_event_get(&c.ev), 200);
  for (unsigned i = 0; i < 200; i++) {
    assert_int_equal(p.ops[i].calls, 1);
    assert_true(p.ops[i].result == 4096 || p.ops[i].result == -ECANCELED);
  }
  close(fd);
  tu_event_destroy(&c.ev);
  TU_ASSERT_NO_ASYNC_ERRORS();
}

int main(void) {
  tu_watchdog_start();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_on_strand, dir_setup, dir_teardown),
      cmocka_unit_test_setup_teardown(test_outside, dir_setup, dir_teardown),
      cmocka_unit_test_setup_teardown(test_errors, dir_setup, dir_teardown),
      cmocka_unit_test_setup_teardown(test_shutdown, dir_setup, dir_teardown),
      cmocka_unit_test_setup_teardown(test_release_pending, dir_setup,
                                      dir_teardown),
      cmocka_unit_test(test_ring_close_reuse),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * fs.c - file operations (weft_fs_*): through the calling shard's
 * io_uring ring where the runtime has one and the kernel has the opcodes
 * (rt->io.ring_files), else on the blocking pool. Owns the requests.
 *
 * Both paths end the same way: the result is stored in the request, and
 * deliver() runs on the caller's strand (posted by the reaper, or as the
 * pool job's done), calls fn once and frees the request. A ring request is
 * busy work (rt.c) from its submission until its completion is posted, so
 * a shutdown waits for an operation the kernel still holds; the pool
 * counts its jobs itself. Either way the request holds its strand
 * (strand.h) until deliver() is queued, so the strand may be released
 * meanwhile (a connection's, closing). Calls from a thread outside the runtime
 * have no ring to use: they go to the pool. A ring that is full also sends the
 * operation to the pool rather than fail it.
 */
#include "blocking.h"
#include "io.h"
#include "rt.h"
#include "strand.h"
#include "thread.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_RW 0x7ffff000u /* what one read(2) moves at most (Linux) */
#define MAX_IOV 1024

struct fsreq {
  struct weft__ioh ioh; /* first: the ring's tag needs its alignment */
  weft_rt *rt;
  weft_strand *strand;
  weft_fs_fn fn;
  void *arg;
  struct weft__fileop op;
  struct stat *st;
  long result;
  struct statx stx;
  struct iovec *iov; /* the copy, in this allocation */
  char path[];       /* the copy, in this allocation */
};

static void from_statx(struct stat *st, const struct statx *x) {
  memset(st, 0, sizeof(*st));
  st->st_dev = makedev(x->stx_dev_major, x->stx_dev_minor);
  st->st_ino = x->stx_ino;
  st->st_mode = x->stx_mode;
  st->st_nlink = x->stx_nlink;
  st->st_uid = x->stx_uid;
  st->st_gid = x->stx_gid;
  st->st_rdev = makedev(x->stx_rdev_major, x->stx_rdev_minor);
  st->st_size = (off_t)x->stx_size;
  st->st_blksize = (blksize_t)x->stx_blksize;
  st->st_blocks = (blkcnt_t)x->stx_blocks;
  st->st_atim.tv_sec = x->stx_atime.tv_sec;
  st->st_atim.tv_nsec = x->stx_atime.tv_nsec;
  st->st_mtim.tv_sec = x->stx_mtime.tv_sec;
  st->st_mtim.tv_nsec = x->stx_mtime.tv_nsec;
  st->st_ctim.tv_sec = x->stx_ctime.tv_sec;
  st->st_ctim.tv_nsec = x->stx_ctime.tv_nsec;
}

/* On the caller's strand: fn, once, then the request goes. */
static void deliver(void *arg) {
  struct fsreq *q = arg;
  weft__calling((void *)q->fn);
  q->fn(q->arg, q->result);
  free(q);
}

/* ---- the ring --------------------------------------------------------------
 */

static bool ring_submit(struct fsreq *q);
static void pool_done(void *arg, long result);
static long pool_work(void *arg);

/* On the caller's strand: the operation again, through this thread's ring
 * or the pool (ring_done); an error to submit it is its result. */
static void again(void *arg) {
  struct fsreq *q = arg;
  if (ring_submit(q))
    return;
  int r = weft__blocking_submit(q->rt, q->rt->blocking, pool_work, q, q->strand,
                                pool_done, NULL);
  if (r) {
    q->result = r;
    deliver(q);
  }
}

/* -ECANCELED is never weft's (no file operation is cancelled): the kernel
 * ended the request with the thread that submitted it, a spare that
 * retired after a handoff (io_uring.c), so it goes again rather than
 * report a cancel nobody asked for. */
static void ring_done(struct weft__ioh *h, struct weft__shard *local,
                      unsigned op, const struct weft__cqe *c) {
  struct fsreq *q = (struct fsreq *)h;
  (void)op;
  weft_rt *rt = q->rt;
  q->result = c->res;
  if (q->op.kind == WEFT_FOP_STATX && c->res == 0)
    from_statx(q->st, &q->stx);
  bool lost = c->res == -ECANCELED;
  struct weft__node *n;
  /* Its own cancel: the result (-ECANCELED, if lost) is reported even at a
   * CANCEL shutdown. Out of memory: retry, never lose it. */
  while (!(n = weft__node_new(rt, local, lost ? again : deliver, deliver, q))) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  weft__node_post_unhold(rt, local, q->strand, n); /* ring_submit's hold */
  weft__busy_drop(rt, 1);
}

/* Through this thread's ring: true if submitted (fn will run). */
static bool ring_submit(struct fsreq *q) {
  weft_rt *rt = q->rt;
  if (!rt->io.ring_files || weft__io_ensure(rt))
    return false;
  struct weft__shard *sh = weft__local_begin(rt);
  bool ok = false;
  if (sh && weft__busy_enter(rt) == 0) {
    q->ioh.done = ring_done;
    weft__strand_hold(q->strand); /* before: the completion may come first */
    ok = weft__io_file(sh, &q->op, &q->ioh) == 0;
    if (!ok) {
      weft__strand_unhold(q->strand);
      weft__busy_drop(rt, 1);
    }
  }
  weft__local_end(sh);
  return ok;
}

/* ---- the pool --------------------------------------------------------------
 */

static long io_result(long r) { return r < 0 ? -errno : r; }

static long pool_work(void *arg) {
  struct fsreq *q = arg;
  const struct weft__fileop *o = &q->op;
  bool pos = o->off == (uint64_t)-1;
  off_t off = (off_t)o->off;
  switch (o->kind) {
  case WEFT_FOP_READ:
    return io_result(pos ? read(o->fd, o->buf, o->len)
                         : pread(o->fd, o->buf, o->len, off));
  case WEFT_FOP_WRITE:
    return io_result(pos ? write(o->fd, o->buf, o->len)
                         : pwrite(o->fd, o->buf, o->len, off));
  case WEFT_FOP_READV:
    return io_result(pos ? readv(o->fd, o->iov, (int)o->len)
                         : preadv(o->fd, o->iov, (int)o->len, off));
  case WEFT_FOP_WRITEV:
    return io_result(pos ? writev(o->fd, o->iov, (int)o->len)
                         : pwritev(o->fd, o->iov, (int)o->len, off));
  case WEFT_FOP_FSYNC:
    return io_result(fsync(o->fd));
  case WEFT_FOP_FDATASYNC:
    return io_result(fdatasync(o->fd));
  case WEFT_FOP_OPEN:
    return io_result(openat(o->fd, o->path, o->flags, o->mode));
  case WEFT_FOP_CLOSE:
    return io_result(close(o->fd));
  default: /* WEFT_FOP_STATX, as stat(2) or fstat(2) */
    return io_result(o->path[0] ? stat(o->path, q->st) : fstat(o->fd, q->st));
  }
}

static void pool_done(void *arg, long result) {
  struct fsreq *q = arg;
  q->result = result; /* or -ECANCELED: the job never ran */
  deliver(q);
}

/* ---- the calls -------------------------------------------------------------
 */

static int check(weft_rt *rt, weft_strand *s, weft_fs_fn fn) {
  if (!rt || !fn)
    return -EINVAL;
  if (weft__forked(rt))
    return -ECHILD;
  int sr = weft__strand_usable(rt, s);
  if (sr)
    return sr;
  return 0;
}

/* A request with room for path (may be NULL) and iovcnt iovecs. */
static struct fsreq *req_new(weft_rt *rt, weft_strand *s, int kind, int fd,
                             const char *path, int iovcnt, weft_fs_fn fn,
                             void *arg) {
  size_t pl = path ? strlen(path) + 1 : 1;
  size_t iovsz = (size_t)iovcnt * sizeof(struct iovec);
  struct fsreq *q = calloc(1, sizeof(*q) + pl + 15 + iovsz);
  if (!q)
    return NULL;
  q->rt = rt;
  q->strand = s;
  q->fn = fn;
  q->arg = arg;
  q->op.kind = kind;
  q->op.fd = fd;
  if (path)
    memcpy(q->path, path, pl);
  q->op.path = q->path;
  /* iovecs after the path, aligned */
  q->iov = (struct iovec *)(((uintptr_t)(q->path + pl) + 15) & ~(uintptr_t)15);
  return q;
}

static int submit(struct fsreq *q) {
  if (ring_submit(q))
    return 0;
  int r = weft__blocking_submit(q->rt, q->rt->blocking, pool_work, q, q->strand,
                                pool_done, NULL);
  if (r)
    free(q);
  return r;
}

int weft_fs_open(weft_rt *rt, weft_strand *s, const char *path, int flags,
                 unsigned mode, weft_fs_fn fn, void *arg) {
  int r = check(rt, s, fn);
  if (r || !path)
    return r ? r : -EINVAL;
  struct fsreq *q = req_new(rt, s, WEFT_FOP_OPEN, AT_FDCWD, path, 0, fn, arg);
  if (!q)
    return -ENOMEM;
  q->op.flags = flags | O_CLOEXEC;
  q->op.mode = mode;
  return submit(q);
}

int weft_fs_close(weft_rt *rt, weft_strand *s, int fd, weft_fs_fn fn,
                  void *arg) {
  int r = check(rt, s, fn);
  if (r || fd < 0)
    return r ? r : -EINVAL;
  struct fsreq *q = req_new(rt, s, WEFT_FOP_CLOSE, fd, NULL, 0, fn, arg);
  return q ? submit(q) : -ENOMEM;
}

static int rw(weft_rt *rt, weft_strand *s, int kind, int fd, void *buf,
              size_t len, int64_t off, weft_fs_fn fn, void *arg) {
  int r = check(rt, s, fn);
  if (r || fd < 0 || (!buf && len) || off < -1)
    return r ? r : -EINVAL;
  struct fsreq *q = req_new(rt, s, kind, fd, NULL, 0, fn, arg);
  if (!q)
    return -ENOMEM;
  q->op.buf = buf;
  q->op.len = len < MAX_RW ? len : MAX_RW;
  q->op.off = (uint64_t)off;
  return submit(q);
}

int weft_fs_read(weft_rt *rt, weft_strand *s, int fd, void *buf, size_t len,
                 int64_t off, weft_fs_fn fn, void *arg) {
  return rw(rt, s, WEFT_FOP_READ, fd, buf, len, off, fn, arg);
}

int weft_fs_write(weft_rt *rt, weft_strand *s, int fd, const void *buf,
                  size_t len, int64_t off, weft_fs_fn fn, void *arg) {
  return rw(rt, s, WEFT_FOP_WRITE, fd, (void *)buf, len, off, fn, arg);
}

static int rwv(weft_rt *rt, weft_strand *s, int kind, int fd,
               const struct iovec *iov, int iovcnt, int64_t off, weft_fs_fn fn,
               void *arg) {
  int r = check(rt, s, fn);
  if (r || fd < 0 || !iov || iovcnt < 1 || iovcnt > MAX_IOV || off < -1)
    return r ? r : -EINVAL;
  struct fsreq *q = req_new(rt, s, kind, fd, NULL, iovcnt, fn, arg);
  if (!q)
    return -ENOMEM;
  memcpy(q->iov, iov, (size_t)iovcnt * sizeof(*iov));
  q->op.iov = q->iov;
  q->op.len = (size_t)iovcnt;
  q->op.off = (uint64_t)off;
  return submit(q);
}

int weft_fs_readv(weft_rt *rt, weft_strand *s, int fd, const struct iovec *iov,
                  int iovcnt, int64_t off, weft_fs_fn fn, void *arg) {
  return rwv(rt, s, WEFT_FOP_READV, fd, iov, iovcnt, off, fn, arg);
}

int weft_fs_writev(weft_rt *rt, weft_strand *s, int fd, const struct iovec *iov,
                   int iovcnt, int64_t off, weft_fs_fn fn, void *arg) {
  return rwv(rt, s, WEFT_FOP_WRITEV, fd, iov, iovcnt, off, fn, arg);
}

int weft_fs_fsync(weft_rt *rt, weft_strand *s, int fd, int datasync,
                  weft_fs_fn fn, void *arg) {
  int r = check(rt, s, fn);
  if (r || fd < 0)
    return r ? r : -EINVAL;
  struct fsreq *q =
      req_new(rt, s, datasync ? WEFT_FOP_FDATASYNC : WEFT_FOP_FSYNC, fd, NULL,
              0, fn, arg);
  return q ? submit(q) : -ENOMEM;
}

int weft_fs_stat(weft_rt *rt, weft_strand *s, const char *path, int fd,
                 struct stat *st, weft_fs_fn fn, void *arg) {
  int r = check(rt, s, fn);
  if (r || !st || (!path && fd < 0) || (path && !path[0]))
    return r ? r : -EINVAL;
  /* statx(2): a path from the working directory, or the descriptor itself
   * with an empty path. */
  struct fsreq *q =
      req_new(rt, s, WEFT_FOP_STATX, path ? AT_FDCWD : fd, path, 0, fn, arg);
  if (!q)
    return -ENOMEM;
  q->st = st;
  q->op.flags = path ? 0 : AT_EMPTY_PATH;
  q->op.stx = &q->stx;
  return submit(q);
}

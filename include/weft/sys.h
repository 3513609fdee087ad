/*
 * weft/sys.h - the rest of a server's system calls, none of which waits
 * for its result on a worker: name resolution, files, child processes.
 * Part of weft's API: include <weft.h>, which includes this file.
 */
#ifndef WEFT_SYS_H
#define WEFT_SYS_H

#ifndef WEFT_H
#error "include <weft.h>, which includes this header"
#endif

/* ---- name resolution -------------------------------------------------------
 * getaddrinfo(3) off the shards' threads: a lookup runs on a pool of its own
 * (weft_config.resolve_threads), apart from weft_blocking's, so lookups that
 * wait on a slow or silent name server hold neither a shard nor the threads
 * other blocking work (files) needs; the system's resolver gives up on its own
 * after its timeouts (resolv.conf(5): timeout, attempts). A shutdown waits for
 * lookups already running; queued ones run (DRAIN) or complete with -ECANCELED
 * (CANCEL). */
struct addrinfo;
typedef struct weft_lookup weft_lookup;

/* Errors of a lookup, beyond errno values (weft_strerror names them):
 * the name or service is not known (EAI_NONAME, EAI_NODATA, EAI_SERVICE,
 * EAI_ADDRFAMILY); the name server did not answer, try later (EAI_AGAIN);
 * it failed for good (EAI_FAIL). Bad hints give -EINVAL, EAI_MEMORY
 * -ENOMEM, EAI_SYSTEM the errno. */
#define WEFT_EAI_NONAME (-3001)
#define WEFT_EAI_AGAIN (-3002)
#define WEFT_EAI_FAIL (-3003)

/* status 0: res is the list of addresses (never NULL), weft's until fn
 * returns (it is freed then: copy what you keep); otherwise res is NULL
 * and status is a WEFT_EAI_* code, -ECANCELED (weft_resolve_cancel, or a
 * CANCEL shutdown before the lookup started), or a negative errno. */
typedef void (*weft_resolve_fn)(void *arg, int status, struct addrinfo *res);

/* Looks up host and service (either may be NULL, not both) as
 * getaddrinfo(host, service, hints) would; hints may be NULL (any family,
 * AI_ADDRCONFIG | AI_V4MAPPED, as glibc) and is copied, as are the
 * strings. fn runs once on strand s (NULL: any worker). *out (may be
 * NULL) names the lookup until fn has been called. Errors (fn will not be
 * called): -EINVAL, -EXDEV (s of another runtime), -EBADF (s released),
 * -EAGAIN (1024 lookups already wait, or no pool thread could start),
 * -ESHUTDOWN, -ENOMEM. Any thread. */
WEFT_API int weft_resolve(weft_rt *rt, weft_strand *s, const char *host,
                          const char *service, const struct addrinfo *hints,
                          weft_resolve_fn fn, void *arg, weft_lookup **out);

/* Gives up on r: fn runs with -ECANCELED (queued after this returns),
 * whether the lookup had started or not; a lookup that is running goes on
 * to its end on its pool thread, and its result is dropped. Errors:
 * -EINVAL, -EALREADY (fn has started with the result: from inside fn,
 * or from another thread while fn runs),
 * -ESHUTDOWN (called from outside the runtime once its shutdown has
 * begun: fn still comes, with the result or -ECANCELED). Call it only
 * while fn has not returned: on fn's strand that is known before fn runs;
 * from elsewhere, hold a lock that fn also takes. Any thread. */
WEFT_API int weft_resolve_cancel(weft_lookup *r);

/* ---- files -----------------------------------------------------------------
 * File operations that never block a worker: each completes once with fn(arg,
 * result) on strand s (NULL: any worker), never inside the call. With the
 * io_uring backend they go through the calling shard's ring (the kernel runs
 * those that would block on its own threads); from a thread outside the
 * runtime, with epoll, or on a kernel without the opcodes, they run on the
 * blocking pool (weft_blocking's), with the same results. result is what the
 * system call returns: bytes, a descriptor, 0, or a negative errno; short
 * reads and writes come as the kernel makes them, and a read at the end of the
 * file gives 0. Buffers, iovec arrays' memory and *st must stay valid until fn
 * runs (paths and iovec arrays themselves are copied). An offset of -1 uses
 * and moves the file position (as read(2)), which concurrent operations on one
 * descriptor share: use offsets for those. At a CANCEL shutdown an operation
 * not yet started may complete with -ECANCELED; one in the kernel completes.
 * Errors of the calls themselves (fn will not run): -EINVAL (rt or fn NULL, a
 * bad argument), -EXDEV (s of another runtime), -EBADF (s released),
 * -ESHUTDOWN, -ENOMEM, -EAGAIN (the blocking pool's queue is full). */
struct stat;
struct iovec;
typedef void (*weft_fs_fn)(void *arg, long result);

/* open(2) of path with flags (O_CLOEXEC is added) and mode; result: the
 * descriptor. */
WEFT_API int weft_fs_open(weft_rt *rt, weft_strand *s, const char *path,
                          int flags, unsigned mode, weft_fs_fn fn, void *arg);
/* close(2) of fd; result 0. fd must not be used by an operation in
 * flight. */
WEFT_API int weft_fs_close(weft_rt *rt, weft_strand *s, int fd, weft_fs_fn fn,
                           void *arg);
/* pread(2) / pwrite(2) of len bytes (at most 2 GiB - 4 KiB) at off (-1:
 * the file position); result: bytes. */
WEFT_API int weft_fs_read(weft_rt *rt, weft_strand *s, int fd, void *buf,
                          size_t len, int64_t off, weft_fs_fn fn, void *arg);
WEFT_API int weft_fs_write(weft_rt *rt, weft_strand *s, int fd, const void *buf,
                           size_t len, int64_t off, weft_fs_fn fn, void *arg);
/* preadv(2) / pwritev(2) of iovcnt (1..1024) buffers. */
WEFT_API int weft_fs_readv(weft_rt *rt, weft_strand *s, int fd,
                           const struct iovec *iov, int iovcnt, int64_t off,
                           weft_fs_fn fn, void *arg);
WEFT_API int weft_fs_writev(weft_rt *rt, weft_strand *s, int fd,
                            const struct iovec *iov, int iovcnt, int64_t off,
                            weft_fs_fn fn, void *arg);
/* fsync(2), or fdatasync(2) with datasync non-zero; result 0. */
WEFT_API int weft_fs_fsync(weft_rt *rt, weft_strand *s, int fd, int datasync,
                           weft_fs_fn fn, void *arg);
/* stat(2) of path, or fstat(2) of fd with path NULL, into *st; result 0.
 * (fd is ignored when path is given.) */
WEFT_API int weft_fs_stat(weft_rt *rt, weft_strand *s, const char *path, int fd,
                          struct stat *st, weft_fs_fn fn, void *arg);

/* ---- child processes -------------------------------------------------------
 * weft_spawn starts a program and calls fn once, on strand s, when it has
 * ended; weft reaps it (through a pidfd made with the child, Linux 5.4: no
 * SIGCHLD handler is taken, and no zombie is left). Its stdin, stdout and
 * stderr can each be a stream to the parent: a weft_tcp connection over a Unix
 * socket pair, on strand s, with every call of the TCP section (read, write,
 * weft_tcp_shutdown to send EOF to the child's stdin, a close callback of its
 * own). A shutdown of the runtime kills (SIGKILL) and reaps the children still
 * running: their exit callbacks report it. A child that cannot be killed (it
 * took a user this process may not signal, as a set-user-ID program may) is
 * left running and unreaped, and its exit callback reports -EPERM. */
typedef struct weft_process weft_process;

/* exit_code: the program's exit status (term_signal 0), or 0 when
 * term_signal, the signal that ended it, is not 0; or, with term_signal 0, a
 * negative errno when how it ended is unknown: -ECHILD, its status went to
 * another reaper (SIGCHLD ignored, or a waitpid(-1) elsewhere in the process);
 * -EPERM, left running at a shutdown (above). p is gone once fn returns. */
typedef void (*weft_exit_fn)(void *arg, weft_process *p, int exit_code,
                             int term_signal);

/* weft_spawn_opts.stdio[i] */
#define WEFT_STDIO_INHERIT 0 /* the parent's own descriptor i */
#define WEFT_STDIO_NULL 1    /* /dev/null */
#define WEFT_STDIO_PIPE 2    /* a stream to the parent (*streams[i]) */

typedef struct weft_spawn_opts {
  const char *const *argv; /* argv[0]: the program, searched in PATH
                              when it has no '/'; NULL-terminated */
  const char *const *envp; /* NULL: the parent's environment */
  const char *cwd;         /* NULL: the parent's working directory */
  int stdio[3];            /* WEFT_STDIO_*, for stdin, stdout, stderr */
} weft_spawn_opts;

/* Starts o->argv. *out (may be NULL) names the process until fn has
 * returned; streams[i] receives the stream of each WEFT_STDIO_PIPE (NULL
 * for the others; streams may be NULL if there is none). The child starts
 * with no signal blocked and its streams blocking, as a program expects.
 * The calling thread waits until the child has begun the program (a vfork's
 * wait, the exec's time: a millisecond or less, more for a large program on
 * a loaded machine), so that a program that cannot start is an error here.
 * A wait past the stall threshold moves the shard to another thread, as a
 * stall does, but is not reported or counted as one.
 * Must be called on strand s when it makes streams (their close callbacks
 * are set there: weft_tcp_set_data before the handler returns). Errors
 * (nothing started): -EINVAL, -EXDEV, -EBADF (s released), -EPERM (streams
 * asked for off strand s), -ENOENT, -EACCES, -ENOEXEC and the exec's other
 * errors (the program, or cwd for -ENOENT), -EMFILE, -ENOMEM, -EAGAIN (the
 * process limit), -ESHUTDOWN, -ENOTSUP (backend NONE), -ENOSYS (no pidfd:
 * Linux before 5.4). */
WEFT_API int weft_spawn(weft_rt *rt, weft_strand *s, const weft_spawn_opts *o,
                        weft_exit_fn fn, void *arg, weft_process **out,
                        weft_tcp *streams[3]);

/* Sends signo to p (pidfd_send_signal: never to a process that reused
 * its pid). Errors: -EINVAL, -ESRCH (it has ended; its exit callback is
 * coming), -EPERM (it took a user this process may not signal). Only until
 * p's exit callback has returned. Any thread. */
WEFT_API int weft_process_kill(weft_process *p, int signo);
/* p's process id. Any thread, until its exit callback has returned. */
WEFT_API int weft_process_pid(const weft_process *p);

#endif /* WEFT_SYS_H */

/*
 * weft/net.h - sockets: TCP and Unix stream connections and listeners,
 * connecting by name, UDP. Part of weft's API: include <weft.h>, which
 * includes this file.
 */
#ifndef WEFT_NET_H
#define WEFT_NET_H

#ifndef WEFT_H
#error "include <weft.h>, which includes this header"
#endif

/* ---- TCP and Unix stream sockets -------------------------------------------
 * Connections and listeners, over TCP (IPv4, IPv6) or Unix domain stream
 * sockets (AF_UNIX: weft_unix_addr makes the address): the same weft_tcp and
 * weft_listener calls serve both, and everything below holds for both unless
 * it says otherwise. Every callback of a connection runs on its strand: the
 * one given to weft_tcp_connect, or one weft creates for it (accepted
 * connections, or connect with strand NULL). Callbacks are never called from
 * inside the weft_tcp_* call that causes them.
 *
 * Threads: weft_tcp_read, _write, _writev, _shutdown, _set_watermarks,
 * _set_data and the option setters must be called on the connection's
 * strand (from one of its handlers or callbacks); elsewhere they fail with
 * -EPERM. weft_tcp_close may be called from any thread.
 *
 * Lifetime. A connection's first callback is its accept callback, or its
 * connect callback (whatever the result). Its last is its close callback,
 * set with weft_tcp_set_data, which runs exactly once whatever ends the
 * connection: weft_tcp_close, a failed or cancelled connect (the
 * connection closes itself once the connect callback returns), a timeout
 * (weft_tcp_set_timeouts), or the runtime's shutdown (any mode,
 * weft_rt_destroy included). It runs on the strand after every other
 * callback of the connection has returned and after every handler posted
 * to the strand before the connection finished closing, and after it weft
 * never touches the connection again: free what belongs to the
 * connection there, and nowhere else. A read or write error does not
 * close the connection: close it (a callback that sees an error may call
 * weft_tcp_close even when a close is under way; it returns -EALREADY).
 * The connection must not be used once its close callback has returned.
 *
 * Strands. A connection weft made a strand for (accepted, or connect with
 * strand NULL) keeps it until its close callback has returned, and as long
 * as another connection made on it (weft_tcp_connect with
 * weft_tcp_strand(conn)) is open: timers on the strand must be destroyed
 * by then, and the close callback is the place (weft_timer_destroy drops a
 * firing still queued). An operation that completes on the strand
 * (weft_fs_*, weft_resolve, weft_blocking) keeps it too: its callback runs
 * there even when the connection closed first, so it must not touch the
 * connection then (the close callback tells it so, as examples/file_server.c
 * does).
 *
 * Buffers are the caller's: a read buffer must stay valid until the read
 * callback has been called, a write buffer (and, for writev, the memory the
 * iovecs point to; the iovec array itself is copied) until the write
 * callback has been called, whatever happens, including close and shutdown.
 *
 * Close: every operation in flight completes exactly once, with
 * -ECANCELED when the close ended it, before the close callback; the
 * kernel has released every buffer by then. weft_rt_shutdown closes every
 * listener and connection of the runtime in the same way (in both modes; in
 * CANCEL mode the callbacks still run, with -ECANCELED), and new ones fail
 * with -ESHUTDOWN.
 *
 * Writes are sent in the order they were made, each completed when all its
 * bytes are in the kernel; a partial send is continued, never reordered. A
 * write call, and each turn of the connection's strand, hands the kernel
 * at most 1 MiB by itself (the io_uring backend hands it none: its sends
 * go through the ring); a larger write goes on in later turns, so no
 * write holds its shard's other strands for longer than that takes.
 * Sends never raise SIGPIPE (MSG_NOSIGNAL); a closed peer gives -EPIPE or
 * -ECONNRESET. EINTR is retried inside weft. */
struct sockaddr;
struct iovec;
typedef struct weft_tcp weft_tcp;
typedef struct weft_listener weft_listener;

/* A new connection, on its own strand. Close it when done with it. */
typedef void (*weft_accept_fn)(void *arg, weft_tcp *conn);
/* status 0: connected; -ETIMEDOUT, -ECONNREFUSED, -ECANCELED (closed
 * before it connected), other negative errno: failed, and the connection
 * closes itself when this returns (the close callback set by then runs). */
typedef void (*weft_connect_fn)(void *arg, weft_tcp *conn, int status);
/* n > 0: bytes read into the buffer; 0: the peer closed its side (EOF);
 * n < 0: -ECONNRESET, -ECANCELED (closed), other negative errno. */
typedef void (*weft_read_fn)(void *arg, weft_tcp *conn, long n);
/* 0: every byte is in the kernel; -ECANCELED: closed before it was all
 * sent (part of it may have been); -EPIPE, -ECONNRESET, other negative
 * errno: the connection failed. */
typedef void (*weft_write_fn)(void *arg, weft_tcp *conn, int status);
/* The connection is closed: its descriptor is closed, every other callback
 * of it has returned, and its memory goes back to weft after this returns.
 * data: what weft_tcp_set_data gave. */
typedef void (*weft_close_fn)(void *data, weft_tcp *conn);
/* Queued write bytes fell to the low watermark after a write was refused
 * with -ENOBUFS: writing may resume. */
typedef void (*weft_drain_fn)(void *arg, weft_tcp *conn);

/* weft_listen_opts.flags */
/* One listening socket on one shard, instead of one per shard (the default:
 * the kernel spreads connections over the shards' sockets, so no lock is
 * shared between shards on the accept path). Either way each TCP socket is
 * bound with SO_REUSEPORT, so WEFT_LISTEN_SHARE listeners can join it. */
#define WEFT_LISTEN_SINGLE 1u
/* Bind even where SO_REUSEPORT sockets of the same user already listen
 * (another process, say, taking over during a restart) and share the
 * connections with them. Without it an address already in use fails with
 * -EADDRINUSE, even when what holds it is a SO_REUSEPORT group. The kernel
 * decides who may join a group, not the listener bound first: a listener
 * made without the flag keeps out weft listeners made without it, not
 * those made with it nor other programs' SO_REUSEPORT sockets. */
#define WEFT_LISTEN_SHARE 2u

typedef struct weft_listen_opts {
  int backlog;    /* listen() backlog per socket; 0: SOMAXCONN */
  unsigned flags; /* WEFT_LISTEN_*; others must be zero */
} weft_listen_opts;

typedef struct weft_listener_stats {
  uint64_t accepted;      /* connections handed to the accept callback */
  uint64_t accept_calls;  /* accept attempts (syscalls or io_uring ops) */
  uint64_t fd_limit_hits; /* EMFILE / ENFILE / ENOBUFS / ENOMEM from accept */
  uint64_t dropped; /* connections reset or closed while descriptors ran out */
  uint64_t paused;  /* times accepting paused (then resumed with backoff) */
} weft_listener_stats;

/* Listens on addr (IPv4 or IPv6; port 0 picks a free port, the same for
 * every shard's socket; or Unix, below) and calls fn(arg, conn) on each
 * new connection's strand. SO_REUSEADDR is set. An address in use by another
 * listening socket, weft's or not, fails with -EADDRINUSE unless
 * WEFT_LISTEN_SHARE is given; the check is made just before the shards' sockets
 * bind, so a socket bound by someone else in between can still be joined. When
 * descriptors run out (EMFILE, ENFILE) accepting pauses, backing off from 1 ms
 * to 100 ms, and resumes by itself; the connections waiting meanwhile are
 * dropped, so clients do not hang. A TCP socket resets its whole queue
 * (shutdown(2) of a listening socket, then listen(2) again on the same port),
 * which takes no descriptor: each client waiting sees a reset, and one that
 * comes in that instant may see its connect refused or reset. `dropped`
 * counts the queue read just before, so it may miss one that came in
 * between. Where net.ipv4.tcp_migrate_req is set (off by default), the
 * kernel moves a group's queue to its other sockets instead: while every
 * socket of the group is short its clients wait, and `dropped` does not
 * count them (logged at WEFT_LOG_INFO by the listen). A Unix socket accepts and
 * closes up to 64 at a time through a spare descriptor, one per runtime, opened
 * by its first Unix listen and closed by weft_rt_destroy: a descriptor opened
 * elsewhere in the process in between (a TCP accept included) can take the
 * spare's slot, and until one is freed nothing more is dropped there, and its
 * clients wait. On io_uring a TCP listener's sockets each keep one accept
 * request waiting in the kernel, which reads RLIMIT_NOFILE when the request is
 * made: a soft limit lowered while the listener runs binds its accepts from the
 * next request on (after an error, a shortage, or a pause). fn may run before a
 * successful call returns; after a failed one it never runs, and clients that
 * had already reached one of its sockets are reset. opts may be NULL. Errors:
 * -EINVAL (bad arguments, addrlen too small for the family, WEFT_LISTEN_SHARE
 * with Unix), -EAFNOSUPPORT (neither IPv4, IPv6 nor Unix), -EADDRINUSE,
 * -EACCES, -ENOENT (a Unix path's directory does not exist), -EADDRNOTAVAIL,
 * -ENODEV (an IPv6 link-local address whose sin6_scope_id names no interface),
 * -EMFILE, -ENOMEM, -ESHUTDOWN, -ENOTSUP (backend NONE), -EAGAIN (the runtime's
 * first socket could not start every shard's thread:
 * weft_config.eager_workers). Any thread. */
WEFT_API int weft_tcp_listen(weft_rt *rt, const struct sockaddr *addr,
                             unsigned addrlen, const weft_listen_opts *opts,
                             weft_accept_fn fn, void *arg, weft_listener **out);

/* Unix domain listeners: one socket, served by one shard (the kernel has
 * no SO_REUSEPORT groups for them). A path names a socket file: a file
 * left there by a listener that is gone (a socket nobody listens on) is
 * replaced, while a live listener or a file that is not a socket gives
 * -EADDRINUSE; the listener removes its file when it closes (unless
 * another was bound there since). Whether a listener is live is found by
 * connecting to it: a live one sees a connection that closes at once. A
 * socket bound there but not yet listening counts as gone. Two processes
 * that bind the same stale path at the same moment may both replace it:
 * serialize such starts. An
 * abstract name (weft_unix_addr's "@name") has no file; an address of the
 * family alone (addrlen sizeof(sa_family_t)) has the kernel pick an
 * abstract name, which weft_listener_addr tells. */

/* The bound address (with the port picked for port 0). *addrlen is the
 * size of addr on entry, the address length on return. Any thread. */
WEFT_API int weft_listener_addr(weft_listener *l, struct sockaddr *addr,
                                unsigned *addrlen);
WEFT_API int weft_listener_stats_get(weft_listener *l,
                                     weft_listener_stats *out);

/* Stops accepting and closes the sockets. done(arg), if not NULL, runs on
 * any worker once no accept callback of l will start any more: connections
 * accepted before the close still get theirs (they run on each
 * connection's strand), and done runs after the last has returned. Its
 * sockets are closed by then (and a Unix listener's file removed): from
 * done on, the address is free to listen on again, done included. l must
 * not be used after this call. Connections already accepted are not
 * affected.
 * Errors: -EINVAL, -EALREADY (closed already, or by a shutdown that left no
 * accept callback to wait for: done is not called). Any thread. */
WEFT_API int weft_listener_close(weft_listener *l, weft_fn done, void *arg);

/* Connects to addr. *out receives the connection at once (so that it can
 * be closed to give up); fn runs on the strand (NULL: a new one of its own)
 * with the result. timeout_ns 0: the kernel's own (minutes). A Unix
 * connect is answered at once: -ENOENT (no such file), -ECONNREFUSED
 * (nobody listens there), -EAGAIN (the listener's backlog is full).
 * Errors (nothing was created): -EINVAL, -EXDEV (strand of another
 * runtime), -EAFNOSUPPORT, -EMFILE, -ENOMEM, -ESHUTDOWN, -ENOTSUP, -EAGAIN
 * (as weft_tcp_listen). Any thread. */
WEFT_API int weft_tcp_connect(weft_rt *rt, weft_strand *strand,
                              const struct sockaddr *addr, unsigned addrlen,
                              uint64_t timeout_ns, weft_connect_fn fn,
                              void *arg, weft_tcp **out);

/* Connects to host (a name, or a numeric address) and service (a port
 * number, or a name from /etc/services), looked up as weft_resolve does:
 * tries each address in turn, interleaving IPv6 and IPv4 as RFC 8305
 * orders them (at most 16 addresses), each attempt ending after
 * attempt_ns (0: the kernel's own timeout, minutes) or at its first
 * failure. fn runs once on strand s (NULL: a new strand of its own, which
 * becomes the connection's): with status 0 and the connection (as
 * weft_tcp_connect's callback: set its data and close callback there), or
 * with conn NULL and the last attempt's error (-ECONNREFUSED,
 * -ETIMEDOUT, ...), the lookup's (WEFT_EAI_*), or -ECANCELED (cancelled,
 * or a shutdown of the runtime came before the next attempt). The failed
 * attempts' connections close by themselves. *out (may be NULL) names the
 * dial until fn has been called. Errors (fn will not be called): as
 * weft_resolve, and -EINVAL (host or service NULL). Any thread. */
typedef struct weft_dial weft_dial;
WEFT_API int weft_tcp_dial(weft_rt *rt, weft_strand *s, const char *host,
                           const char *service, uint64_t attempt_ns,
                           weft_connect_fn fn, void *arg, weft_dial **out);

/* Gives up on d: fn runs with -ECANCELED (a connection that got through
 * meanwhile is closed). Errors: -EINVAL, -EALREADY (fn has started, or d
 * was cancelled before). Only while fn has not returned (as
 * weft_resolve_cancel). Any thread. */
WEFT_API int weft_tcp_dial_cancel(weft_dial *d);

/* Reads up to len bytes (len is capped at 1 GiB) into buf; fn runs once
 * with the result: the bytes read, 0 at end of file, or a negative errno.
 * One read at a time. With io_uring, bytes that arrive between reads are
 * kept in the shard's 4 KiB receive buffers, about 8 per connection (its
 * receive stops there; what the socket had received by then comes on
 * top), then the kernel's socket buffer and TCP flow control hold the
 * rest; the next read gets them first. Errors: -EINVAL (buf or fn NULL, len 0),
 * -EBUSY (a read is in flight), -ENOTCONN (not connected yet), -EBADF
 * (closing), -EPERM (not on the strand), -ESHUTDOWN. */
WEFT_API int weft_tcp_read(weft_tcp *c, void *buf, size_t len, weft_read_fn fn,
                           void *arg);

/* Reads into buf until it holds the delimiter delim (dlen bytes), or len
 * bytes: for line and header protocols. buf already holds have bytes
 * (those left after the previous message; 0 at first). fn(arg, conn, n,
 * have) runs once: n > 0, buf[0, n) is a message ending with the
 * delimiter's first appearance, and buf holds have bytes in all (the
 * bytes after n are the start of what follows: move them to the front
 * and pass have - n to the next call); -EMSGSIZE, buf is full without
 * it; 0, end of file (have: the bytes received before it); n < 0, as
 * weft_tcp_read. A delimiter already among the have bytes is answered
 * without reading, after this call returns. delim must stay valid until
 * fn runs. Errors: as weft_tcp_read, and -EINVAL (delim NULL, dlen 0 or
 * above len, have above len, len above 1 GiB). */
typedef void (*weft_until_fn)(void *arg, weft_tcp *conn, long n, size_t have);
WEFT_API int weft_tcp_read_until(weft_tcp *c, void *buf, size_t len,
                                 size_t have, const void *delim, size_t dlen,
                                 weft_until_fn fn, void *arg);

/* Queues len bytes to send; fn (may be NULL) runs once when they are sent
 * or failed. The bytes are not copied: buf must stay valid and unchanged
 * until fn runs (with fn NULL: until the close callback). With io_uring
 * they leave at the thread's next entry into the kernel, which batches
 * the replies of a burst of requests (docs/design.md). A zero-length
 * write is accepted and completes in order.
 * Errors: -EINVAL, -ENOBUFS (queued bytes would exceed the high watermark;
 * a write into an empty queue is always accepted), -EPIPE (after
 * weft_tcp_shutdown or a failed write), -ENOTCONN, -EBADF, -EPERM,
 * -ESHUTDOWN, -ENOMEM. */
WEFT_API int weft_tcp_write(weft_tcp *c, const void *buf, size_t len,
                            weft_write_fn fn, void *arg);
/* The same for iovcnt buffers (1..1024) sent as one write. */
WEFT_API int weft_tcp_writev(weft_tcp *c, const struct iovec *iov, int iovcnt,
                             weft_write_fn fn, void *arg);

/* Queues len bytes of the file fd from offset off, sent in order with the
 * writes (after those queued before it, before those queued after), with
 * no copy through user space (sendfile(2)); fn (may be NULL) runs once
 * when they are sent or failed. fd must stay open until fn runs (with fn
 * NULL: until the close callback); the file's position is not used or
 * changed. The bytes are read from the file on the connection's strand as
 * the socket takes them: a file that is not in the page cache delays that
 * strand, and no other, while the kernel reads it from disk (the monitor
 * moves the rest of its shard on). File bytes hold no memory and do not
 * count toward the watermarks. A zero-length send completes in order.
 * Status: 0, or as for a write, and -ENODATA when the file ends before
 * len bytes, or sendfile's own error (-EIO, -EBADF if fd was opened
 * write-only): the connection's later writes then fail too, since the
 * peer would read them as the file's bytes.
 * Errors: -EBADF (fd not open, or the connection's), -EINVAL (fd not a
 * regular file or block device, off negative, off + len overflows),
 * -EPIPE, -ENOTCONN, -EPERM, -ESHUTDOWN, -ENOMEM. */
WEFT_API int weft_tcp_sendfile(weft_tcp *c, int fd, int64_t off, size_t len,
                               weft_write_fn fn, void *arg);

/* Bytes queued for sending and not yet in the kernel. On the strand. */
WEFT_API size_t weft_tcp_queued(const weft_tcp *c);

/* Write backpressure: a write that would take the queued bytes above high
 * fails with -ENOBUFS (unless the queue is empty), and fn(arg, c) runs once
 * the queue has drained to low or less (fn may be NULL: limits only).
 * Defaults: low 64 KiB, high 1 MiB.
 * Errors: -EINVAL (low > high, high 0), -EPERM, -ENOMEM. */
WEFT_API int weft_tcp_set_watermarks(weft_tcp *c, size_t low, size_t high,
                                     weft_drain_fn fn, void *arg);

/* Half-close: sends FIN once the writes queued so far are sent; reading
 * continues. Later writes fail with -EPIPE. Errors: -ENOTCONN, -EBADF,
 * -EPERM, -EALREADY. */
WEFT_API int weft_tcp_shutdown(weft_tcp *c);

/* Closes c: in-flight operations complete with -ECANCELED (queued writes
 * not yet sent included: they are not sent, so to send everything first,
 * close from the last write's callback), then the close callback runs
 * (see "Lifetime" above). With abortive non-zero the peer of a TCP
 * connection gets RST instead of FIN (SO_LINGER 0; a Unix socket's peer
 * reads the end either way). Errors: -EINVAL (c NULL), -EALREADY (already
 * closing: closed before, or closing by itself), -ESHUTDOWN (called from
 * outside the runtime once its shutdown has begun: the shutdown closes c, and
 * the close callback still comes). Any thread; but c may close by itself (a
 * timeout, a shutdown), and once its close callback has returned c is
 * gone: a thread other than c's strand must know that it has not, for
 * example by holding a lock that the close callback also takes. */
WEFT_API int weft_tcp_close(weft_tcp *c, int abortive);

/* Ties data to c: weft_tcp_data(c) returns it, and on_close(data, c)
 * (may be NULL) is c's close callback. Calling it in the accept or connect
 * callback is always in time: those come first, even for a connection a
 * close from another thread (or a shutdown) has already ended. Errors:
 * -EINVAL, -EPERM (not on the strand). */
WEFT_API int weft_tcp_set_data(weft_tcp *c, void *data, weft_close_fn on_close);
/* What weft_tcp_set_data gave c last (NULL before). On the strand. */
WEFT_API void *weft_tcp_data(const weft_tcp *c);

/* Timeouts of c, in nanoseconds (0: none): idle, no byte received (by a
 * read, or by weft_tcp_read_until while it gathers its delimiter) or sent for
 * that long; read, a read that gets nothing for that long after it was made;
 * write, queued bytes of which none could be sent for that long (a peer that
 * stopped reading). When one passes, c closes by
 * itself: operations in flight complete with -ETIMEDOUT (instead of
 * -ECANCELED), then the close callback runs. A deadline is kept by the
 * shard's timer wheel: c is closed when its timer fires, as late as a
 * timer can be (weft_timer_start), never early. Calling it again replaces
 * the settings and restarts the idle time; all 0 turns them off. The
 * first call allocates c's timer, once; reads and writes allocate nothing
 * for it. On the strand, connected. Errors: -EINVAL, -EPERM, -ENOTCONN,
 * -EBADF (closing), -ENOMEM, -ESHUTDOWN. */
WEFT_API int weft_tcp_set_timeouts(weft_tcp *c, uint64_t idle_ns,
                                   uint64_t read_ns, uint64_t write_ns);

/* Options; on the strand. Errors: -EINVAL, -EPERM, -EBADF, or the
 * setsockopt error (-EOPNOTSUPP on a Unix socket). keepalive: idle_s
 * (1..32767) seconds before probes. */
WEFT_API int weft_tcp_nodelay(weft_tcp *c, int on);
WEFT_API int weft_tcp_keepalive(weft_tcp *c, int on, unsigned idle_s);

/* The connection's strand. Any thread. */
WEFT_API weft_strand *weft_tcp_strand(const weft_tcp *c);
/* Local and peer addresses (as weft_listener_addr). On the strand. */
WEFT_API int weft_tcp_local_addr(weft_tcp *c, struct sockaddr *addr,
                                 unsigned *addrlen);
WEFT_API int weft_tcp_peer_addr(weft_tcp *c, struct sockaddr *addr,
                                unsigned *addrlen);

/* Fills *sa with the Unix domain address of path and returns its length
 * (for weft_tcp_listen and weft_tcp_connect's addrlen). A path starting
 * with '@' names the abstract namespace (Linux): the rest is the name, no
 * file is made, and the name goes away with the last socket bound to it.
 * Errors: -EINVAL (sa or path NULL, path empty), -ENAMETOOLONG (a path of
 * more than 107 bytes, an abstract name of more than 107 after the '@'). */
struct sockaddr_un;
WEFT_API int weft_unix_addr(struct sockaddr_un *sa, const char *path);

/* The peer process of a Unix connection, as the kernel recorded it when
 * the connection was made (SO_PEERCRED): its process id, user and group. */
typedef struct weft_cred {
  int32_t pid;
  uint32_t uid, gid;
} weft_cred;

/* The credentials of c's peer. On the strand. Errors: -EINVAL, -EPERM,
 * -EBADF (closing), -EAFNOSUPPORT (not a Unix connection). */
WEFT_API int weft_tcp_peer_cred(weft_tcp *c, weft_cred *out);

/* Passing descriptors. A Unix connection can carry open descriptors
 * (SCM_RIGHTS): the receiving process gets descriptors of its own for the
 * same open files and sockets (a connection accepted by one process and
 * served by another, a file opened with rights the receiver lacks). A
 * connection receives none until weft_tcp_set_fd_limit allows it: the
 * kernel closes those its reads meet while it has no limit, and those
 * beyond the limit, so a peer can never make the process hold more than
 * the limit per connection. */

/* Queues a write of len bytes whose first byte carries the nfds
 * descriptors of fds (the array is copied). It leaves in order with the
 * other writes; buf, and the descriptors, must stay valid and open until
 * fn has been called (the kernel takes references of its own when the
 * byte is sent: close yours after). A descriptor that is not open when
 * the byte is sent fails the write, and the writes queued behind it,
 * with -EBADF, and the connection writes no more (later writes: -EPIPE).
 * On the strand. Errors: as weft_tcp_write, and -EINVAL (len
 * 0, fds NULL, nfds not in 1..WEFT_FDS_PER_WRITE), -EBADF (a negative
 * descriptor), -EAFNOSUPPORT (not a Unix connection). */
#define WEFT_FDS_PER_WRITE 253 /* the kernel's SCM_MAX_FD */
WEFT_API int weft_tcp_send_fds(weft_tcp *c, const void *buf, size_t len,
                               const int *fds, int nfds, weft_write_fn fn,
                               void *arg);

/* Lets c receive descriptors, at most max (1..WEFT_FDS_HELD_MAX) of them
 * received and not yet taken at a time; 0 turns receiving off again.
 * Descriptors arrive with the read that takes the first byte of the write
 * that carried them from the socket: take them in its callback. (With
 * weft_tcp_read_until that may be the call that answers the message
 * before, whose read went on into the next one.) Those not taken when c closes
 * are closed. Must be called before c's first read. On the strand. Errors:
 * -EINVAL, -EPERM, -EBADF (closing), -EAFNOSUPPORT (not a Unix connection),
 * -EBUSY (a read was made), -ENOMEM. */
#define WEFT_FDS_HELD_MAX 4096
WEFT_API int weft_tcp_set_fd_limit(weft_tcp *c, unsigned max);

/* The oldest descriptor received on c and not yet taken, now the
 * caller's (close-on-exec is set). -EAGAIN: none. -EMFILE: none, and
 * some that arrived since the last call were closed by the kernel
 * (beyond c's limit, or beyond the process's RLIMIT_NOFILE); told once.
 * On the strand. Errors: -EINVAL, -EPERM. */
WEFT_API int weft_tcp_take_fd(weft_tcp *c);

/* ---- UDP -------------------------------------------------------------------
 * Datagram sockets, IPv4 and IPv6. Every callback of a UDP socket runs on its
 * strand (the one given to weft_udp_open, or one of its own), never inside the
 * weft_udp_* call that causes it. weft_udp_close may be called from any
 * thread; every other call on its strand (elsewhere: -EPERM).
 *
 * Receiving: once weft_udp_recv_start is called, each datagram is handed
 * to the callback in weft's buffer, valid until the callback returns.
 * Datagrams are read in batches (recvmmsg), at most 64 per turn of the
 * strand, so a flood on one socket delays the other strands of its shard
 * by one batch, never more. A datagram longer than max_datagram is cut
 * to it and flagged WEFT_UDP_TRUNC.
 *
 * Sending: weft_udp_send copies the datagram, so its buffer may be reused
 * at once; datagrams queued in one turn of the strand leave together
 * (sendmmsg) at its end, in order. The queue holds at most send_queue
 * bytes, each datagram's in one piece (-ENOBUFS beyond: when it has less
 * than the datagram's length left in one piece, or 1024 datagrams); it
 * fills only while the socket's send buffer is full.
 *
 * Lifetime, as a TCP connection's: the close callback (weft_udp_set_data)
 * runs exactly once, last, whatever closes the socket (weft_udp_close,
 * or the runtime's shutdown), after every queued send's callback (with
 * -ECANCELED for those not sent). */
typedef struct weft_udp weft_udp;

/* weft_udp_recv_fn's flags */
#define WEFT_UDP_TRUNC 1u /* the datagram was longer than max_datagram */

/* n >= 0: a datagram of n bytes at data, from `from` (fromlen bytes; on
 * a connected socket, the peer); n < 0: an error the socket reported
 * (-ECONNREFUSED: an earlier datagram of a connected socket was refused),
 * data and from NULL. */
typedef void (*weft_udp_recv_fn)(void *arg, weft_udp *u, long n,
                                 const void *data, const struct sockaddr *from,
                                 unsigned fromlen, unsigned flags);
/* 0: the datagram is in the kernel; -ECANCELED: closed before it left;
 * other negative errno: the kernel refused it (-ENETUNREACH, -EACCES for
 * a broadcast without SO_BROADCAST, -ECONNREFUSED, ...). */
typedef void (*weft_udp_send_fn)(void *arg, weft_udp *u, int status);
typedef void (*weft_udp_close_fn)(void *data, weft_udp *u);

/* weft_udp_opts.flags */
#define WEFT_UDP_REUSEADDR                                                     \
  1u /* SO_REUSEADDR: share the address (multicast)                            \
      */
#define WEFT_UDP_BROADCAST                                                     \
  2u /* SO_BROADCAST: may send to broadcast addresses */

typedef struct weft_udp_opts {
  unsigned max_datagram; /* bytes read per datagram; 0: 2048 (65535 max) */
  unsigned send_queue;   /* bytes queued for sending at most; 0: 256 KiB */
  unsigned flags;        /* WEFT_UDP_*; others must be zero */
} weft_udp_opts;

/* Opens a UDP socket bound to addr (IPv4 or IPv6; port 0 picks one) on
 * strand s (NULL: a strand of its own, released with the socket). opts
 * may be NULL. Errors: -EINVAL, -EAFNOSUPPORT, -EADDRINUSE, -EACCES,
 * -EADDRNOTAVAIL, -EXDEV (s of another runtime), -EBADF (s released),
 * -EMFILE, -ENOMEM, -ESHUTDOWN, -ENOTSUP (backend NONE), -EAGAIN (as
 * weft_tcp_listen). Any thread. */
WEFT_API int weft_udp_open(weft_rt *rt, weft_strand *s,
                           const struct sockaddr *addr, unsigned addrlen,
                           const weft_udp_opts *opts, weft_udp **out);

/* Calls fn for each datagram from now on (replacing an earlier fn).
 * Errors: -EINVAL, -EPERM, -EBADF (closing). */
WEFT_API int weft_udp_recv_start(weft_udp *u, weft_udp_recv_fn fn, void *arg);
/* No call of the receive callback starts after this returns. Datagrams
 * wait in the socket's buffer, and those already read with the one whose
 * callback stopped receiving wait in weft's: none is lost, and a restart
 * delivers them first, in order. Errors: -EINVAL, -EPERM. */
WEFT_API int weft_udp_recv_stop(weft_udp *u);

/* Sends len bytes (0..65507 for IPv4, 65527 for IPv6) to `to` (NULL on a
 * connected socket: its peer); the bytes are copied. fn (may be NULL)
 * runs once with the result. Errors (fn will not run): -EINVAL,
 * -EMSGSIZE, -EDESTADDRREQ (to NULL, not connected), -EAFNOSUPPORT (to of
 * another family), -ENOBUFS (the send queue is full), -EPERM, -EBADF,
 * -ENOMEM. */
WEFT_API int weft_udp_send(weft_udp *u, const void *buf, size_t len,
                           const struct sockaddr *to, unsigned tolen,
                           weft_udp_send_fn fn, void *arg);

/* Connects u to addr (the kernel then drops datagrams from anyone else
 * and reports the peer's refusals); addr NULL disconnects. Errors:
 * -EINVAL, -EAFNOSUPPORT, -EPERM, -EBADF, or connect(2)'s. */
WEFT_API int weft_udp_connect(weft_udp *u, const struct sockaddr *addr,
                              unsigned addrlen);

/* Joins (join non-zero) or leaves the multicast group (an IPv4 or IPv6
 * address; its port is ignored) on the interface of index ifindex (0:
 * the kernel's choice). Errors: -EINVAL, -EAFNOSUPPORT (a group of
 * another family than u's), -EPERM, -EBADF, or setsockopt(2)'s
 * (-EADDRNOTAVAIL: not joined, -ENODEV). */
WEFT_API int weft_udp_membership(weft_udp *u, const struct sockaddr *group,
                                 unsigned grouplen, unsigned ifindex, int join);

/* Ties data to u; on_close(data, u) (may be NULL) is its close callback.
 * Errors: -EINVAL, -EPERM. */
WEFT_API int weft_udp_set_data(weft_udp *u, void *data,
                               weft_udp_close_fn on_close);
WEFT_API void *weft_udp_data(const weft_udp *u);
/* u's strand. Any thread. */
WEFT_API weft_strand *weft_udp_strand(const weft_udp *u);
/* The bound address (as weft_listener_addr). On the strand. */
WEFT_API int weft_udp_local_addr(weft_udp *u, struct sockaddr *addr,
                                 unsigned *addrlen);

/* Closes u: queued sends complete with -ECANCELED, then the close
 * callback runs. Errors: -EINVAL, -EALREADY (closed before, or by the
 * shutdown), -ESHUTDOWN (as weft_tcp_close). Any thread, with the same
 * caution as weft_tcp_close: u is gone once its close callback has
 * returned. */
WEFT_API int weft_udp_close(weft_udp *u);

#endif /* WEFT_NET_H */

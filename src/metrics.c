/*
 * metrics.c - the runtime's counters as text for other programs
 * (weft_rt_metrics): JSON, and Prometheus's text exposition format
 * (version 0.0.4). Owns nothing: it reads weft_rt_stats,
 * weft_rt_shard_stats and weft_rt_histogram and formats them, with snprintf's
 * contract (the length the whole text needs is returned, whatever fits is
 * written).
 *
 * Every figure is described once, in the tables below, which both
 * formats walk, so the two never disagree on a name or a meaning.
 */
#include "core.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Per-shard counters: Prometheus gives one series per shard (label
 * shard="i"), and for the three with counts in no shard (none: their
 * offset in weft_stats) a series shard="none", so that the series add up
 * to the total; JSON gives one object per shard and the total. */
#define NO_NONE ((size_t)-1)
static const struct {
  const char *name, *help;
  size_t off, none;
} SHARD[] = {
#define F(f, h)                                                                \
  { #f, h, offsetof(weft_shard_stats, f), NO_NONE }
#define G(f, n, h)                                                             \
  { #f, h, offsetof(weft_shard_stats, f), offsetof(weft_stats, n) }
    G(handlers_run, handlers_run_after_handoff, "Handlers run."),
    G(handlers_cancelled, handlers_cancelled_outside,
      "Handlers not run at a CANCEL shutdown."),
    F(strands_run, "Strand turns."),
    F(steals, "Run-queue items stolen by this shard."),
    F(parks, "Times the shard's thread went to sleep."),
    F(wakeups, "Times a sleeping thread was woken for the shard."),
    F(injected, "Items taken from the runtime's inject queue."),
    G(timers_fired, timers_fired_outside, "Timer expirations."),
    F(stalls, "Handlers noticed running past the stall threshold."),
    F(handoffs, "Times the shard moved to another thread."),
    F(io_events, "Backend completions or readiness events."),
    F(io_enters, "io_uring_enter or epoll_wait calls."),
#undef F
#undef G
};

/* Runtime-wide figures; counter: only ever grows. JSON_ONLY: Prometheus
 * has it as a shard="none" series of SHARD's. */
enum { U64, UINT, NS, JSON_ONLY };
static const struct {
  const char *name, *help;
  size_t off;
  int type;
  bool counter;
} RT[] = {
#define F(f, t, c, h)                                                          \
  { #f, h, offsetof(weft_stats, f), t, c }
    F(shards, UINT, false, "Shards."),
    F(threads, UINT, false, "Threads running for shards, spares included."),
    F(strands_live, U64, false, "Strands created and not yet reclaimed."),
    F(handlers_run_after_handoff, JSON_ONLY, true, NULL),
    F(handlers_cancelled_outside, JSON_ONLY, true, NULL),
    F(timers_fired_outside, JSON_ONLY, true, NULL),
    F(tcp_live, U64, false, "Sockets (connections, listeners, UDP) open."),
    F(recv_bufs_held, U64, false,
      "io_uring receive buffers holding bytes not yet read."),
    F(recv_nobufs, U64, true,
      "io_uring receives that found every buffer of their shard held."),
    F(thread_start_errors, U64, true, "Failed starts of a shard's thread."),
    F(blocking_done, U64, true, "Blocking jobs whose done has returned."),
    F(blocking_busy_ns, NS, true,
      "Time the blocking pool's threads spent in work functions."),
    F(blocking_threads, UINT, false, "Blocking pool threads alive."),
    F(blocking_queued, UINT, false, "Blocking jobs waiting for a thread."),
    F(blocking_running, UINT, false, "Blocking jobs in their work function."),
#undef F
};

#define NSHARD (sizeof(SHARD) / sizeof(SHARD[0]))
#define NRT (sizeof(RT) / sizeof(RT[0]))

/* snprintf's contract over many calls: n counts every byte of the text,
 * the buffer gets what fits, always NUL-terminated when len > 0. */
struct out {
  char *buf;
  size_t len, n;
};

__attribute__((format(printf, 2, 3))) static void put(struct out *o,
                                                      const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  bool room = o->n < o->len;
  int k =
      vsnprintf(room ? o->buf + o->n : NULL, room ? o->len - o->n : 0, fmt, ap);
  va_end(ap);
  if (k > 0)
    o->n += (size_t)k;
}

static uint64_t shard_field(const weft_shard_stats *s, unsigned i) {
  uint64_t v;
  memcpy(&v, (const char *)s + SHARD[i].off, sizeof(v));
  return v;
}

/* Runtime figure i (NS: in nanoseconds). */
static uint64_t rt_field(const weft_stats *s, unsigned i) {
  const char *p = (const char *)s + RT[i].off;
  if (RT[i].type == UINT) {
    unsigned v;
    memcpy(&v, p, sizeof(v));
    return v;
  }
  uint64_t v;
  memcpy(&v, p, sizeof(v));
  return v;
}

/* The latency histograms (weft_rt_histogram, the whole runtime's), as
 * count, sum, maximum and quantiles: a Prometheus summary each. */
static const char *const HIST[WEFT_HIST_KINDS] = {
    [WEFT_HIST_SCHED_DELAY] = "sched_delay", [WEFT_HIST_TURN] = "turn",
    [WEFT_HIST_TIMER_LATE] = "timer_late",   [WEFT_HIST_IO_DELAY] = "io_delay",
    [WEFT_HIST_POOL_WAIT] = "pool_wait",
};
static const char *const HIST_HELP[WEFT_HIST_KINDS] = {
    [WEFT_HIST_SCHED_DELAY] = "From runnable (posted, or requeued) to running.",
    [WEFT_HIST_TURN] = "Run time of a run-queue item (a strand's turn).",
    [WEFT_HIST_TIMER_LATE] = "From a timer's deadline to its firing.",
    [WEFT_HIST_IO_DELAY] = "From a socket's event to its callback.",
    [WEFT_HIST_POOL_WAIT] = "A blocking job's wait for a pool thread.",
};
static const double QUANTILES[] = {0.5, 0.9, 0.99, 0.999};
#define NQ (sizeof(QUANTILES) / sizeof(QUANTILES[0]))

static void json_hist(struct out *o, const weft_histogram *h) {
  put(o, ",\"latency\":{");
  for (unsigned k = 0; k < WEFT_HIST_KINDS; k++) {
    put(o, "%s\"%s\":{\"count\":%llu,\"sum_ns\":%llu,\"max_ns\":%llu",
        k ? "," : "", HIST[k], (unsigned long long)h[k].count,
        (unsigned long long)h[k].sum_ns, (unsigned long long)h[k].max_ns);
    for (unsigned q = 0; q < NQ; q++)
      put(o, ",\"p%g_ns\":%llu", QUANTILES[q] * 100,
          (unsigned long long)weft_histogram_percentile(&h[k], QUANTILES[q]));
    put(o, "}");
  }
  put(o, "}");
}

static void put_seconds(struct out *o, uint64_t ns) {
  put(o, "%llu.%09llu\n", (unsigned long long)(ns / 1000000000u),
      (unsigned long long)(ns % 1000000000u));
}

static void prometheus_hist(struct out *o, const weft_histogram *h) {
  for (unsigned k = 0; k < WEFT_HIST_KINDS; k++) {
    put(o, "# HELP weft_%s_seconds %s\n# TYPE weft_%s_seconds summary\n",
        HIST[k], HIST_HELP[k], HIST[k]);
    for (unsigned q = 0; q < NQ; q++) {
      put(o, "weft_%s_seconds{quantile=\"%g\"} ", HIST[k], QUANTILES[q]);
      put_seconds(o, weft_histogram_percentile(&h[k], QUANTILES[q]));
    }
    put(o, "weft_%s_seconds_sum ", HIST[k]);
    put_seconds(o, h[k].sum_ns);
    put(o, "weft_%s_seconds_count %llu\n", HIST[k],
        (unsigned long long)h[k].count);
  }
}

static void json_shard(struct out *o, const weft_shard_stats *s) {
  for (unsigned i = 0; i < NSHARD; i++)
    put(o, "%s\"%s\":%llu", i ? "," : "{", SHARD[i].name,
        (unsigned long long)shard_field(s, i));
  put(o, "}");
}

static void json(struct out *o, const weft_stats *st,
                 const weft_shard_stats *sh, const weft_histogram *h) {
  put(o, "{");
  for (unsigned i = 0; i < NRT; i++)
    put(o, "\"%s\":%llu,", RT[i].name, (unsigned long long)rt_field(st, i));
  put(o, "\"total\":");
  json_shard(o, &st->total);
  put(o, ",\"per_shard\":[");
  for (unsigned k = 0; k < st->shards; k++) {
    put(o, k ? "," : "");
    json_shard(o, &sh[k]);
  }
  put(o, "]");
  json_hist(o, h);
  put(o, "}\n");
}

static void prometheus(struct out *o, const weft_stats *st,
                       const weft_shard_stats *sh, const weft_histogram *h) {
  for (unsigned i = 0; i < NSHARD; i++) {
    put(o, "# HELP weft_%s_total %s\n# TYPE weft_%s_total counter\n",
        SHARD[i].name, SHARD[i].help, SHARD[i].name);
    for (unsigned k = 0; k < st->shards; k++)
      put(o, "weft_%s_total{shard=\"%u\"} %llu\n", SHARD[i].name, k,
          (unsigned long long)shard_field(&sh[k], i));
    if (SHARD[i].none != NO_NONE) {
      uint64_t v;
      memcpy(&v, (const char *)st + SHARD[i].none, sizeof(v));
      put(o, "weft_%s_total{shard=\"none\"} %llu\n", SHARD[i].name,
          (unsigned long long)v);
    }
  }
  for (unsigned i = 0; i < NRT; i++) {
    if (RT[i].type == JSON_ONLY)
      continue;
    const char *name = RT[i].name, *suffix = RT[i].counter ? "_total" : "";
    char base[64];
    if (RT[i].type == NS) { /* Prometheus counts time in seconds */
      snprintf(base, sizeof(base), "%.*s_seconds",
               (int)(strlen(name) - strlen("_ns")), name);
      name = base;
    }
    put(o, "# HELP weft_%s%s %s\n# TYPE weft_%s%s %s\n", name, suffix,
        RT[i].help, name, suffix, RT[i].counter ? "counter" : "gauge");
    uint64_t v = rt_field(st, i);
    if (RT[i].type == NS)
      put(o, "weft_%s%s %llu.%09llu\n", name, suffix,
          (unsigned long long)(v / 1000000000u),
          (unsigned long long)(v % 1000000000u));
    else
      put(o, "weft_%s%s %llu\n", name, suffix, (unsigned long long)v);
  }
  prometheus_hist(o, h);
}

long weft_rt_metrics(weft_rt *rt, int format, char *buf, size_t len) {
  if (!rt || (!buf && len) ||
      (format != WEFT_METRICS_JSON && format != WEFT_METRICS_PROMETHEUS))
    return -EINVAL;
  weft_stats st;
  int r = weft_rt_stats(rt, &st);
  if (r)
    return r;
  weft_shard_stats *sh = calloc(st.shards ? st.shards : 1, sizeof(*sh));
  if (!sh)
    return -ENOMEM;
  weft_histogram *h = malloc(WEFT_HIST_KINDS * sizeof(*h));
  if (!h)
    r = -ENOMEM;
  for (unsigned k = 0; k < st.shards && !r; k++)
    r = weft_rt_shard_stats(rt, k, &sh[k]);
  for (int k = 0; k < WEFT_HIST_KINDS && !r; k++)
    r = weft_rt_histogram(rt, k, -1, &h[k]);
  struct out o = {buf, len, 0};
  if (len)
    buf[0] = '\0';
  if (!r && format == WEFT_METRICS_JSON)
    json(&o, &st, sh, h);
  else if (!r)
    prometheus(&o, &st, sh, h);
  free(h);
  free(sh);
  return r ? r : (long)o.n;
}

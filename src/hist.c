/*
 * hist.c - the histograms' shared adds, their reading (weft_rt_histogram,
 * weft_histogram_percentile), and the tick counter's probe and scale
 * (hist.h).
 */
#include "hist.h"

#include "rt.h"
#include "shard.h"
#include "trace.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

bool weft__trace_tsc;
uint64_t weft__tick_mult = (uint64_t)1 << 32; /* ticks are ns */

/* The tick counter is used only where it counts at one rate whatever the
 * CPU's frequency and sleep states (x86: constant_tsc and nonstop_tsc;
 * ARM's generic timer always does); else ticks are nanoseconds. */
static void tsc_probe(void) {
#if defined(__x86_64__) || defined(__i386__)
  FILE *f = fopen("/proc/cpuinfo", "re");
  if (!f)
    return;
  char line[4096];
  bool constant = false, nonstop = false;
  while (fgets(line, sizeof(line), f) && !(constant && nonstop)) {
    if (strncmp(line, "flags", 5) != 0)
      continue;
    constant = strstr(line, " constant_tsc") != NULL;
    nonstop = strstr(line, " nonstop_tsc") != NULL;
    break;
  }
  fclose(f);
  weft__trace_tsc = constant && nonstop;
#elif defined(__aarch64__)
  weft__trace_tsc = true;
#endif
}

/* A clock reading and the tick count at that moment: the read between
 * two tick reads, the tightest pair of five (a preemption in between
 * would widen one pair, not all). */
static void clock_pair(uint64_t *ns, uint64_t *tick) {
  uint64_t best = UINT64_MAX;
  for (int i = 0; i < 5; i++) {
    uint64_t a = weft__ticks(), n = weft__now_ns(), b = weft__ticks();
    if (b - a < best) {
      best = b - a;
      *ns = n;
      *tick = a + (b - a) / 2;
    }
  }
}

/* 200 us between two readings good to a few tens of ns: the scale is good
 * to a part in a thousand, far inside a bucket's eighth. */
static void calibrate(void) {
  tsc_probe();
  if (!weft__trace_tsc)
    return;
  uint64_t n0, t0, n1, t1;
  clock_pair(&n0, &t0);
  do
    clock_pair(&n1, &t1);
  while (n1 - n0 < 200000u);
  if (t1 > t0)
    weft__tick_mult =
        (uint64_t)(((unsigned __int128)(n1 - n0) << 32) / (t1 - t0));
}

void weft__hist_calibrate(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, calibrate);
}

void weft__hist_add_shared(struct weft__hist *h, uint64_t v) {
  weft__fetch_add(&h->b[weft__hist_bucket(v)], 1, WA_RLX);
  weft__fetch_add(&h->count, 1, WA_RLX);
  weft__fetch_add(&h->sum, v, WA_RLX);
  uint64_t m = weft__load(&h->max, WA_RLX);
  while (v > m && !weft__cas(&h->max, &m, v, WA_RLX, WA_RLX))
    ;
}

/* Adds h into out. The words are read one by one while they change:
 * count and the buckets' sum may differ by the adds in between. */
static void hist_read(const struct weft__hist *h, weft_histogram *out) {
  out->count += weft__load(&h->count, WA_RLX);
  out->sum_ns += weft__load(&h->sum, WA_RLX);
  uint64_t m = weft__load(&h->max, WA_RLX);
  if (m > out->max_ns)
    out->max_ns = m;
  for (unsigned i = 0; i < WEFT_HISTOGRAM_BUCKETS; i++)
    out->buckets[i] += weft__load(&h->b[i], WA_RLX);
}

int weft_rt_histogram_sized(weft_rt *rt, int kind, int shard,
                            weft_histogram *out, size_t size) {
  if (!rt || !out || kind < 0 || kind >= WEFT_HIST_KINDS || shard < -1 ||
      (shard >= 0 && (unsigned)shard >= rt->nshards) ||
      size < sizeof(weft_histogram))
    return -EINVAL;
  memset(out, 0, size);
  if (shard >= 0) {
    hist_read(&rt->shards[shard].hist[kind], out);
    return 0;
  }
  for (unsigned i = 0; i < rt->nshards; i++)
    hist_read(&rt->shards[i].hist[kind], out);
  hist_read(&rt->outside.hist[kind], out);
  return 0;
}

uint64_t weft_histogram_bucket_low(unsigned i) {
  if (i < 16)
    return i;
  if (i >= WEFT_HISTOGRAM_BUCKETS)
    return UINT64_MAX;
  unsigned e = 4 + (i - 16) / 8;
  return (uint64_t)(8 + (i - 16) % 8) << (e - 3);
}

uint64_t weft_histogram_percentile(const weft_histogram *h, double q) {
  if (!h || !h->count || !(q >= 0))
    return 0;
  if (q > 1)
    q = 1;
  uint64_t total = 0;
  for (unsigned i = 0; i < WEFT_HISTOGRAM_BUCKETS; i++)
    total += h->buckets[i];
  uint64_t rank = (uint64_t)(q * (double)total + 0.999999);
  if (!rank)
    rank = 1;
  uint64_t seen = 0;
  for (unsigned i = 0; i < WEFT_HISTOGRAM_BUCKETS; i++) {
    seen += h->buckets[i];
    if (seen >= rank) {
      uint64_t hi = weft_histogram_bucket_low(i + 1) - 1;
      return hi < h->max_ns ? hi : h->max_ns;
    }
  }
  return h->max_ns;
}

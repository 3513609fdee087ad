/* Install consumer: built against an installed weft, through CMake's
 * find_package(weft) and through pkg-config. */
#include <weft.h>

#include <stdatomic.h>
#include <stdio.h>

static atomic_int runs;

static void handler(void *arg) {
  (void)arg;
  atomic_fetch_add(&runs, 1);
}

int main(void) {
  weft_rt *rt = NULL;
  int rc = weft_rt_create(&rt, NULL);
  if (rc != 0) {
    fprintf(stderr, "weft_rt_create: %s\n", weft_strerror(rc));
    return 1;
  }
  rc = weft_post_rt(rt, handler, NULL);
  if (rc != 0) {
    fprintf(stderr, "weft_post_rt: %s\n", weft_strerror(rc));
    return 1;
  }
  rc = weft_rt_shutdown(rt, WEFT_SHUTDOWN_DRAIN);
  if (rc != 0) {
    fprintf(stderr, "weft_rt_shutdown: %s\n", weft_strerror(rc));
    return 1;
  }
  /* Linked with weft_sim and run with WEFT_SIM_SEED: simulated. */
  weft_sim_info si;
  if (weft_rt_sim_info(rt, &si) == 0)
    printf("simulated, seed %llu, %llu handler calls; ",
           (unsigned long long)si.seed, (unsigned long long)si.handlers);
  rc = weft_rt_destroy(rt);
  if (rc != 0) {
    fprintf(stderr, "weft_rt_destroy: %s\n", weft_strerror(rc));
    return 1;
  }
  if (atomic_load(&runs) != 1) {
    fprintf(stderr, "handler ran %d times, expected 1\n", atomic_load(&runs));
    return 1;
  }
  if ((weft_version() >> 16) != WEFT_VERSION_MAJOR) {
    fprintf(stderr, "library version %s does not match header %d.%d.%d\n",
            weft_version_string(), WEFT_VERSION_MAJOR, WEFT_VERSION_MINOR,
            WEFT_VERSION_PATCH);
    return 1;
  }
  printf("weft %s\n", weft_version_string());
  return 0;
}

// LD_PRELOAD shim: the wall clock of this process jumps while it runs, as after an NTP
// step or settimeofday (a clock jump on one host; time namespaces cannot do this: they
// offset only CLOCK_MONOTONIC/BOOTTIME, and only before the first process enters).
// CLOCK_JUMP_S (default 3600) seconds are added to CLOCK_REALTIME (clock_gettime,
// gettimeofday, time) from CLOCK_JUMP_AT_S (default 1) seconds after the first call,
// and taken away again (a jump backwards) CLOCK_JUMP_AT_S seconds later. Bounded waits
// must run on the monotonic clock and notice neither jump.
#include <dlfcn.h>
#include <sys/time.h>

#include <cstdlib>
#include <ctime>

using clock_gettime_fn = int (*)(clockid_t, struct timespec*);

namespace {

clock_gettime_fn real_clock_gettime(void) {
  static clock_gettime_fn fn;
  if (!fn) fn = reinterpret_cast<clock_gettime_fn>(dlsym(RTLD_NEXT, "clock_gettime"));
  return fn;
}

double env_or(const char* name, double dflt) {
  const char* s = std::getenv(name);
  return s && *s ? std::atof(s) : dflt;
}

// The offset now, from the monotonic time since the first call.
long long offset_ns(void) {
  static long long start = -1;
  struct timespec m;
  real_clock_gettime()(CLOCK_MONOTONIC, &m);
  const long long now = (long long)m.tv_sec * 1000000000LL + m.tv_nsec;
  if (start < 0) start = now;
  const double at = env_or("CLOCK_JUMP_AT_S", 1.0), jump = env_or("CLOCK_JUMP_S", 3600.0);
  const double t = (double)(now - start) / 1e9;
  return (t >= at && t < 2 * at) ? (long long)(jump * 1e9) : 0;
}

}  // namespace

extern "C" int clock_gettime(clockid_t clk, struct timespec* ts) noexcept {
  const int rc = real_clock_gettime()(clk, ts);
  if (rc == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE)) {
    const long long t = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_ns();
    ts->tv_sec = (time_t)(t / 1000000000LL);
    ts->tv_nsec = (long)(t % 1000000000LL);
  }
  return rc;
}

extern "C" int gettimeofday(struct timeval* tv, void* /*tz*/) noexcept {
  struct timespec ts;
  const int rc = clock_gettime(CLOCK_REALTIME, &ts);
  if (rc == 0) {
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
  }
  return rc;
}

extern "C" time_t time(time_t* out) noexcept {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (out) *out = ts.tv_sec;
  return ts.tv_sec;
}

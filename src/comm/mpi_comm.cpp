// MpiComm: Communicator over an MPI communicator. See mpi_comm.h for the rules
// (bounded polling waits, error translation, large counts).
#include "comm/mpi_comm.h"

#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <optional>
#include <thread>

#include <unistd.h>

#include "core/check.h"

namespace moe {
namespace {

long long g_count_limit = INT_MAX;
bool g_aborting = false;
std::function<void(const std::string&)> g_abort_hook;
bool g_we_initialized = false;
MPI_Comm g_exit_comm = MPI_COMM_NULL;  // a private duplicate of MPI_COMM_WORLD for the exit barrier
const Communicator* g_exit_timeout_from = nullptr;

// Liveness probe (see "Who is missing" below): a private duplicate of MPI_COMM_WORLD
// carrying only pings and their answers, and every world rank's host name.
MPI_Comm g_health_comm = MPI_COMM_NULL;
std::vector<std::string> g_hosts;
constexpr int kPingTag = 1, kPongTag = 2;
constexpr int kStateLen = 160;  // an answer: "waiting in <op> on '<communicator>'", NUL-padded
// Seconds a rank whose collective timed out waits for the others to answer its ping. Every
// live rank answers within one nap (<= 0.5 ms) while it waits in a collective, so this only
// covers ranks still computing; together with kReportGrace it keeps the report within 5 s.
constexpr double kProbeWindow = 2.0;
// Seconds between printing the report and MPI_Abort: the other survivors, whose collectives
// time out a little later, print theirs before the abort reaches them.
constexpr double kReportGrace = 1.0;

std::string mpi_error_string(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return fmt::format("MPI error code {}", rc);
  return std::string(buf, static_cast<size_t>(len));
}

// Polls `done` until it returns true (-> true) or `timeout_s` seconds pass (-> false;
// timeout_s <= 0 waits forever). Spins for the first ~0.2 ms (a collective whose
// ranks are all there completes in microseconds), then yields, and after 1 ms
// sleeps in naps growing to 0.5 ms, so that a rank waiting for a slow peer leaves
// the CPU to it (2 cores running 4 ranks is a normal test setup).
// `idle` runs in the nap phase (so that a waiting rank answers liveness pings).
// The deadline is on steady_clock: a jump of the wall clock (NTP step, settimeofday)
// neither fires nor delays it.
template <class Done, class Idle>
bool poll_until(Done&& done, double timeout_s, Idle&& idle) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  auto nap = std::chrono::microseconds(20);
  for (;;) {
    if (done()) return true;
    const double elapsed = std::chrono::duration<double>(clock::now() - start).count();
    if (timeout_s > 0 && elapsed > timeout_s) return false;
    if (elapsed < 2e-4) continue;
    if (elapsed < 1e-3) {
      std::this_thread::yield();
      continue;
    }
    idle();
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(50));
  }
}

template <class Done>
bool poll_until(Done&& done, double timeout_s) {
  return poll_until(done, timeout_s, [] {});
}

// ---------------------------------------------------------------------------------
// Who is missing. When a collective times out, the rank pings every other world rank
// on g_health_comm and waits kProbeWindow seconds for answers. Every rank answers pings
// whenever it waits (in a collective, in the probe, at exit), with what it waits for. A
// rank that does not answer died, is frozen (SIGSTOP) or is cut off; the report names it
// and its host. Ranks that answer but wait elsewhere took another code path.

struct PendingPong {
  MPI_Request req = MPI_REQUEST_NULL;
  char text[kStateLen] = {};
};
std::deque<PendingPong> g_pongs;  // answers in flight (a deque: their buffers do not move)

void answer_pings(const std::string& state) {
  if (g_health_comm == MPI_COMM_NULL) return;
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kPingTag, g_health_comm, &flag, &st) != MPI_SUCCESS || !flag) break;
    int ping = 0;
    if (MPI_Recv(&ping, 1, MPI_INT, st.MPI_SOURCE, kPingTag, g_health_comm, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
    PendingPong& p = g_pongs.emplace_back();
    std::snprintf(p.text, sizeof p.text, "%s", state.c_str());
    MPI_Isend(p.text, kStateLen, MPI_CHAR, st.MPI_SOURCE, kPongTag, g_health_comm, &p.req);
  }
  while (!g_pongs.empty()) {
    int flag = 0;
    if (MPI_Test(&g_pongs.front().req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag) break;
    g_pongs.pop_front();
  }
}

std::string host_of(int world_rank) {
  if (world_rank >= 0 && static_cast<size_t>(world_rank) < g_hosts.size()) return g_hosts[world_rank];
  return "?";
}

// Pings every other world rank; the answer of each (nullopt: none within `window_s`).
std::vector<std::optional<std::string>> probe_peers(double window_s, const std::string& own_state) {
  int n = 1, me = 0;
  MPI_Comm_size(g_health_comm, &n);
  MPI_Comm_rank(g_health_comm, &me);
  std::vector<std::optional<std::string>> out(static_cast<size_t>(n));
  std::vector<int> ping(static_cast<size_t>(n), me);
  std::vector<std::array<char, kStateLen>> pong(static_cast<size_t>(n));
  std::vector<MPI_Request> recv(static_cast<size_t>(n), MPI_REQUEST_NULL), send(static_cast<size_t>(n), MPI_REQUEST_NULL);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    MPI_Irecv(pong[p].data(), kStateLen, MPI_CHAR, p, kPongTag, g_health_comm, &recv[p]);
    MPI_Isend(&ping[p], 1, MPI_INT, p, kPingTag, g_health_comm, &send[p]);
  }
  std::vector<bool> got(static_cast<size_t>(n), false);
  got[me] = true;
  poll_until(
      [&] {
        bool all = true;
        for (int p = 0; p < n; ++p) {
          if (got[p]) continue;
          int flag = 0;
          if (MPI_Test(&recv[p], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) {
            got[p] = true;
            pong[p].back() = '\0';
            out[p] = std::string(pong[p].data());
          } else {
            all = false;
          }
        }
        return all;
      },
      window_s, [&] { answer_pings(own_state); });
  // Requests left pending stay so: the job is aborted right after.
  return out;
}

// The probe's findings for a timeout report, e.g. "no answer within 2 s from rank 1
// (host h2): it died, is frozen or its network is down; rank 2 (host h3) answered: waiting in ...".
std::string probe_report(const std::string& own_state) {
  if (g_health_comm == MPI_COMM_NULL) return "";
  const auto answers = probe_peers(kProbeWindow, own_state);
  int me = 0;
  MPI_Comm_rank(g_health_comm, &me);
  std::string lost, alive;
  for (size_t p = 0; p < answers.size(); ++p) {
    if (static_cast<int>(p) == me) continue;
    const std::string who = fmt::format("rank {} (host {})", p, host_of(static_cast<int>(p)));
    if (!answers[p]) {
      lost += (lost.empty() ? "" : ", ") + who;
    } else {
      alive += fmt::format("{}{}: {}", alive.empty() ? "" : "; ", who, *answers[p]);
    }
  }
  std::string r = fmt::format("this is rank {} (host {}). ", me, host_of(me));
  if (!lost.empty())
    r += fmt::format("Lost: {} did not answer a ping within {} s: dead, frozen, or its network is down. ", lost,
                     kProbeWindow);
  else
    r += "Every rank answered a ping, so none is lost: a rank took another code path. ";
  if (!alive.empty()) r += "Answered: " + alive + ". ";
  return r;
}

int to_int(size_t v) { return static_cast<int>(v); }

// The block size in bytes for a byte collective: 1 when every size and offset fits
// an MPI count, else the largest power of two (<= 2^30) dividing all of them,
// provided the counts in such blocks fit. Fails clearly otherwise.
size_t pick_block(const MpiComm& c, const char* op, std::initializer_list<const std::vector<size_t>*> lists) {
  size_t mx = 0, bits = 0;
  for (const auto* v : lists)
    for (size_t x : *v) {
      mx = std::max(mx, x);
      bits |= x;
    }
  const auto limit = static_cast<size_t>(g_count_limit);
  if (mx <= limit) return 1;
  size_t block = bits & (~bits + 1);  // lowest set bit: the largest power of two dividing every value
  block = std::min<size_t>(block, size_t{1} << 30);
  MOE_CHECK(mx / block <= limit,
            "{} on communicator '{}' (rank {}): a size or offset of {} bytes exceeds MPI's int count limit ({}) "
            "and the sizes/offsets share no power-of-two block that would fit (largest common: {} bytes); "
            "split the transfer",
            op, c.name(), c.rank(), mx, g_count_limit, block);
  return block;
}

// MPI_BYTE for block 1, else a committed contiguous type of `block` bytes
// (freed by the caller right after starting the operation, which MPI allows).
MPI_Datatype block_type(const MpiComm& c, size_t block, const char* op) {
  if (block == 1) return MPI_BYTE;
  MPI_Datatype t;
  c.check(MPI_Type_contiguous(to_int(block), MPI_BYTE, &t), op);
  c.check(MPI_Type_commit(&t), op);
  return t;
}

void free_type(MPI_Datatype t) {
  if (t != MPI_BYTE) MPI_Type_free(&t);
}

class MpiRequest final : public CommRequest {
 public:
  MpiRequest(MpiComm& comm, const char* op) : comm_(comm), op_(op) {}
  ~MpiRequest() override {
    if (done_) return;
    try {
      wait();
    } catch (const std::exception& e) {
      comm_.abort_all(fmt::format("{} on communicator '{}' failed while its request was destroyed: {}", op_,
                                  comm_.name(), e.what()));
    }
  }
  void wait() override {
    if (done_) return;
    comm_.wait_requests(reqs.data(), static_cast<int>(reqs.size()), op_);
    done_ = true;
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    comm_.check(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE), op_);
    done_ = flag != 0;
    return done_;
  }
  // Marks the request complete without waiting (used when starting it failed).
  void forget() { done_ = true; }

  std::vector<MPI_Request> reqs;
  std::vector<int> ints;  // counts/displacements the operation reads until it completes

 private:
  MpiComm& comm_;
  const char* op_;
  bool done_ = false;
};

// Starts `n` floats of in-place sum in chunks of at most the count limit.
void start_all_reduce(MpiComm& c, MpiRequest& r, float* buf, size_t n, const char* op) {
  const auto limit = static_cast<size_t>(g_count_limit);
  size_t off = 0;
  do {  // one request even for n == 0, so every rank takes part in the same operations
    const size_t cnt = std::min(limit, n - off);
    MPI_Request q;
    const int rc = MPI_Iallreduce(MPI_IN_PLACE, buf + off, to_int(cnt), MPI_FLOAT, MPI_SUM, c.handle(), &q);
    if (rc != MPI_SUCCESS) r.forget();
    c.check(rc, op);
    r.reqs.push_back(q);
    off += cnt;
  } while (off < n);
}

void start_all_to_all_v(MpiComm& c, MpiRequest& r, const void* send, const std::vector<size_t>& send_bytes,
                        const std::vector<size_t>& send_offsets, void* recv, const std::vector<size_t>& recv_bytes,
                        const std::vector<size_t>& recv_offsets, const char* op) {
  const auto n = static_cast<size_t>(c.size());
  MOE_CHECK(send_bytes.size() == n && send_offsets.size() == n && recv_bytes.size() == n && recv_offsets.size() == n,
            "{} on communicator '{}': send/recv sizes and offsets need {} entries each, got {}/{}/{}/{}", op,
            c.name(), n, send_bytes.size(), send_offsets.size(), recv_bytes.size(), recv_offsets.size());
  MOE_CHECK(send_bytes[c.rank()] == recv_bytes[c.rank()],
            "{} on communicator '{}' (rank {}): this rank sends itself {} bytes but expects {}", op, c.name(),
            c.rank(), send_bytes[c.rank()], recv_bytes[c.rank()]);
  const size_t block = pick_block(c, op, {&send_bytes, &send_offsets, &recv_bytes, &recv_offsets});
  r.ints.resize(4 * n);
  int* sc = r.ints.data();
  int* sd = sc + n;
  int* rcnt = sd + n;
  int* rd = rcnt + n;
  for (size_t i = 0; i < n; ++i) {
    sc[i] = to_int(send_bytes[i] / block);
    sd[i] = to_int(send_offsets[i] / block);
    rcnt[i] = to_int(recv_bytes[i] / block);
    rd[i] = to_int(recv_offsets[i] / block);
  }
  MPI_Datatype t = block_type(c, block, op);
  MPI_Request q;
  const int rc = MPI_Ialltoallv(send, sc, sd, t, recv, rcnt, rd, t, c.handle(), &q);
  free_type(t);
  if (rc != MPI_SUCCESS) r.forget();
  c.check(rc, op);
  r.reqs.push_back(q);
}

int world_rank_or_zero() {
  int r = 0;
  if (detail::mpi_active()) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// At exit: every rank meets in a bounded barrier, then MPI_Finalize. The barrier
// bounds what MPI_Finalize would otherwise do unboundedly (wait for every rank).
void finalize_at_exit() {
  if (g_aborting || !detail::mpi_active()) return;
  const double timeout = g_exit_timeout_from ? g_exit_timeout_from->timeout() : 300.0;
  MPI_Request req;
  if (g_exit_comm != MPI_COMM_NULL && MPI_Ibarrier(g_exit_comm, &req) == MPI_SUCCESS) {
    bool error = false;
    const bool ok = poll_until(
        [&] {
          int flag = 0;
          if (MPI_Test(&req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) error = true;
          return flag != 0 || error;
        },
        timeout, [] { answer_pings("at exit, waiting for every rank to reach MPI_Finalize"); });
    if (!ok)
      detail::abort_job(fmt::format(
          "at exit: not every rank reached MPI_Finalize within {} s (a rank hangs in a collective or stopped early); "
          "aborting the job",
          timeout));
  }
  if (g_exit_comm != MPI_COMM_NULL) MPI_Comm_free(&g_exit_comm);
  if (g_health_comm != MPI_COMM_NULL) MPI_Comm_free(&g_health_comm);
  MPI_Finalize();
}

}  // namespace

// ---------------------------------------------------------------------------------
namespace detail {

void mpi_init_once() {
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) return;
  // OpenMPI spins in its progress loop unless told to yield; with more ranks than
  // cores on this host (oversubscribed tests) a spinning rank starves the others.
  // mpirun --oversubscribe sets this itself; we also set it when we can tell.
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (!local) local = std::getenv("MPI_LOCALNRANKS");
  if (local) {
    cpu_set_t set;
    int cores = static_cast<int>(std::thread::hardware_concurrency());
    if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
    if (std::atoi(local) > cores) setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
  }
  // OpenMPI's TCP transport writes to its peers' sockets without MSG_NOSIGNAL: a write
  // to a rank that just died raises SIGPIPE, and this rank died of it before it could
  // report the lost peer. mpirun then sometimes named this rank (signal 13) instead of
  // the one that died (a netbed fault-kill run on CI). Ignored, the write fails with
  // EPIPE, the transport closes that peer, and the job ends the usual way. Only where
  // nobody set a handler: an embedding program's own choice stands.
  struct sigaction old_pipe {};
  if (::sigaction(SIGPIPE, nullptr, &old_pipe) == 0 && old_pipe.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
  int provided = 0;
  const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  MOE_CHECK(rc == MPI_SUCCESS, "MPI_Init_thread failed: {}", mpi_error_string(rc));
  g_we_initialized = true;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if (provided < MPI_THREAD_FUNNELED)
    std::fprintf(stderr, "moe-ep: warning: MPI provides thread level %d < MPI_THREAD_FUNNELED\n", provided);
  const int drc = MPI_Comm_dup(MPI_COMM_WORLD, &g_exit_comm);
  MOE_CHECK(drc == MPI_SUCCESS, "MPI_Comm_dup(MPI_COMM_WORLD) failed: {}", mpi_error_string(drc));
  MPI_Comm_set_errhandler(g_exit_comm, MPI_ERRORS_RETURN);
  const int hrc = MPI_Comm_dup(MPI_COMM_WORLD, &g_health_comm);
  MOE_CHECK(hrc == MPI_SUCCESS, "MPI_Comm_dup(MPI_COMM_WORLD) failed: {}", mpi_error_string(hrc));
  MPI_Comm_set_errhandler(g_health_comm, MPI_ERRORS_RETURN);
  {
    // Every rank's host name, for the reports that name a lost rank.
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    MPI_Get_processor_name(name, &len);
    int n = 1;
    MPI_Comm_size(g_health_comm, &n);
    std::vector<char> all(static_cast<size_t>(n) * MPI_MAX_PROCESSOR_NAME);
    const int grc = MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME,
                                  MPI_CHAR, g_health_comm);
    MOE_CHECK(grc == MPI_SUCCESS, "MPI_Allgather of the host names failed: {}", mpi_error_string(grc));
    g_hosts.clear();
    for (int p = 0; p < n; ++p) {
      const char* h = all.data() + static_cast<size_t>(p) * MPI_MAX_PROCESSOR_NAME;
      g_hosts.emplace_back(h, strnlen(h, MPI_MAX_PROCESSOR_NAME));
    }
  }
  std::atexit(finalize_at_exit);
}

bool mpi_active() {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  if (!inited) return false;
  MPI_Finalized(&finalized);
  return !finalized;
}

void set_mpi_exit_timeout(const Communicator* world) { g_exit_timeout_from = world; }

}  // namespace detail

void set_abort_hook(std::function<void(const std::string&)> hook) { g_abort_hook = std::move(hook); }

namespace detail {

void abort_job(const std::string& why, double grace_s) {
  const bool mpi = mpi_active();
  const bool first = !g_aborting;
  g_aborting = true;
  if (first && g_abort_hook) g_abort_hook(why);
  const int r = world_rank_or_zero();
  std::fflush(stdout);
  std::fprintf(stderr, "moe-ep: rank %d: %s\n", r, why.c_str());
  std::fflush(stderr);
  if (mpi) {
    if (grace_s > 0) poll_until([] { return false; }, grace_s, [] { answer_pings("aborting the job"); });
    // MPI_Abort asks the local daemon to kill the job; when that daemon is cut off from
    // mpirun (or slow to answer) it may never return. This rank has reported: leave.
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(3));
      std::_Exit(1);
    }).detach();
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);  // MPI_Abort does not return; if it did, do not run exit handlers
  }
  std::exit(1);
}

void set_mpi_count_limit_for_testing(long long limit) { g_count_limit = limit > 0 ? limit : INT_MAX; }

}  // namespace detail

// ---------------------------------------------------------------------------------
MpiComm::MpiComm(MPI_Comm comm, std::string name, double timeout_s) : comm_(comm), name_(std::move(name)) {
  timeout_s_ = timeout_s;
  check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

MpiComm::~MpiComm() {
  if (comm_ != MPI_COMM_NULL && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF && detail::mpi_active())
    MPI_Comm_free(&comm_);
}

void MpiComm::check(int rc, const char* op) const {
  if (rc == MPI_SUCCESS) [[likely]]
    return;
  MOE_FAIL("MPI error in {} on communicator '{}' (rank {} of {}): {}", op, name_, rank_, size_,
           mpi_error_string(rc));
}

void MpiComm::wait_requests(MPI_Request* reqs, int n, const char* op) {
  const bool ok = poll_until(
      [&] {
        int flag = 0;
        check(MPI_Testall(n, reqs, &flag, MPI_STATUSES_IGNORE), op);
        return flag != 0;
      },
      timeout_s_, [&] { answer_pings(fmt::format("waiting in {} on '{}'", op, name_)); });
  if (!ok) {
    const std::string report = probe_report(fmt::format("timed out in {} on '{}'", op, name_));
    detail::abort_job(
        fmt::format("{} on communicator '{}' (rank {} of {}) did not complete within {} s: a rank died, hangs, or "
                    "took another code path (--comm-timeout / MOE_COMM_TIMEOUT sets the limit). {}Aborting the job",
                    op, name_, rank_, size_, timeout_s_, report),
        kReportGrace);
  }
}

void MpiComm::barrier() {
  MPI_Request q;
  check(MPI_Ibarrier(comm_, &q), "barrier");
  wait_requests(&q, 1, "barrier");
}

void MpiComm::broadcast(void* buf, size_t bytes, int root) {
  MOE_CHECK(root >= 0 && root < size_, "broadcast on communicator '{}': root {} is not a rank of {}", name_, root,
            size_);
  MpiRequest r(*this, "broadcast");
  const auto limit = static_cast<size_t>(g_count_limit);
  size_t off = 0;
  do {
    const size_t cnt = std::min(limit, bytes - off);
    MPI_Request q;
    const int rc = MPI_Ibcast(static_cast<char*>(buf) + off, to_int(cnt), MPI_BYTE, root, comm_, &q);
    if (rc != MPI_SUCCESS) r.forget();
    check(rc, "broadcast");
    r.reqs.push_back(q);
    off += cnt;
  } while (off < bytes);
  r.wait();
}

void MpiComm::all_reduce_sum(float* buf, size_t n) {
  MpiRequest r(*this, "all_reduce_sum");
  start_all_reduce(*this, r, buf, n, "all_reduce_sum");
  r.wait();
}

std::unique_ptr<CommRequest> MpiComm::iall_reduce_sum(float* buf, size_t n) {
  auto r = std::make_unique<MpiRequest>(*this, "iall_reduce_sum");
  start_all_reduce(*this, *r, buf, n, "iall_reduce_sum");
  return r;
}

void MpiComm::all_gather(const void* send, size_t bytes, void* recv) {
  const char* op = "all_gather";
  // The total too: MPI implementations compute rank * count in int arithmetic.
  const std::vector<size_t> sizes{bytes, bytes * static_cast<size_t>(size_)};
  const size_t block = pick_block(*this, op, {&sizes});
  MPI_Datatype t = block_type(*this, block, op);
  MpiRequest r(*this, op);
  MPI_Request q;
  const int cnt = to_int(bytes / block);
  const int rc = MPI_Iallgather(send, cnt, t, recv, cnt, t, comm_, &q);
  free_type(t);
  if (rc != MPI_SUCCESS) r.forget();
  check(rc, op);
  r.reqs.push_back(q);
  r.wait();
}

void MpiComm::all_gather_v(const void* send, size_t send_bytes, void* recv, const std::vector<size_t>& recv_bytes) {
  const char* op = "all_gather_v";
  MOE_CHECK(recv_bytes.size() == static_cast<size_t>(size_),
            "{} on communicator '{}': recv_bytes has {} entries, the communicator has {} ranks", op, name_,
            recv_bytes.size(), size_);
  MOE_CHECK(recv_bytes[rank_] == send_bytes,
            "{} on communicator '{}' (rank {}): this rank sends {} bytes but recv_bytes[{}] says {}", op, name_,
            rank_, send_bytes, rank_, recv_bytes[rank_]);
  std::vector<size_t> offsets(recv_bytes.size());
  size_t total = 0;
  for (size_t i = 0; i < recv_bytes.size(); ++i) {
    offsets[i] = total;
    total += recv_bytes[i];
  }
  const size_t block = pick_block(*this, op, {&recv_bytes, &offsets});
  MpiRequest r(*this, op);
  r.ints.resize(2 * recv_bytes.size());
  int* counts = r.ints.data();
  int* displs = counts + recv_bytes.size();
  for (size_t i = 0; i < recv_bytes.size(); ++i) {
    counts[i] = to_int(recv_bytes[i] / block);
    displs[i] = to_int(offsets[i] / block);
  }
  MPI_Datatype t = block_type(*this, block, op);
  MPI_Request q;
  const int rc = MPI_Iallgatherv(send, counts[rank_], t, recv, counts, displs, t, comm_, &q);
  free_type(t);
  if (rc != MPI_SUCCESS) r.forget();
  check(rc, op);
  r.reqs.push_back(q);
  r.wait();
}

void MpiComm::reduce_scatter_v_sum(const float* send, float* recv, const std::vector<size_t>& counts) {
  const char* op = "reduce_scatter_v_sum";
  MOE_CHECK(counts.size() == static_cast<size_t>(size_),
            "{} on communicator '{}': counts has {} entries, the communicator has {} ranks", op, name_,
            counts.size(), size_);
  size_t total = 0;
  for (size_t c : counts) total += c;
  MOE_CHECK(total <= static_cast<size_t>(g_count_limit),
            "{} on communicator '{}': {} floats in all exceed MPI's int count limit ({}); split the reduction", op,
            name_, total, g_count_limit);
  MpiRequest r(*this, op);
  r.ints.resize(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) r.ints[i] = to_int(counts[i]);
  MPI_Request q;
  const void* sbuf = send == recv ? MPI_IN_PLACE : static_cast<const void*>(send);
  const int rc = MPI_Ireduce_scatter(sbuf, recv, r.ints.data(), MPI_FLOAT, MPI_SUM, comm_, &q);
  if (rc != MPI_SUCCESS) r.forget();
  check(rc, op);
  r.reqs.push_back(q);
  r.wait();
}

void MpiComm::all_to_all_v(const void* send, const std::vector<size_t>& send_bytes,
                           const std::vector<size_t>& send_offsets, void* recv, const std::vector<size_t>& recv_bytes,
                           const std::vector<size_t>& recv_offsets) {
  MpiRequest r(*this, "all_to_all_v");
  start_all_to_all_v(*this, r, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets, "all_to_all_v");
  r.wait();
}

std::unique_ptr<CommRequest> MpiComm::iall_to_all_v(const void* send, const std::vector<size_t>& send_bytes,
                                                    const std::vector<size_t>& send_offsets, void* recv,
                                                    const std::vector<size_t>& recv_bytes,
                                                    const std::vector<size_t>& recv_offsets) {
  auto r = std::make_unique<MpiRequest>(*this, "iall_to_all_v");
  start_all_to_all_v(*this, *r, send, send_bytes, send_offsets, recv, recv_bytes, recv_offsets, "iall_to_all_v");
  return r;
}

std::unique_ptr<CommRequest> MpiComm::isend_recv(const std::vector<Message>& sends, const std::vector<Message>& recvs,
                                                int tag) {
  auto r = std::make_unique<MpiRequest>(*this, "isend_recv");
  // Receives first, so a message finds its buffer posted (no unexpected-message copy).
  for (int pass = 0; pass < 2; ++pass)
    for (const Message& m : pass == 0 ? recvs : sends) {
      MOE_CHECK(m.rank >= 0 && m.rank < size_, "isend_recv on communicator '{}': rank {} outside [0, {})", name_,
                m.rank, size_);
      MOE_CHECK(m.bytes <= static_cast<size_t>(g_count_limit),
                "isend_recv on communicator '{}': a message of {} bytes is above the {} of one MPI call", name_,
                m.bytes, g_count_limit);
      MPI_Request q;
      const int rc = pass == 0 ? MPI_Irecv(m.buf, to_int(m.bytes), MPI_BYTE, m.rank, tag, comm_, &q)
                               : MPI_Isend(m.buf, to_int(m.bytes), MPI_BYTE, m.rank, tag, comm_, &q);
      if (rc != MPI_SUCCESS) r->forget();
      check(rc, "isend_recv");
      r->reqs.push_back(q);
    }
  return r;
}

std::unique_ptr<Communicator> MpiComm::split(int color, int key, const std::string& name) {
  MOE_CHECK(color >= 0, "split of communicator '{}' into '{}': color must be >= 0, got {}", name_, name, color);
  // MPI_Comm_split blocks without a bound; a bounded barrier first makes sure every
  // rank has arrived, after which the split completes.
  MPI_Request q;
  check(MPI_Ibarrier(comm_, &q), "split");
  wait_requests(&q, 1, "split");
  MPI_Comm sub;
  check(MPI_Comm_split(comm_, color, key, &sub), "split");
  return std::make_unique<MpiComm>(sub, name, timeout_s_);
}

void MpiComm::abort_all(const std::string& why) { detail::abort_job(why); }

}  // namespace moe

// The communication layer under 1..4 ranks: every collective with rank-tagged
// payloads and uneven (also empty) contributions, nonblocking overlap, large-count
// paths, group layouts, and the consistency check. Also the single-rank LocalComm.
//
// Every rank runs every test; a test must make the same collective calls on every
// rank (EXPECT_*, not ASSERT_*, before a collective).
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "comm/communicator.h"
#include "comm/consistency.h"
#include "comm/groups.h"
#include "comm/mpi_comm.h"
#include "core/check.h"

namespace moe {
namespace {

Communicator& W() { return world_comm(true); }

// Every rank's int, in rank order.
std::vector<int> gather_int(Communicator& c, int v) {
  std::vector<int> all(c.size());
  c.all_gather(&v, sizeof(int), all.data());
  return all;
}

// Runs `fn` expecting a moe::Error whose message contains `needle`; returns the message.
template <class Fn>
std::string expect_error(Fn&& fn, const std::string& needle) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected moe::Error containing '" << needle << "'";
  return {};
}

TEST(Comm, WorldMatchesLauncher) {
  auto& w = W();
  EXPECT_EQ(w.name(), "world");
  EXPECT_GE(w.size(), 1);
  EXPECT_TRUE(w.rank() >= 0 && w.rank() < w.size());
  if (const char* s = std::getenv("OMPI_COMM_WORLD_SIZE")) {
    EXPECT_EQ(w.size(), std::atoi(s));
  }
  if (const char* s = std::getenv("OMPI_COMM_WORLD_RANK")) {
    EXPECT_EQ(w.rank(), std::atoi(s));
  }
  EXPECT_TRUE(detail::mpi_active());
  const auto ranks = gather_int(w, w.rank());
  for (int r = 0; r < w.size(); ++r) EXPECT_EQ(ranks[r], r);
}

// A rank outlives a write to a peer that is gone: once MPI is up, SIGPIPE is ignored and
// the write fails with EPIPE (OpenMPI's TCP transport writes without MSG_NOSIGNAL; before,
// a rank died of signal 13 when the peer it was sending to was killed). A pipe whose
// reader is closed stands in for the dead peer's socket: both raise SIGPIPE on write.
TEST(Comm, WriteToAGonePeerFailsWithEpipeInsteadOfKilling) {
  ASSERT_TRUE(detail::mpi_active());
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ::close(fds[0]);
  const char byte = 1;
  errno = 0;
  const ssize_t n = ::write(fds[1], &byte, 1);
  const int err = errno;
  ::close(fds[1]);
  EXPECT_EQ(n, -1);
  EXPECT_EQ(err, EPIPE);
}

// A barrier orders: no rank leaves round i before every rank entered it. Each round one
// rank (a different one each time) arrives 20 ms late; every rank notes when it entered
// and left (steady_clock: CLOCK_MONOTONIC, one clock for all processes of this host, and
// these tests run on one host), and the earliest exit must not precede the latest entry.
TEST(Comm, BarrierRepeats) {
  auto& w = W();
  const int n = w.size();
  using clock = std::chrono::steady_clock;
  const auto ns = [](clock::time_point t) {
    return static_cast<long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
  };
  for (int i = 0; i < 20; ++i) {
    if (n > 1 && w.rank() == i % n) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const long long enter = ns(clock::now());
    w.barrier();
    const long long leave = ns(clock::now());
    std::vector<long long> enters(n), leaves(n);
    w.all_gather(&enter, sizeof enter, enters.data());
    w.all_gather(&leave, sizeof leave, leaves.data());
    const long long last_in = *std::max_element(enters.begin(), enters.end());
    const long long first_out = *std::min_element(leaves.begin(), leaves.end());
    EXPECT_GE(first_out, last_in) << "round " << i << ": a rank left the barrier " << (last_in - first_out)
                                  << " ns before rank " << (std::max_element(enters.begin(), enters.end()) - enters.begin())
                                  << " entered it";
  }
}

TEST(Comm, BroadcastFromEveryRoot) {
  auto& w = W();
  for (int root = 0; root < w.size(); ++root)
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{7}, size_t{4099}}) {
      std::vector<uint8_t> buf(bytes);
      for (size_t i = 0; i < bytes; ++i)
        buf[i] = static_cast<uint8_t>(w.rank() == root ? (root * 1000 + i) % 251 : 0xEE);
      w.broadcast(buf.data(), bytes, root);
      for (size_t i = 0; i < bytes; ++i) EXPECT_EQ(buf[i], (root * 1000 + i) % 251) << "root " << root << " i " << i;
    }
  expect_error([&] { w.broadcast(nullptr, 0, w.size()); }, "root");
}

TEST(Comm, AllReduceSumIsExactOnIntegers) {
  auto& w = W();
  const int n = w.size();
  for (size_t len : {size_t{0}, size_t{1}, size_t{5}, size_t{1000}, size_t{65537}}) {
    std::vector<float> buf(len);
    for (size_t i = 0; i < len; ++i) buf[i] = static_cast<float>(w.rank() * 1000 + static_cast<int>(i % 1000)) - 0.5f;
    w.all_reduce_sum(buf.data(), len);
    for (size_t i = 0; i < len; ++i) {
      const float want = static_cast<float>(1000 * n * (n - 1) / 2 + n * static_cast<int>(i % 1000)) - 0.5f * n;
      EXPECT_EQ(buf[i], want) << "len " << len << " i " << i;
      if (HasFailure()) break;
    }
  }
}

// Some work for the CPU while a request is in flight.
double busy_work(int iters) {
  double acc = 0;
  for (int i = 1; i <= iters; ++i) acc += 1.0 / i;
  return acc;
}

TEST(Comm, IallReduceOverlapsWithComputation) {
  auto& w = W();
  const int n = w.size();
  const size_t len = 10000;
  std::vector<float> a(len), b(len);
  for (size_t i = 0; i < len; ++i) {
    a[i] = static_cast<float>(w.rank() * 1000 + static_cast<int>(i % 997));
    b[i] = static_cast<float>(-w.rank() - static_cast<int>(i % 13));
  }
  auto ra = w.iall_reduce_sum(a.data(), len);
  auto rb = w.iall_reduce_sum(b.data(), len);  // two in flight at once
  double acc = 0;
  for (int step = 0; step < 50; ++step) {
    acc += busy_work(20000);
    ra->test();  // lets MPI progress; never blocks
  }
  EXPECT_GT(acc, 0);
  rb->wait();  // the later one first
  ra->wait();
  ra->wait();  // a second wait is a no-op
  EXPECT_TRUE(ra->test());
  for (size_t i = 0; i < len; ++i) {
    EXPECT_EQ(a[i], static_cast<float>(1000 * n * (n - 1) / 2 + n * static_cast<int>(i % 997))) << i;
    EXPECT_EQ(b[i], static_cast<float>(-n * (n - 1) / 2 - n * static_cast<int>(i % 13))) << i;
    if (HasFailure()) break;
  }
  // Destroying a request that was never waited for completes it.
  std::vector<float> c(3, 1.0f);
  { auto rc = w.iall_reduce_sum(c.data(), c.size()); }
  for (float v : c) EXPECT_EQ(v, static_cast<float>(n));
}

TEST(Comm, AllGatherInRankOrder) {
  auto& w = W();
  const int n = w.size();
  for (size_t ints : {size_t{0}, size_t{1}, size_t{3}, size_t{1000}}) {
    std::vector<int32_t> send(ints), recv(ints * n, -1);
    for (size_t i = 0; i < ints; ++i) send[i] = w.rank() * 1000 + static_cast<int>(i);
    w.all_gather(send.data(), ints * sizeof(int32_t), recv.data());
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < ints; ++i) EXPECT_EQ(recv[r * ints + i], r * 1000 + static_cast<int>(i));
  }
}

TEST(Comm, AllGatherVUnevenAndEmpty) {
  auto& w = W();
  const int n = w.size();
  // Several patterns of per-rank int counts: odd ranks empty; only the last rank;
  // everyone empty; growing.
  std::vector<std::vector<size_t>> patterns;
  {
    std::vector<size_t> p1(n), p2(n, 0), p3(n, 0), p4(n);
    for (int r = 0; r < n; ++r) {
      p1[r] = r % 2 == 1 ? 0 : 3 * r + 2;
      p4[r] = 100 * r + 1;
    }
    p2[n - 1] = 5;
    patterns = {p1, p2, p3, p4};
  }
  for (const auto& counts : patterns) {
    const size_t mine = counts[w.rank()];
    std::vector<int32_t> send(mine);
    for (size_t i = 0; i < mine; ++i) send[i] = w.rank() * 1000 + static_cast<int>(i);
    std::vector<size_t> bytes(n);
    size_t total = 0;
    for (int r = 0; r < n; ++r) {
      bytes[r] = counts[r] * sizeof(int32_t);
      total += counts[r];
    }
    std::vector<int32_t> recv(total, -1);
    w.all_gather_v(send.data(), mine * sizeof(int32_t), recv.data(), bytes);
    size_t off = 0;
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < counts[r]; ++i, ++off) EXPECT_EQ(recv[off], r * 1000 + static_cast<int>(i));
  }
  // Wrong own size: a clear error before any communication (same on every rank).
  std::vector<size_t> bytes(n, 4);
  int32_t x = 0;
  std::vector<int32_t> out(n);
  expect_error([&] { w.all_gather_v(&x, 8, out.data(), bytes); }, "all_gather_v");
}

TEST(Comm, ReduceScatterVSumsEachBlockToItsOwner) {
  auto& w = W();
  const int n = w.size();
  std::vector<size_t> counts(n);
  for (int r = 0; r < n; ++r) counts[r] = r == 1 ? 0 : 2 * r + 3;  // rank 1 gets nothing
  std::vector<size_t> offs(n + 1, 0);
  for (int r = 0; r < n; ++r) offs[r + 1] = offs[r] + counts[r];
  auto value = [](int sender, int block, size_t i) {
    return static_cast<float>(sender * 1000 + block * 100 + static_cast<int>(i));
  };
  std::vector<float> send(offs[n]);
  for (int b = 0; b < n; ++b)
    for (size_t i = 0; i < counts[b]; ++i) send[offs[b] + i] = value(w.rank(), b, i);
  const int me = w.rank();
  auto want = [&](size_t i) {
    float s = 0;
    for (int r = 0; r < n; ++r) s += value(r, me, i);
    return s;
  };
  std::vector<float> recv(counts[me] + 1, -7.0f);  // one sentinel past the block
  w.reduce_scatter_v_sum(send.data(), recv.data(), counts);
  for (size_t i = 0; i < counts[me]; ++i) EXPECT_EQ(recv[i], want(i)) << i;
  EXPECT_EQ(recv[counts[me]], -7.0f);
  // In place: send == recv, the result lands at the start of the buffer.
  std::vector<float> inplace = send;
  w.reduce_scatter_v_sum(inplace.data(), inplace.data(), counts);
  for (size_t i = 0; i < counts[me]; ++i) EXPECT_EQ(inplace[i], want(i)) << i;
  // All counts zero.
  std::vector<size_t> zeros(n, 0);
  w.reduce_scatter_v_sum(nullptr, nullptr, zeros);
}

// Rank s sends c(s, d) ints to rank d: value s*1000000 + d*1000 + i. Send blocks lie
// in reverse rank order with one-int gaps; receive blocks in rank order with
// two-int gaps holding a sentinel, so offsets are really used.
void run_all_to_all(Communicator& w, bool nonblocking) {
  const int n = w.size();
  const int me = w.rank();
  auto count = [](int s, int d) { return static_cast<size_t>((s + 2 * d) % 4) * 7; };  // 0, 7, 14, 21
  std::vector<size_t> sb(n), so(n), rb(n), ro(n);
  size_t off = 0;
  for (int d = n - 1; d >= 0; --d) {
    so[d] = off * sizeof(int32_t);
    sb[d] = count(me, d) * sizeof(int32_t);
    off += count(me, d) + 1;
  }
  std::vector<int32_t> send(off, -1);
  for (int d = 0; d < n; ++d)
    for (size_t i = 0; i < count(me, d); ++i) send[so[d] / 4 + i] = me * 1000000 + d * 1000 + static_cast<int>(i);
  off = 0;
  for (int s = 0; s < n; ++s) {
    ro[s] = off * sizeof(int32_t);
    rb[s] = count(s, me) * sizeof(int32_t);
    off += count(s, me) + 2;
  }
  const int32_t sentinel = -123456;
  std::vector<int32_t> recv(off, sentinel);
  if (nonblocking) {
    auto req = w.iall_to_all_v(send.data(), sb, so, recv.data(), rb, ro);
    double acc = busy_work(200000);
    EXPECT_GT(acc, 0);
    req->wait();
  } else {
    w.all_to_all_v(send.data(), sb, so, recv.data(), rb, ro);
  }
  for (int s = 0; s < n; ++s) {
    for (size_t i = 0; i < count(s, me); ++i)
      EXPECT_EQ(recv[ro[s] / 4 + i], s * 1000000 + me * 1000 + static_cast<int>(i)) << "from " << s << " i " << i;
    EXPECT_EQ(recv[ro[s] / 4 + count(s, me)], sentinel);
    EXPECT_EQ(recv[ro[s] / 4 + count(s, me) + 1], sentinel);
  }
}

TEST(Comm, AllToAllVUnevenWithOffsets) { run_all_to_all(W(), false); }
TEST(Comm, IallToAllVOverlapsWithComputation) { run_all_to_all(W(), true); }

TEST(Comm, AllToAllVAllEmpty) {
  auto& w = W();
  std::vector<size_t> z(w.size(), 0);
  w.all_to_all_v(nullptr, z, z, nullptr, z, z);
  auto r = w.iall_to_all_v(nullptr, z, z, nullptr, z, z);
  r->wait();
}

// Pretends MPI counts stop at 64 so that sizes above it take the large-count paths
// (blocks of 2^k bytes, chunked reductions/broadcasts) with small buffers.
struct SmallCountLimit {
  SmallCountLimit() { detail::set_mpi_count_limit_for_testing(64); }
  ~SmallCountLimit() { detail::set_mpi_count_limit_for_testing(0); }
};

TEST(Comm, LargeCountPaths) {
  auto& w = W();
  const int n = w.size();
  const int me = w.rank();
  SmallCountLimit limit;

  // broadcast: 1000 bytes -> 16 chunks.
  std::vector<uint8_t> bc(1000);
  for (size_t i = 0; i < bc.size(); ++i) bc[i] = me == 0 ? static_cast<uint8_t>(i * 7) : 0;
  w.broadcast(bc.data(), bc.size(), 0);
  for (size_t i = 0; i < bc.size(); ++i) EXPECT_EQ(bc[i], static_cast<uint8_t>(i * 7)) << i;

  // all_reduce: 1000 floats -> 16 requests.
  std::vector<float> ar(1000);
  for (size_t i = 0; i < ar.size(); ++i) ar[i] = static_cast<float>(me * 1000 + static_cast<int>(i));
  w.all_reduce_sum(ar.data(), ar.size());
  for (size_t i = 0; i < ar.size(); ++i)
    EXPECT_EQ(ar[i], static_cast<float>(1000 * n * (n - 1) / 2 + n * static_cast<int>(i))) << i;

  // all_gather: 96 bytes each (96 * size in all) = 3 blocks of 32 each.
  std::vector<uint8_t> ag(96), agr(96 * n);
  for (size_t i = 0; i < ag.size(); ++i) ag[i] = static_cast<uint8_t>(me * 31 + i);
  w.all_gather(ag.data(), ag.size(), agr.data());
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < ag.size(); ++i) EXPECT_EQ(agr[r * 96 + i], static_cast<uint8_t>(r * 31 + i));

  // all_gather_v: rank r sends 16*(r+5) bytes (80..128), blocks of 16.
  std::vector<size_t> gb(n);
  size_t total = 0;
  for (int r = 0; r < n; ++r) total += (gb[r] = 16 * (r + 5));
  std::vector<uint8_t> gs(gb[me]), gr(total);
  for (size_t i = 0; i < gs.size(); ++i) gs[i] = static_cast<uint8_t>(me * 50 + i);
  w.all_gather_v(gs.data(), gs.size(), gr.data(), gb);
  size_t off = 0;
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < gb[r]; ++i, ++off) EXPECT_EQ(gr[off], static_cast<uint8_t>(r * 50 + i));

  // all_to_all_v: 32*(s+d+3) bytes from s to d, packed: blocks of 32.
  std::vector<size_t> sb(n), so(n), rb(n), ro(n);
  size_t soff = 0, roff = 0;
  for (int d = 0; d < n; ++d) {
    sb[d] = 32 * (me + d + 3);
    so[d] = soff;
    soff += sb[d];
    rb[d] = 32 * (d + me + 3);
    ro[d] = roff;
    roff += rb[d];
  }
  std::vector<uint8_t> as(soff), arv(roff);
  for (int d = 0; d < n; ++d)
    for (size_t i = 0; i < sb[d]; ++i) as[so[d] + i] = static_cast<uint8_t>(me * 40 + d * 7 + i);
  w.all_to_all_v(as.data(), sb, so, arv.data(), rb, ro);
  for (int s = 0; s < n; ++s)
    for (size_t i = 0; i < rb[s]; ++i) EXPECT_EQ(arv[ro[s] + i], static_cast<uint8_t>(s * 40 + me * 7 + i));

  // Sizes that no block can express fail clearly, on every rank alike.
  std::vector<size_t> odd(n, 101);
  std::vector<uint8_t> big(101 * n);
  expect_error([&] { w.all_gather_v(big.data(), 101, big.data(), odd); }, "exceeds MPI's int count limit");
  std::vector<size_t> many(n, 65);
  std::vector<float> fs(65 * n);
  expect_error([&] { w.reduce_scatter_v_sum(fs.data(), fs.data(), many); }, "reduce_scatter_v_sum");
}

// Checks the groups of `g` on world `sub` against the documented layout.
void check_layout(Communicator& sub, const ParallelConfig& cfg) {
  ParallelGroups g(sub, cfg);
  const int W = sub.size(), r = sub.rank();
  const int attn = W / cfg.dp;
  EXPECT_EQ(g.tp_rank(), r % cfg.tp);
  EXPECT_EQ(g.ep_rank(), r / cfg.tp);
  EXPECT_EQ(g.dp_rank(), r / attn);
  EXPECT_EQ(g.attn_tp_rank(), r % attn);
  EXPECT_EQ(ParallelGroups::world_rank_of(cfg, g.ep_rank(), g.tp_rank()), r);
  const std::string what = to_string(cfg) + " on " + std::to_string(W) + " ranks, rank " + std::to_string(r);
  // Members (as ranks of `sub`) of every group, and the groups' names and sizes.
  auto moe_tp = gather_int(g.moe_tp(), r);
  auto ep = gather_int(g.ep(), r);
  auto dp = gather_int(g.dp_attn(), r);
  EXPECT_EQ(g.moe_tp().name(), "moe_tp");
  EXPECT_EQ(g.ep().name(), "ep");
  EXPECT_EQ(g.dp_attn().name(), "dp");
  EXPECT_EQ(static_cast<int>(moe_tp.size()), cfg.tp) << what;
  EXPECT_EQ(static_cast<int>(ep.size()), cfg.ep) << what;
  EXPECT_EQ(static_cast<int>(dp.size()), attn) << what;
  for (int j = 0; j < cfg.tp && j < static_cast<int>(moe_tp.size()); ++j)
    EXPECT_EQ(moe_tp[j], g.ep_rank() * cfg.tp + j) << what;
  for (int k = 0; k < cfg.ep && k < static_cast<int>(ep.size()); ++k)
    EXPECT_EQ(ep[k], k * cfg.tp + g.tp_rank()) << what;
  for (int j = 0; j < attn && j < static_cast<int>(dp.size()); ++j) EXPECT_EQ(dp[j], g.dp_rank() * attn + j) << what;
  // The groups communicate independently: sums of members' ranks.
  float s = static_cast<float>(r);
  g.ep().all_reduce_sum(&s, 1);
  float want = 0;
  for (int k = 0; k < cfg.ep; ++k) want += static_cast<float>(k * cfg.tp + g.tp_rank());
  EXPECT_EQ(s, want) << what;
  EXPECT_EQ(&g.world(), &sub);
}

TEST(Groups, EveryValidLayoutOnEveryWorldSize) {
  auto& w = W();
  // Worlds of 1..size ranks: the first `ws` ranks split off; the others wait.
  for (int ws = 1; ws <= w.size(); ++ws) {
    auto sub = w.split(w.rank() < ws ? 0 : 1, w.rank(), "sub" + std::to_string(ws));
    if (w.rank() >= ws) continue;
    EXPECT_EQ(sub->size(), ws);
    for (int ep = 1; ep <= ws; ++ep) {
      if (ws % ep != 0) continue;
      for (int dp = 1; dp <= ws; ++dp) {
        if (ws % dp != 0) continue;
        check_layout(*sub, ParallelConfig{ep, ws / ep, dp});
      }
    }
  }
  w.barrier();
}

TEST(Groups, LocalWorld) {
  auto local = make_local_comm();
  check_layout(*local, ParallelConfig{});
}

TEST(Groups, LayoutErrorsNameTheFlags) {
  const int n = W().size();
  expect_error([&] { validate_parallel_config({3, 2, 1}, n); },
               "--ep 3 --tp 2 needs 6 ranks, mpirun started " + std::to_string(n));
  expect_error([&] { ParallelGroups g(W(), ParallelConfig{n + 1, 1, 1}); }, "needs " + std::to_string(n + 1));
  expect_error([&] { validate_parallel_config({0, 1, 1}, n); }, "--ep must be at least 1");
  expect_error([&] { validate_parallel_config({1, n, n + 1}, n); }, "--dp " + std::to_string(n + 1));
  expect_error([&] { validate_parallel_config({1, 1, 1}, 4); }, "(with --tp 1 use --ep 4)");
}

// Every rank returns normally when the fields agree, including fields each rank builds
// itself (equal text, separate buffers) and a large one; and every rank sees every
// other rank pass (a rank that threw would report 0 here).
TEST(Consistency, PassesWhenAllRanksAgree) {
  auto& w = W();
  std::string big(1 << 20, 'x');
  for (size_t i = 0; i < big.size(); i += 4093) big[i] = static_cast<char>('a' + i % 26);
  const std::string flags = "--ep " + std::to_string(w.size());
  int passed = 1;
  try {
    check_same_on_all_ranks(w, {{"config", "{\"hidden\": 64}"}, {"flags", flags}, {"placement", ""}});
    check_same_on_all_ranks(w, {{"config", big}});
    check_same_on_all_ranks(w, {});
  } catch (const Error& e) {
    passed = 0;
    ADD_FAILURE() << "rank " << w.rank() << ": " << e.what();
  }
  const auto all = gather_int(w, passed);
  for (int r = 0; r < w.size(); ++r) EXPECT_EQ(all[r], 1) << "rank " << r << " rejected fields that agree";
}

TEST(Consistency, EveryRankThrowsNamingTheField) {
  auto& w = W();
  const int n = w.size();
  if (n == 1) GTEST_SKIP() << "needs 2 ranks";
  const int odd = n - 1;
  const std::string flags = w.rank() == odd ? "--ep 4" : "--ep 2";
  const std::string placement = w.rank() == odd ? "b" : "a";  // differs too, but after 'flags'
  const std::string msg = expect_error(
      [&] { check_same_on_all_ranks(w, {{"config", "same"}, {"flags", flags}, {"placement", placement}}); },
      "ranks disagree on 'flags':");
  EXPECT_NE(msg.find("rank " + std::to_string(odd) + " has '--ep 4'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(n == 2 ? "rank 0 has '--ep 2'" : "have '--ep 2'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hash 0x"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("placement"), std::string::npos) << msg;
  // The same text on every rank.
  const auto len = gather_int(w, static_cast<int>(msg.size()));
  for (int r = 0; r < n; ++r) EXPECT_EQ(len[r], len[0]);
}

TEST(Consistency, LongValuesShowTheDifference) {
  auto& w = W();
  if (w.size() == 1) GTEST_SKIP() << "needs 2 ranks";
  std::string config(5000, 'x');
  if (w.rank() == 1) config[3000] = 'Y';
  const std::string msg =
      expect_error([&] { check_same_on_all_ranks(w, {{"config", config}}); }, "ranks disagree on 'config'");
  EXPECT_NE(msg.find("differs from rank 0's at char 3000"), std::string::npos) << msg;
  EXPECT_NE(msg.find("xY"), std::string::npos) << msg;
  EXPECT_LT(msg.size(), 1500u);
}

TEST(Consistency, DifferentNumberOfFields) {
  auto& w = W();
  if (w.size() == 1) GTEST_SKIP() << "needs 2 ranks";
  std::vector<std::pair<std::string, std::string>> fields{{"config", "c"}, {"flags", "f"}};
  if (w.rank() == 0) fields.push_back({"placement", "p"});
  expect_error([&] { check_same_on_all_ranks(w, fields); }, "rank 0 has 3 (config, flags, placement)");
}

TEST(LocalComm, EveryCollectiveCopies) {
  auto c = make_local_comm("solo");
  EXPECT_EQ(c->name(), "solo");
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  c->barrier();
  float f[3] = {1, 2, 3};
  c->all_reduce_sum(f, 3);
  c->iall_reduce_sum(f, 3)->wait();
  EXPECT_EQ(f[2], 3.0f);
  int a[4] = {1, 2, 3, 4}, b[4] = {};
  c->broadcast(a, sizeof(a), 0);
  c->all_gather(a, sizeof(a), b);
  EXPECT_EQ(b[3], 4);
  int g[2] = {};
  c->all_gather_v(a, 8, g, {8});
  EXPECT_EQ(g[1], 2);
  float rs[2] = {};
  c->reduce_scatter_v_sum(f, rs, {2});
  EXPECT_EQ(rs[1], 2.0f);
  int t[6] = {};
  c->all_to_all_v(a, {8}, {8}, t, {8}, {12});  // a[2..3] -> t[3..4]
  EXPECT_EQ(t[3], 3);
  EXPECT_EQ(t[4], 4);
  EXPECT_EQ(t[5], 0);
  auto req = c->iall_to_all_v(a, {4}, {0}, t, {4}, {0});
  EXPECT_TRUE(req->test());
  EXPECT_EQ(t[0], 1);
  c->set_timeout(5);
  auto s = c->split(0, 0, "ep");
  EXPECT_EQ(s->name(), "ep");
  EXPECT_EQ(s->size(), 1);
  EXPECT_EQ(s->timeout(), 5);
  expect_error([&] { c->broadcast(a, 4, 1); }, "root 1");
  expect_error([&] { c->all_to_all_v(a, {4}, {0}, t, {8}, {0}); }, "sends itself 4 bytes but expects 8");
  check_same_on_all_ranks(*c, {{"x", "y"}});
}

TEST(Comm, SplitKeepsTimeoutAndOrdersByKey) {
  auto& w = W();
  const double old = w.timeout();
  w.set_timeout(42);
  // Reverse order by key: rank r gets sub-rank size-1-r.
  auto rev = w.split(0, w.size() - w.rank(), "rev");
  w.set_timeout(old);
  EXPECT_EQ(rev->timeout(), 42);
  EXPECT_EQ(rev->name(), "rev");
  EXPECT_EQ(rev->rank(), w.size() - 1 - w.rank());
  const auto members = gather_int(*rev, w.rank());
  for (int i = 0; i < rev->size(); ++i) EXPECT_EQ(members[i], w.size() - 1 - i);
  expect_error([&] { (void)w.split(-1, 0, "bad"); }, "color must be >= 0");
}

}  // namespace
}  // namespace moe

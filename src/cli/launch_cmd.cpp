// `moe-ep launch -- mpirun ...`: runs the launcher command and makes the job end when a
// rank has given up on it.
//
// Why: when a host becomes unreachable mid-job, the surviving ranks notice within
// --comm-timeout (every wait is bounded) and call MPI_Abort. OpenMPI's mpirun then
// tells every daemon to kill its ranks. For the unreachable daemon that message sits
// unacknowledged in a TCP send queue, and mpirun waits for it until the kernel gives
// the connection up: tcp_retries2 (15 by default) retransmissions, about 15 minutes.
// OpenMPI 4.1 has no parameter that bounds this (its oob keepalive only probes idle
// connections). Signalled meanwhile, mpirun crashes in PMIx_Finalize. Measured on the
// namespace bed with the kernel's default TCP settings: the job was still running 147 s
// after a cut link (docs/SCALE.md, section 3).
//
// What: the command runs in its own process group, and its output passes through line
// by line. A line that says a rank failed starts a grace period: "moe-ep: rank N: ..."
// (every rank's fatal report, comm/mpi_comm.cpp abort_job) or OpenMPI's "MPI_ABORT was
// invoked". If the command has not ended after the grace, its process group is killed
// (SIGKILL: mpirun's own SIGTERM path is the one that crashes). The reachable daemons
// lose their lifeline to mpirun and kill their ranks; the unreachable host's ranks hit
// their own --comm-timeout. SIGINT / SIGTERM to the launcher go to the command, with
// the same grace. Exit status: the command's, or 1 when it had to be killed.
#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "cli/verbs.h"
#include "core/check.h"
#include "core/clock.h"

namespace moe {
namespace {

struct LaunchOptions {
  std::vector<std::string> command;
  double grace_s = 5;
};

volatile std::sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }

// One output stream of the command: bytes pass through at once; complete lines are
// also checked for the failure markers.
struct Stream {
  int fd = -1, out = -1;
  std::string line;  // the current line so far (only for matching)
};

bool is_failure_line(const std::string& line) {
  static const std::regex rank_report("^moe-ep: rank [0-9]+: ");
  return std::regex_search(line, rank_report) || line.find("MPI_ABORT was invoked") != std::string::npos;
}

void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // our own output is gone (a closed pipe): keep supervising
    p += w;
    n -= static_cast<size_t>(w);
  }
}

int run_launch(const LaunchOptions& o) {
  MOE_CHECK(!o.command.empty(), "launch needs the command to run after --, e.g. moe-ep launch -- mpirun -np 2 moe-ep "
            "generate ...");
  MOE_CHECK(o.grace_s >= 0, "--grace must not be negative, got {}", o.grace_s);
  int out_pipe[2], err_pipe[2];
  MOE_CHECK(::pipe(out_pipe) == 0 && ::pipe(err_pipe) == 0, "launch: pipe: {}", std::strerror(errno));
  const pid_t pid = ::fork();
  MOE_CHECK(pid >= 0, "launch: fork: {}", std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);  // its own group: killed as one, daemons' ssh / agents included
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) ::close(fd);
    std::vector<char*> argv;
    for (const std::string& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "moe-ep launch: cannot run '%s': %s\n", argv[0], std::strerror(errno));
    std::_Exit(127);
  }
  ::setpgid(pid, pid);  // also here: no race with the child's own call
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  Stream streams[2] = {{out_pipe[0], STDOUT_FILENO, {}}, {err_pipe[0], STDERR_FILENO, {}}};
  double deadline = -1;  // when the grace after a failure (or a signal) ends
  std::string why;
  int status = 0;
  bool exited = false;
  char buf[65536];
  while (!exited) {
    if (g_signal != 0 && deadline < 0) {
      ::kill(-pid, SIGTERM);
      why = fmt::format("it had not ended {} s after the launcher got signal {}", o.grace_s, int(g_signal));
      deadline = now_s() + o.grace_s;
    }
    pollfd fds[2];
    int n = 0;
    for (Stream& s : streams)
      if (s.fd >= 0) fds[n++] = {s.fd, POLLIN, 0};
    const int ready = n > 0 ? ::poll(fds, n, 100) : (::usleep(100000), 0);
    if (ready > 0) {
      for (int i = 0; i < n; ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        Stream& s = streams[0].fd == fds[i].fd ? streams[0] : streams[1];
        const ssize_t got = ::read(s.fd, buf, sizeof buf);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
          ::close(s.fd);
          s.fd = -1;
          continue;
        }
        write_all(s.out, buf, static_cast<size_t>(got));
        for (ssize_t j = 0; j < got; ++j) {
          if (buf[j] != '\n') {
            if (s.line.size() < 4096) s.line.push_back(buf[j]);
            continue;
          }
          if (deadline < 0 && is_failure_line(s.line)) {
            deadline = now_s() + o.grace_s;
            why = fmt::format("it had not ended {} s after a rank reported a failure (\"{}\")", o.grace_s,
                              s.line.substr(0, 120));
          }
          s.line.clear();
        }
      }
    }
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) exited = true;
    if (!exited && deadline >= 0 && now_s() >= deadline) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      fmt::print(stderr,
                 "moe-ep launch: killed '{}' (process group {}): {}. A host it must reach is probably gone: mpirun "
                 "waits for TCP to give up on it (minutes with the kernel's default tcp_retries2)\n",
                 o.command[0], pid, why);
      return 1;
    }
  }
  // The command ended; what it wrote last is still in the pipes (or in its children's).
  for (Stream& s : streams) {
    if (s.fd < 0) continue;
    ::fcntl(s.fd, F_SETFL, O_NONBLOCK);
    for (ssize_t got; (got = ::read(s.fd, buf, sizeof buf)) > 0;) write_all(s.out, buf, static_cast<size_t>(got));
    ::close(s.fd);
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

Verb add_launch_verb(CLI::App& app) {
  auto o = std::make_shared<LaunchOptions>();
  CLI::App* c = app.add_subcommand(
      "launch",
      "Run a launcher command (mpirun ...) and end the job when a rank reports a failure: if the command has not "
      "ended --grace seconds after a rank's \"moe-ep: rank N: ...\" report (or OpenMPI's \"MPI_ABORT was "
      "invoked\"), its process group is killed and launch exits 1. With the kernel's default TCP settings, mpirun "
      "otherwise waits minutes for a host that became unreachable. Output passes through unchanged; SIGINT and "
      "SIGTERM go to the command. Example: moe-ep launch -- mpirun -np 4 --hostfile hosts moe-ep serve --model DIR "
      "--ep 4 --comm-timeout 30. See docs/SCALE.md");
  c->add_option("--grace", o->grace_s,
                "Seconds the command may take to end by itself after a rank reported a failure (or after a signal)")
      ->capture_default_str();
  c->add_option("command", o->command, "The launcher command and its arguments, after --")->required();
  return {c, [o] { return run_launch(*o); }};
}

}  // namespace moe

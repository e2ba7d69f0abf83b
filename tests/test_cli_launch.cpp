// `moe-ep launch`: the command's output and exit status pass through; a rank's failure
// report followed by a command that does not end gets the command's whole process group
// killed after --grace (the netbed fault tests run it on real mpirun jobs with the
// kernel's default TCP settings); a signal to the launcher reaches the command.
#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <string>

#include "test_util.h"

namespace moe {
namespace {

std::string launch(const std::string& args) { return std::string(MOE_EP_BINARY) + " launch " + args; }

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Whether process `pid` still runs (a zombie waiting for its reaper does not).
bool running(int pid) {
  const std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

TEST(CliLaunch, OutputAndExitStatusPassThrough) {
  std::string out;
  EXPECT_EQ(test::run_command(launch("-- bash -c 'echo to-stdout; echo to-stderr >&2; exit 3'"), &out), 3);
  EXPECT_NE(out.find("to-stdout"), std::string::npos) << out;
  EXPECT_NE(out.find("to-stderr"), std::string::npos) << out;
  // A failure report alone changes nothing when the command ends by itself in the grace.
  EXPECT_EQ(test::run_command(launch("--grace 30 -- bash -c 'echo \"moe-ep: rank 1: boom\" >&2; exit 2'"), &out), 2);
  EXPECT_EQ(out.find("killed"), std::string::npos) << out;
  EXPECT_EQ(test::run_command(launch("-- /nonexistent/mpirun -np 2"), &out), 127);
  EXPECT_NE(out.find("cannot run '/nonexistent/mpirun'"), std::string::npos) << out;
  EXPECT_NE(test::run_command(launch(""), &out), 0);
}

// After the report, the command (and a child it started, as mpirun starts its daemons'
// agents) still runs: both are killed, and launch exits 1 naming why.
TEST(CliLaunch, AFailureReportEndsACommandThatHangs) {
  test::TempDir t;
  const std::string pidfile = t / "child.pid";
  for (const char* report : {"moe-ep: rank 2: all_reduce_sum on communicator 'world' did not complete",
                             "MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD"}) {
    SCOPED_TRACE(report);
    std::string out;
    const std::string script = "sleep 300 & echo $! > " + pidfile + "; echo \"" + report + "\" >&2; wait; echo never";
    EXPECT_EQ(test::run_command(launch("--grace 0.5 -- bash -c '" + script + "'"), &out), 1);
    EXPECT_NE(out.find("moe-ep launch: killed 'bash'"), std::string::npos) << out;
    EXPECT_EQ(out.find("never"), std::string::npos) << out;
    // SIGKILL has been sent to the group; the kernel ends the child when it next runs.
    const int child = std::stoi(slurp(pidfile));
    for (int i = 0; i < 1000 && running(child); ++i) usleep(10000);
    EXPECT_FALSE(running(child)) << "the command's child " << child << " is still running 10 s after the kill";
  }
}

// SIGTERM to launch goes to the command, which ends by itself (its trap runs).
TEST(CliLaunch, SignalsReachTheCommand) {
  test::TempDir t;
  const std::string mark = t / "got_term", ready = t / "ready", cmd = t / "cmd.sh", driver = t / "driver.sh";
  std::ofstream(cmd) << "trap 'echo term > " << mark << "; exit 5' TERM\ntouch " << ready
                     << "\nwhile true; do sleep 0.05; done\n";
  std::ofstream(driver) << launch("--grace 30 -- bash " + cmd) << " &\np=$!\nwhile [ ! -f " << ready
                        << " ]; do sleep 0.05; done\nkill -TERM $p\nwait $p\n";
  std::string out;
  EXPECT_EQ(test::run_command("bash " + driver, &out), 5) << out;
  EXPECT_EQ(slurp(mark), "term\n");
}

}  // namespace
}  // namespace moe

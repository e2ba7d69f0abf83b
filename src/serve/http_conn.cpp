#include "serve/http_conn.h"

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <httplib.h>

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moe::serve {

namespace {

class ConnectionPool : public httplib::TaskQueue {
 public:
  ConnectionPool(size_t min_threads, size_t max_threads) : max_(std::max<size_t>(1, max_threads)) {
    std::lock_guard lk(mu_);
    for (size_t i = 0; i < std::min(min_threads, max_); ++i) spawn();
  }
  ~ConnectionPool() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard lk(mu_);
      jobs_.push_back(std::move(fn));
      if (jobs_.size() > idle_ && threads_.size() < max_) spawn();
    }
    cv_.notify_one();
  }

  // httplib calls this once its accept loop ended: finish the queued connections, join.
  void shutdown() override {
    {
      std::lock_guard lk(mu_);
      if (stopping_ && threads_.empty()) return;
      stopping_ = true;
    }
    cv_.notify_all();
    std::vector<std::thread> threads;
    {
      std::lock_guard lk(mu_);
      threads.swap(threads_);
    }
    for (auto& t : threads) t.join();
  }

 private:
  void spawn() {  // mu_ held
    threads_.emplace_back([this] { work(); });
  }
  void work() {
    std::unique_lock lk(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(lk, [&] { return !jobs_.empty() || stopping_; });
      --idle_;
      if (jobs_.empty()) return;  // stopping, nothing left
      auto fn = std::move(jobs_.front());
      jobs_.pop_front();
      lk.unlock();
      fn();
      lk.lock();
    }
  }

  const size_t max_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stopping_ = false;
};

bool numeric_name(const sockaddr_storage& ss, socklen_t len, std::string* host, int* port) {
  char h[NI_MAXHOST], s[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&ss), len, h, sizeof h, s, sizeof s,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  *host = h;
  *port = std::atoi(s);
  return true;
}

int local_port_of(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return -1;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return -1;
}

// Calls fn(fd, peer host, peer port) for each connected TCP socket of ours on local_port;
// stops when fn returns true.
template <typename F>
int for_each_connection(int local_port, F&& fn) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  const int own = dirfd(dir);
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == own) continue;
    struct stat st{};
    if (fstat(int(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (local_port_of(int(fd)) != local_port) continue;
    sockaddr_storage peer{};
    socklen_t len = sizeof peer;
    if (getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &len) != 0) continue;  // the listener
    std::string host;
    int port = -1;
    if (!numeric_name(peer, len, &host, &port) || port == local_port) continue;
    if (fn(int(fd), host, port)) {
      found = int(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

}  // namespace

std::unique_ptr<httplib::TaskQueue> make_connection_pool(size_t min_threads, size_t max_threads) {
  return std::make_unique<ConnectionPool>(min_threads, max_threads);
}

int find_connection_fd(int local_port, const std::string& remote_addr, int remote_port) {
  return for_each_connection(local_port, [&](int, const std::string& host, int port) {
    return port == remote_port && host == remote_addr;
  });
}

bool peer_closed(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) < 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

int shutdown_connections(int local_port) {
  int n = 0;
  for_each_connection(local_port, [&](int fd, const std::string&, int) {
    if (::shutdown(fd, SHUT_RDWR) == 0) ++n;
    return false;
  });
  return n;
}

}  // namespace moe::serve

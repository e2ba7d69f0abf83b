// Connection-level pieces cpp-httplib 0.11 does not offer: a connection thread pool
// that grows with demand, and the accepted socket of a request (httplib keeps it from
// handlers) so a handler can see its client hang up and stop() can cut slow clients.
// Linux only (/proc/self/fd, POLLRDHUP).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace httplib {
class TaskQueue;
}

namespace moe::serve {

// Starts min_threads workers and adds one whenever a connection arrives with none idle,
// up to max_threads; beyond that connections wait in order. httplib gives each
// connection a thread for its whole life (a stream lasts as long as its generation), so
// a fixed small pool would let a few long streams or idle keep-alive clients block
// everyone else.
std::unique_ptr<httplib::TaskQueue> make_connection_pool(size_t min_threads, size_t max_threads);

// The fd of the accepted socket with this 4-tuple (our port; the client's numeric
// address and port, as httplib::Request has them), or -1. The tuple is unique among the
// process's open sockets, and the handler's thread owns that socket until it returns, so
// the fd stays valid for the handler.
int find_connection_fd(int local_port, const std::string& remote_addr, int remote_port);

// The client closed its end (or the connection broke). Never blocks.
bool peer_closed(int fd);

// shutdown(SHUT_RDWR) on every accepted socket of ours on local_port, so threads blocked
// on slow clients return at once. Returns how many.
int shutdown_connections(int local_port);

}  // namespace moe::serve

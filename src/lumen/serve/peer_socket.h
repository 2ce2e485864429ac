// The socket of the connection a request came on, to notice a client that
// hangs up while a non-streaming request is still generating.
//
// cpp-httplib 0.11 gives a handler no socket and no "connection closed"
// query (streams notice a hang-up when a write fails; a non-streaming
// response writes nothing until the end). PeerSocket finds the connection's
// descriptor among the process's open sockets by its two addresses, as
// httplib reports them, and asks it without reading: the handler runs on the
// connection's own thread, so nothing else reads it meanwhile. Linux only
// (/proc/self/fd); elsewhere, and when no socket matches, it never reports a
// hang-up.
#pragma once

#include <string>

namespace lumen::serve {

class PeerSocket {
 public:
  // The connection from remote_addr:remote_port to our local_port.
  PeerSocket(const std::string& remote_addr, int remote_port, int local_port);

  // True once the client has closed its end (an orderly FIN or a reset)
  // and sent nothing more; false while it is open, or when unknown.
  bool Closed() const;

 private:
  int fd_ = -1;
};

}  // namespace lumen::serve

// End-to-end tests of `lumen serve`'s limits: the API key, CORS and the
// body size, a full queue and a client that disconnects mid-stream, and a
// graceful shutdown that ends open streams (the real binary, LUMEN_BINARY,
// with the embedded model on an ephemeral port).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "serve_http.h"

namespace {

using namespace lumen::testing::http;  // ServerProcess, Request, Post, Chat, ParseSse
                                       // (serve_http.h)

TEST(ServerLimits, AuthCorsAndBodySize) {
  ServerProcess server(
      {"--api-key", "sekret", "--cors", "http://example.test", "--max-body-mb", "0.001"});
  ASSERT_GT(server.port(), 0) << server.log();
  const int p = server.port();
  EXPECT_EQ(Request(p, "GET", "/health").status, 200);  // open, for load balancers
  auto no = Post(p, "/v1/chat/completions", Chat("hi", 2));
  EXPECT_EQ(no.status, 401);
  EXPECT_EQ(no.Json()["error"]["type"], "authentication_error");
  EXPECT_EQ(Post(p, "/v1/chat/completions", Chat("hi", 2), {"Authorization: Bearer wrong"}).status,
            401);
  EXPECT_EQ(Post(p, "/v1/chat/completions", Chat("hi", 2), {"Authorization: Bearer sekret"}).status,
            200);
  EXPECT_EQ(Post(p, "/v1/chat/completions", Chat("hi", 2), {"x-api-key: sekret"}).status, 200);
  auto an = Post(p, "/v1/messages",
                 {{"max_tokens", 2}, {"messages", {{{"role", "user"}, {"content", "x"}}}}});
  EXPECT_EQ(an.status, 401);
  EXPECT_EQ(an.Json()["type"], "error");
  EXPECT_EQ(an.Json()["error"]["type"], "authentication_error");
  EXPECT_EQ(Request(p, "GET", "/stats").status, 401);
  auto ok = Request(p, "GET", "/v1/models", "", {"x-api-key: sekret"});
  EXPECT_EQ(ok.Header("Access-Control-Allow-Origin"), "http://example.test");
  auto pre = Request(p, "OPTIONS", "/v1/chat/completions", "", {"Origin: http://example.test"});
  EXPECT_EQ(pre.status, 204);
  EXPECT_NE(pre.Header("Access-Control-Allow-Headers").find("x-api-key"), std::string::npos);
  // A browser SDK's preflight is granted the headers it asks for.
  const std::string asked = "x-stainless-os, anthropic-dangerous-direct-browser-access";
  auto sdk = Request(p, "OPTIONS", "/v1/messages", "",
                     {"Origin: http://example.test", "Access-Control-Request-Method: POST",
                      "Access-Control-Request-Headers: " + asked});
  EXPECT_EQ(sdk.status, 204);
  EXPECT_EQ(sdk.Header("Access-Control-Allow-Headers"), asked) << sdk.headers;
  // The auth scheme is case-insensitive (RFC 7235).
  EXPECT_EQ(Post(p, "/v1/chat/completions", Chat("hi", 2), {"Authorization: bearer sekret"}).status,
            200);
  // Another method on a POST endpoint is a 405 naming the method.
  auto get = Request(p, "GET", "/v1/chat/completions", "", {"x-api-key: sekret"});
  EXPECT_EQ(get.status, 405) << get.body;
  EXPECT_EQ(get.Header("Allow"), "POST");
  EXPECT_NE(get.body.find("method not allowed"), std::string::npos) << get.body;
  // 1 KiB limit.
  auto big =
      Post(p, "/v1/chat/completions", Chat(std::string(4000, 'a'), 2), {"x-api-key: sekret"});
  EXPECT_EQ(big.status, 413);
  EXPECT_TRUE(big.Json()["error"]["message"].is_string()) << big.body;
  EXPECT_EQ(server.Stop(), 0);
}

// A streaming request that runs until the context is full.
json Endless(const std::string& path) {
  json b = path == "/v1/messages" ? json{{"max_tokens", 60000},
                                         {"messages", {{{"role", "user"}, {"content", "Once"}}}}}
                                  : Chat("Once", 60000);
  b["stream"] = true;
  b["logit_bias"] = {{"2", -100}};  // no EOS (token 2 in stories260K)
  b["seed"] = 1;
  return b;
}

// Opens a stream and returns the socket after the first bytes of the body.
int OpenStream(int port, const std::string& path, const json& body) {
  int fd = Connect(port);
  const std::string b = body.dump();
  std::string req = "POST " + path +
                    " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                    std::to_string(b.size()) + "\r\n\r\n" + b;
  send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  char buf[4096];
  std::string got;
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (got.find("data: ") == std::string::npos && Clock::now() < deadline) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, size_t(n));
  }
  return fd;
}

TEST(ServerLimits, QueueOverflowAndDisconnect) {
  ServerProcess server({"--parallel", "1", "--queue", "0", "--ctx", "65536"});
  ASSERT_GT(server.port(), 0) << server.log();
  const int p = server.port();
  int fd = OpenStream(p, "/v1/chat/completions", Endless("/v1/chat/completions"));
  ASSERT_GE(fd, 0);
  auto busy = Post(p, "/v1/chat/completions", Chat("hi", 2));
  EXPECT_EQ(busy.status, 429) << busy.body;
  EXPECT_EQ(busy.Header("Retry-After"), "1");
  EXPECT_EQ(busy.Json()["error"]["type"], "rate_limit_error");
  auto abusy = Post(p, "/v1/messages",
                    {{"max_tokens", 2}, {"messages", {{{"role", "user"}, {"content", "x"}}}}});
  EXPECT_EQ(abusy.status, 529) << abusy.body;
  EXPECT_EQ(abusy.Json()["error"]["type"], "overloaded_error");
  {
    const json st0 = Request(p, "GET", "/stats").Json();  // running, or about to be admitted
    EXPECT_EQ(st0["active_slots"].get<int>() + st0["queue_depth"].get<int>(), 1);
  }

  // Hang up mid-stream: the slot is freed and the job counted as cancelled.
  close(fd);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  json st;
  while (Clock::now() < deadline) {
    st = Request(p, "GET", "/stats").Json();
    if (st["active_slots"] == 0 && st["queue_depth"] == 0 && st["jobs"]["cancelled"] == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(st["active_slots"], 0);
  EXPECT_EQ(st["jobs"]["cancelled"], 1);
  EXPECT_EQ(Post(p, "/v1/chat/completions", Chat("hi", 2)).status, 200);

  // More choices than the slots and the queue hold can never run: a 400 on
  // n, not a 429 that an SDK would retry.
  json two = Chat("hi", 2);
  two["n"] = 2;
  auto never = Post(p, "/v1/chat/completions", two);
  EXPECT_EQ(never.status, 400) << never.body;
  EXPECT_EQ(never.Json()["error"]["param"], "n");

  // A non-streaming request whose client hangs up frees its slot too. (The
  // last request's slot is released just after its answer: wait for it, or
  // this one could find the one slot taken and get a 429.)
  for (auto until = Clock::now() + std::chrono::seconds(10); Clock::now() < until;) {
    if (Request(p, "GET", "/stats").Json()["active_slots"] == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  json quiet = Endless("/v1/chat/completions");
  quiet["stream"] = false;
  const int q = Connect(p);
  const std::string qb = quiet.dump();
  const std::string qr =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
      "application/json\r\nContent-Length: " +
      std::to_string(qb.size()) + "\r\n\r\n" + qb;
  ASSERT_EQ(send(q, qr.data(), qr.size(), MSG_NOSIGNAL), ssize_t(qr.size()));
  for (auto until = Clock::now() + std::chrono::seconds(10); Clock::now() < until;) {
    if (Request(p, "GET", "/stats").Json()["active_slots"] == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  close(q);
  for (auto until = Clock::now() + std::chrono::seconds(10); Clock::now() < until;) {
    st = Request(p, "GET", "/stats").Json();
    if (st["active_slots"] == 0 && st["jobs"]["cancelled"] == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(st["active_slots"], 0);
  EXPECT_EQ(st["jobs"]["cancelled"], 2);
  EXPECT_EQ(Post(p, "/v1/chat/completions", Chat("hi", 2)).status, 200);
  EXPECT_EQ(server.Stop(), 0);
}

TEST(ServerLimits, GracefulShutdownEndsStreams) {
  ServerProcess server({"--parallel", "2", "--ctx", "65536"});
  ASSERT_GT(server.port(), 0) << server.log();
  auto f = std::async(std::launch::async, [&] {
    return Post(server.port(), "/v1/chat/completions", Endless("/v1/chat/completions"));
  });
  // Wait until it is generating.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline &&
         Request(server.port(), "GET", "/stats").Json()["active_slots"] != 1)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(server.Stop(), 0) << server.log();
  HttpResponse r = f.get();
  EXPECT_EQ(r.status, 200);
  auto ev = ParseSse(r.body);
  ASSERT_FALSE(ev.empty()) << r.body;
  EXPECT_EQ(ev.back().data, "[DONE]");
}

}  // namespace

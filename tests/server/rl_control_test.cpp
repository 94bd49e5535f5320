// The RL control routes over the fake engine: pause modes, continue, loads,
// weight updates from a directory and from safetensors buckets (JSON with a
// path, or the bytes as the body with options in the query string), the
// weight version everywhere, memory tags, and every bad request a 400.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "io/weight_update.h"
#include "server_fixture.h"

namespace megactx::server::testing {
namespace {

using nlohmann::json;

// One float32 tensor [2] as a safetensors file.
std::string one_tensor_file(const std::string& name) {
  json header = {{name, {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}}};
  std::string text = header.dump();
  while (text.size() % 8) text += ' ';
  std::string out(8, '\0');
  const uint64_t length = text.size();
  std::memcpy(out.data(), &length, 8);
  const float values[2] = {1.5f, -2.0f};
  return out + text + std::string(reinterpret_cast<const char*>(values), 8);
}

TEST(RlControl, PauseModesContinueAndLoads) {
  ServerFixture f;
  for (const char* mode : {"abort", "retract", "in_place"}) {
    auto r = f.call("POST", "/pause_generation", {{"mode", mode}});
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_TRUE(r->json()["success"].get<bool>());
  }
  EXPECT_EQ(f.call("POST", "/pause_generation")->status, 200);  // SGLang's default: abort
  EXPECT_EQ(f.engine.pauses(), (std::vector<PauseMode>{PauseMode::Abort, PauseMode::Retract,
                                                       PauseMode::InPlace, PauseMode::Abort}));
  json loads = f.call("GET", "/v1/loads")->json();
  EXPECT_EQ(loads["num_running_reqs"], 1);
  EXPECT_EQ(loads["num_reqs"], 1);
  EXPECT_EQ(loads["paused"], true);
  EXPECT_EQ(loads["loads"][0]["dp_rank"], 0);
  EXPECT_DOUBLE_EQ(loads["token_usage"].get<double>(), 0.07);
  EXPECT_EQ(f.call("POST", "/continue_generation")->status, 200);
  EXPECT_FALSE(f.call("GET", "/v1/loads")->json()["paused"].get<bool>());
  auto bad = f.call("POST", "/pause_generation", {{"mode", "sideways"}});
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(bad->json()["error"]["param"], "mode");
}

TEST(RlControl, WeightUpdatesAndVersions) {
  ServerFixture f;
  EXPECT_EQ(f.call("GET", "/get_weight_version")->json()["weight_version"], "default");
  auto r =
      f.call("POST", "/update_weights_from_disk",
             {{"model_path", "/models/next"}, {"weight_version", "v2"}, {"flush_cache", false}});
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_TRUE(r->json()["success"].get<bool>());
  EXPECT_EQ(r->json()["weight_version"], "v2");
  auto update = f.engine.weight_updates().back();
  EXPECT_EQ(update.model_path, "/models/next");
  EXPECT_FALSE(update.flush_cache);
  EXPECT_EQ(f.call("GET", "/get_weight_version")->json()["weight_version"], "v2");
  EXPECT_EQ(f.call("GET", "/get_model_info")->json()["weight_version"], "v2");
  EXPECT_EQ(f.call("GET", "/get_server_info")->json()["weight_version"], "v2");
  json generated = f.call("POST", "/generate", {{"text", "a"}})->json();
  EXPECT_EQ(generated["meta_info"]["weight_version"], "v2");

  // A failure: success false beside the error object, status 400.
  auto failed = f.call("POST", "/update_weights_from_disk", {{"model_path", "bad"}});
  EXPECT_EQ(failed->status, 400);
  EXPECT_FALSE(failed->json()["success"].get<bool>());
  EXPECT_NE(failed->json()["message"].get<std::string>().find("'x'"), std::string::npos);
  EXPECT_EQ(f.call("POST", "/update_weights_from_disk", json::object())->status, 400);
  EXPECT_EQ(
      f.call("POST", "/update_weights_from_disk", {{"model_path", "/m"}, {"load_format", "pt"}})
          ->status,
      400);

  // A bucket as the body: options in the query string.
  auto body =
      f.start("POST", "/update_weights_from_safetensors?commit=false&weight_version=v3",
              one_tensor_file("model.norm.weight"), {{"content-type", "application/octet-stream"}});
  ASSERT_TRUE(body->wait());
  ASSERT_EQ(body->status, 200) << body->body;
  update = f.engine.weight_updates().back();
  EXPECT_FALSE(update.commit);
  EXPECT_EQ(update.weight_version, "v3");
  ASSERT_NE(update.bucket, nullptr);
  EXPECT_EQ(update.bucket->tensors().at("model.norm.weight").data<float>()[1], -2.0f);
  // A bucket as a file.
  const std::string path = std::string(MEGACTX_BINARY_DIR) + "/rl_control_bucket.safetensors";
  std::ofstream(path, std::ios::binary) << one_tensor_file("lm_head.weight");
  auto file = f.call("POST", "/update_weights_from_safetensors", {{"path", path}},
                     {{"content-type", "application/json"}});
  ASSERT_EQ(file->status, 200) << file->body;
  EXPECT_TRUE(f.engine.weight_updates().back().commit);
  EXPECT_EQ(f.engine.weight_updates().back().bucket->tensors().count("lm_head.weight"), 1u);
  // Broken buckets never reach the engine, and say so as every failed update
  // does: success false and the message beside the error object.
  const size_t updates = f.engine.weight_updates().size();
  auto refused = [](const RecordingChannel& response, const std::string& param) {
    EXPECT_EQ(response.status, 400) << response.body;
    const json answer = response.json();
    EXPECT_FALSE(answer["success"].get<bool>()) << response.body;
    EXPECT_EQ(answer["message"], answer["error"]["message"]);
    if (param.empty())
      EXPECT_TRUE(answer["error"]["param"].is_null()) << response.body;
    else
      EXPECT_EQ(answer["error"]["param"], param) << response.body;
  };
  auto garbage = f.start("POST", "/update_weights_from_safetensors", "not a safetensors file",
                         {{"content-type", "application/octet-stream"}});
  ASSERT_TRUE(garbage->wait());
  refused(*garbage, "");
  refused(*f.call("POST", "/update_weights_from_safetensors", {{"path", "/nonexistent"}},
                  {{"content-type", "application/json"}}),
          "path");
  refused(*f.call("POST", "/update_weights_from_safetensors", json::object(),
                  {{"content-type", "application/json"}}),
          "path");
  auto query = f.start("POST", "/update_weights_from_safetensors?commit=maybe",
                       one_tensor_file("x"), {{"content-type", "application/octet-stream"}});
  ASSERT_TRUE(query->wait());
  refused(*query, "commit");
  refused(*f.call("POST", "/update_weights_from_disk", json::object()), "model_path");
  refused(*f.call("POST", "/pause_generation", {{"mode", "sideways"}}), "mode");
  refused(*f.call("POST", "/release_memory_occupation", {{"tags", {"gpu"}}}), "tags");
  EXPECT_EQ(f.engine.weight_updates().size(), updates);
}

// SGLang's NCCL and CUDA-IPC weight transports are not served: each route
// answers 501 with success false and a message naming the transports that are.
// The tensor transport's requests are checked before the reader opens
// anything (the payloads themselves: tests/e2e/trainer_loop_test.py).
TEST(RlControl, TensorUpdateRequestsAreCheckedFirst) {
  ServerFixture f;  // one rank
  auto refused = [&](json body, const std::string& param, const std::string& words) {
    auto r = f.call("POST", "/update_weights_from_tensor", body);
    EXPECT_EQ(r->status, 400) << r->body;
    const json answer = r->json();
    EXPECT_FALSE(answer["success"].get<bool>()) << r->body;
    EXPECT_EQ(answer["error"]["param"], param) << r->body;
    EXPECT_NE(answer["message"].get<std::string>().find(words), std::string::npos) << r->body;
  };
  refused(json::object(), "serialized_named_tensors", "a list of 1 base64 string");
  refused({{"serialized_named_tensors", {"a", "b"}}}, "serialized_named_tensors", "one per rank");
  refused({{"serialized_named_tensors", {7}}}, "serialized_named_tensors", "base64");
  refused({{"serialized_named_tensors", {"AAAA"}}, {"load_format", "npz"}}, "load_format",
          "flattened_bucket");
  EXPECT_TRUE(f.engine.weight_updates().empty());
}

// The NCCL transport's requests are checked before any group member starts
// (the group itself, with a torch trainer: tests/e2e/trainer_loop_test.py).
TEST(RlControl, WeightGroupRequestsAreCheckedFirst) {
  ServerFixture f;  // a CPU server of one rank
  const json good = {{"master_address", "127.0.0.1"},
                     {"master_port", 29500},
                     {"rank_offset", 1},
                     {"world_size", 2},
                     {"group_name", "g"},
                     {"backend", "gloo"}};
  auto refused = [&](const std::string& path, json body, const std::string& param,
                     const std::string& words) {
    auto r = f.call("POST", path, body);
    EXPECT_EQ(r->status, 400) << path << ": " << r->body;
    const json answer = r->json();
    EXPECT_FALSE(answer["success"].get<bool>()) << r->body;
    EXPECT_EQ(answer["error"]["param"], param) << r->body;
    EXPECT_NE(answer["message"].get<std::string>().find(words), std::string::npos) << r->body;
  };
  auto with = [&](const std::string& field, json value) {
    json body = good;
    if (value.is_null())
      body.erase(field);
    else
      body[field] = value;
    return body;
  };
  const std::string init = "/init_weights_update_group";
  refused(init, with("master_address", nullptr), "master_address", "master_address");
  refused(init, with("master_port", 70000), "master_port", "port number");
  refused(init, with("master_port", "x"), "master_port", "integer");
  refused(init, with("rank_offset", 0), "rank_offset", "rank 0 is the trainer");
  refused(init, with("world_size", 1), "world_size", "no room");
  refused(init, with("backend", "mpi"), "backend", "nccl or gloo");
  refused(init, with("backend", nullptr), "backend", "NCCL needs GPUs");  // nccl by default
  refused(init, with("group_name", ""), "group_name", "empty");

  const std::string update = "/update_weights_from_distributed";
  const json tensors = {{"names", {"model.norm.weight"}},
                        {"dtypes", {"float32"}},
                        {"shapes", {{4}}},
                        {"group_name", "g"}};
  refused(update, tensors, "group_name", "init_weights_update_group first");
  json body = tensors;
  body["dtypes"] = {"int64"};
  refused(update, body, "dtypes", "'int64'");
  body = tensors;
  body["shapes"] = json::array();
  refused(update, body, "names", "one entry per tensor");
  body = tensors;
  body["shapes"] = {{-4}};
  refused(update, body, "shapes", "sizes of 0 or more");
  body = tensors;
  body["load_format"] = "npz";
  refused(update, body, "load_format", "flattened_bucket");
  body = tensors;
  body.erase("names");
  refused(update, body, "names", "give 'names'");
  refused("/destroy_weights_update_group", {{"group_name", "g"}}, "group_name",
          "no weight-update group named 'g'");
  EXPECT_TRUE(f.engine.weight_updates().empty());  // nothing reached the engine
}

TEST(RlControl, UpdateWeightVersionNamesTheWeightsServed) {
  ServerFixture f;
  auto r = f.call("POST", "/update_weight_version", {{"new_version", "step-7"}});
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_TRUE(r->json()["success"].get<bool>());
  EXPECT_EQ(r->json()["new_version"], "step-7");
  EXPECT_EQ(f.call("GET", "/get_weight_version")->json()["weight_version"], "step-7");
  EXPECT_TRUE(f.engine.weight_updates().empty());  // the weights were not touched
  auto bad = f.call("POST", "/update_weight_version", json::object());
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(bad->json()["error"]["param"], "new_version");
  EXPECT_FALSE(bad->json()["success"].get<bool>());
}

TEST(RlControl, GetWeightsByNameAnswersTheFirstRows) {
  ServerFixture f;
  auto r = f.call("POST", "/get_weights_by_name", {{"name", "w"}, {"truncate_size", 1}});
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->json(), json::parse("[[0.0, 1.0, 2.0]]"));
  r = f.call("POST", "/get_weights_by_name", {{"name", "w"}});
  EXPECT_EQ(r->json(), json::parse("[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]"));
  auto unknown = f.call("POST", "/get_weights_by_name", {{"name", "nope"}});
  EXPECT_EQ(unknown->status, 400);
  EXPECT_NE(unknown->json()["message"].get<std::string>().find("'nope'"), std::string::npos);
  EXPECT_EQ(f.call("POST", "/get_weights_by_name", json::object())->status, 400);
  EXPECT_EQ(f.call("POST", "/get_weights_by_name", {{"name", "w"}, {"truncate_size", 0}})->status,
            400);
}

TEST(RlControl, MemoryTags) {
  ServerFixture f;
  EXPECT_EQ(f.call("POST", "/release_memory_occupation", {{"tags", {"kv_cache"}}})->status, 200);
  EXPECT_EQ(f.call("POST", "/release_memory_occupation")->status, 200);  // both
  EXPECT_EQ(f.call("POST", "/resume_memory_occupation", {{"tags", {"weights"}}})->status, 200);
  EXPECT_EQ(f.engine.released(), (std::vector<std::pair<bool, bool>>{{false, true}, {true, true}}));
  EXPECT_EQ(f.engine.resumed(), (std::vector<std::pair<bool, bool>>{{true, false}}));
  auto bad = f.call("POST", "/release_memory_occupation", {{"tags", {"gpu"}}});
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(bad->json()["error"]["param"], "tags");
}

}  // namespace
}  // namespace megactx::server::testing

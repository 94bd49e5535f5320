// Checkpoint over mmapped safetensors files: one model.safetensors, or the
// shards named by model.safetensors.index.json ({"weight_map": {tensor: file}}).
#include "io/checkpoint.h"

#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/progress_bar.h"
#include "io/bounded_json.h"
#include "io/json_fields.h"
#include "io/safetensors.h"

namespace megactx {

namespace {

namespace fs = std::filesystem;

std::string read_text_file(const std::string& path) {
  std::error_code ignored;
  MEGACTX_CHECK(fs::is_regular_file(path, ignored), "cannot read {}: no such file", path);
  std::ifstream file(path, std::ios::binary);
  MEGACTX_CHECK(file.good(), "cannot read {}", path);
  std::stringstream buffer;
  buffer << file.rdbuf();
  return buffer.str();
}

// weight_map of model.safetensors.index.json: tensor name -> shard file name.
std::map<std::string, std::string> read_weight_map(const std::string& path) {
  nlohmann::json index;
  try {
    index = parse_json(read_text_file(path));
  } catch (const nlohmann::json::exception& error) {
    fail("{} is not valid JSON: {}", path, error.what());
  }
  MEGACTX_CHECK(
      index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
      "{}: field 'weight_map' missing or not an object", path);
  std::map<std::string, std::string> weight_map;
  for (const auto& [name, file] : index["weight_map"].items()) {
    MEGACTX_CHECK(file.is_string(), "{}: weight_map entry '{}' must be a file name", path, name);
    const std::string shard = file.get<std::string>();
    // Shards live beside the index; a path that leaves the directory is refused.
    const fs::path shard_path(shard);
    MEGACTX_CHECK(!shard.empty() && shard_path.is_relative() &&
                      std::none_of(shard_path.begin(), shard_path.end(),
                                   [](const fs::path& part) { return part == ".."; }),
                  "{}: weight_map entry '{}' names an invalid shard '{}'", path, name, shard);
    weight_map[name] = shard;
  }
  return weight_map;
}

class SafetensorsCheckpoint final : public Checkpoint {
 public:
  explicit SafetensorsCheckpoint(const std::string& model_dir)
      : directory_(model_dir), config_(load_model_config(model_dir)) {
    const std::string index_path = model_dir + "/model.safetensors.index.json";
    const std::string single_path = model_dir + "/model.safetensors";
    std::error_code ignored;
    if (fs::exists(index_path, ignored)) {
      open_sharded(index_path);
    } else if (fs::exists(single_path, ignored)) {
      open_files({"model.safetensors"});
      for (size_t i = 0; i < files_[0]->entries().size(); ++i)
        locations_[files_[0]->entries()[i].name] = {0, &files_[0]->entries()[i]};
    } else {
      fail("{}: no model.safetensors or model.safetensors.index.json", model_dir);
    }
  }

  const ModelConfig& config() const override { return config_; }
  const std::string& directory() const override { return directory_; }
  bool has(const std::string& name) const override { return locations_.count(name) > 0; }

  DType dtype_of(const std::string& name) const override { return locate(name).entry->dtype; }
  Shape shape_of(const std::string& name) const override { return locate(name).entry->shape; }

  Tensor get(const std::string& name, const Shape& shape, DType dtype) const override {
    const Location& location = locate(name);
    MEGACTX_CHECK(location.entry->dtype == dtype, "tensor '{}' has dtype {} but {} was expected",
                  name, dtype_name(location.entry->dtype), dtype_name(dtype));
    return checked_view(name, location, shape);
  }

  Tensor get_float(const std::string& name, const Shape& shape) const override {
    const Location& location = locate(name);
    const DType dtype = location.entry->dtype;
    MEGACTX_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16 ||
                      dtype == DType::F8_E4M3,
                  "tensor '{}' has dtype {} but a floating dtype was expected", name,
                  dtype_name(dtype));
    return checked_view(name, location, shape);
  }

  std::vector<std::string> names() const override {
    std::vector<std::string> result;
    for (const auto& [name, unused] : locations_) result.push_back(name);
    return result;
  }

  std::vector<std::string> unrequested() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> result;
    for (const auto& [name, unused] : locations_)
      if (!requested_.count(name)) result.push_back(name);
    return result;
  }

 private:
  struct Location {
    size_t file = 0;
    const SafetensorsEntry* entry = nullptr;
  };

  const Location& locate(const std::string& name) const {
    auto it = locations_.find(name);
    MEGACTX_CHECK(it != locations_.end(), "checkpoint {} has no tensor '{}'", directory_, name);
    return it->second;
  }

  Tensor checked_view(const std::string& name, const Location& location, const Shape& shape) const {
    MEGACTX_CHECK(location.entry->shape == shape, "tensor '{}' has shape {} but {} was expected",
                  name, shape_string(location.entry->shape), shape_string(shape));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      requested_.insert(name);
    }
    return files_[location.file]->view(*location.entry);
  }

  void open_files(const std::vector<std::string>& file_names) {
    uint64_t total = 0;
    std::error_code ignored;
    for (const auto& file_name : file_names) {
      const auto bytes = fs::file_size(directory_ + "/" + file_name, ignored);
      if (bytes != static_cast<uintmax_t>(-1)) total += bytes;
    }
    // Start the page-in now so the first forward pass does not stall on disk,
    // unless the weights would crowd out half of RAM (then the loader's own
    // sequential reads are the better readahead).
    const uint64_t memory = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                            static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const bool prefetch = total <= memory / 2;
    ProgressBar progress("loading " + directory_, total);
    for (const auto& file_name : file_names) {
      files_.push_back(std::make_unique<SafetensorsFile>(directory_ + "/" + file_name));
      if (prefetch) files_.back()->prefetch();
      progress.advance(files_.back()->size());
    }
    progress.finish();
  }

  void open_sharded(const std::string& index_path) {
    const auto weight_map = read_weight_map(index_path);
    std::vector<std::string> shard_names;
    for (const auto& [name, shard] : weight_map)
      if (std::find(shard_names.begin(), shard_names.end(), shard) == shard_names.end())
        shard_names.push_back(shard);
    std::sort(shard_names.begin(), shard_names.end());
    open_files(shard_names);
    std::map<std::string, size_t> shard_position;
    for (size_t i = 0; i < shard_names.size(); ++i) shard_position[shard_names[i]] = i;

    for (const auto& [name, shard] : weight_map) {
      const size_t file = shard_position.at(shard);
      const SafetensorsEntry* entry = files_[file]->find(name);
      MEGACTX_CHECK(entry != nullptr, "{}: tensor '{}' is mapped to {} which does not contain it",
                    index_path, name, shard);
      locations_[name] = {file, entry};
    }
    // Tensors a shard holds but the index does not list are still reachable, once.
    for (size_t file = 0; file < files_.size(); ++file)
      for (const auto& entry : files_[file]->entries()) {
        auto it = locations_.find(entry.name);
        if (it == locations_.end()) {
          locations_[entry.name] = {file, &entry};
        } else {
          MEGACTX_CHECK(it->second.file == file || weight_map.count(entry.name),
                        "{}: tensor '{}' appears in both {} and {}", directory_, entry.name,
                        shard_names[it->second.file], shard_names[file]);
        }
      }
  }

  std::string directory_;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Location> locations_;
  mutable std::mutex mutex_;
  mutable std::set<std::string> requested_;
};

}  // namespace

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& model_dir) {
  std::error_code ignored;
  MEGACTX_CHECK(fs::is_directory(model_dir, ignored), "model directory {} does not exist",
                model_dir);
  return std::make_unique<SafetensorsCheckpoint>(model_dir);
}

}  // namespace megactx

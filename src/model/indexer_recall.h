// The indexer's recall against the dense attention it stands in for, measured
// on the CPU model as it serves (sparse): for a query row at position p, the
// dense attention's probabilities over every visible position [0, p] (each
// head's softmax of the absorbed MLA scores, averaged over the heads), the
// top-k of that mass, and how much of it the row's selection (its layer's
// indexer top-k) holds. Installed as a DsaModel attention probe
// (model/attention_probe.h); `megactx indexer-recall` reports it by prompt
// length. The same definitions as tools/train/evaluate.py's indexer_recall,
// which measures them in a dense PyTorch forward.
#pragma once

#include <cstdint>
#include <vector>

#include "model/attention_probe.h"

namespace megactx {

// The dense attention of row `row` of `view` over positions [0, view.start +
// row]: [heads, visible] probabilities (each head's row sums to 1). entries:
// [>= visible, kv_lora + rope] cached entries by position.
std::vector<float> dense_attention_probabilities(const AttentionProbeLayer& view, int64_t row,
                                                 const float* entries);

class IndexerRecall {
 public:
  // Rows at positions >= first_position with more than index_topk visible
  // positions are measured (a selection of every visible key is trivially whole).
  explicit IndexerRecall(int64_t first_position) : first_position_(first_position) {}

  void observe(const AttentionProbeLayer& view);

  struct Layer {
    int64_t layer = 0;
    int64_t indexer_source = 0;
    int64_t rows = 0;
    double recall = 0.0;  // mean over rows: |selection ∩ dense top-k| / k
    double mass = 0.0;    // mean over rows: dense attention mass inside the selection
  };
  // Measured layers in layer order.
  std::vector<Layer> layers() const;

 private:
  int64_t first_position_;
  std::vector<Layer> sums_;  // by layer, sums until layers()
};

}  // namespace megactx

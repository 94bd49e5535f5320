// Fuzzes the safetensors header parser: any bytes must give a parsed header
// whose every entry lies inside the buffer, or a megactx::Error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const megactx::SafetensorsHeader header =
        megactx::parse_safetensors_header(data, size, "fuzz.safetensors");
    // Touch the first and last byte of every tensor: ASan flags any range outside the input.
    uint8_t sink = 0;
    for (const auto& entry : header.entries) {
      if (entry.end == entry.begin) continue;
      if (header.data_offset + entry.end > size) std::abort();
      sink ^= data[header.data_offset + entry.begin];
      sink ^= data[header.data_offset + entry.end - 1];
    }
    // Keeps the reads from being optimized away.
    asm volatile("" : : "r"(sink));
  } catch (const megactx::Error&) {
  }
  return 0;
}

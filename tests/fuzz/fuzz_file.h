// For fuzz targets whose code under test reads a path: writes the input to a
// file in a per-process temporary folder (tmpfs when /dev/shm exists) and
// returns its path; the file is overwritten by the next input.
#ifndef SLUICE_TESTS_FUZZ_FUZZ_FILE_H_
#define SLUICE_TESTS_FUZZ_FUZZ_FILE_H_

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace sluice::fuzz {

inline std::string WriteInput(const uint8_t* data, size_t size, const std::string& name) {
  static const std::filesystem::path* dir = [] {
    std::filesystem::path base = std::filesystem::exists("/dev/shm")
                                     ? std::filesystem::path("/dev/shm")
                                     : std::filesystem::temp_directory_path();
    auto* d = new std::filesystem::path(base / ("sluice-fuzz-" + std::to_string(getpid())));
    std::filesystem::create_directories(*d);
    return d;
  }();
  const std::string path = (*dir / name).string();
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

}  // namespace sluice::fuzz

#endif  // SLUICE_TESTS_FUZZ_FUZZ_FILE_H_

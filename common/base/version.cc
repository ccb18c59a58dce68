#include "common/base/version.h"

#include "absl/strings/str_cat.h"
#include "common/base/build_version.h"  // generated: SLUICE_VERSION, SLUICE_REVISION

namespace sluice {

const char* Version() { return SLUICE_VERSION; }
const char* Revision() { return SLUICE_REVISION; }

std::string VersionLine(std::string_view program) {
  return absl::StrCat(std::string(program), " ", Version(), " (revision ", Revision(), ")");
}

}  // namespace sluice

// The version every binary reports (--version) and every server exports
// (sluice_build_info{version,revision}): the project() version of CMakeLists.txt and the git
// revision of the tree it was built from ("unknown" outside a git checkout, "+dirty" appended
// when the tree had uncommitted changes). Regenerated on every build (common/base/version.cmake),
// so a rebuild after a commit reports the new revision.
#ifndef SLUICE_COMMON_BASE_VERSION_H_
#define SLUICE_COMMON_BASE_VERSION_H_

#include <string>
#include <string_view>

namespace sluice {

// "0.1.0"
const char* Version();
// "c5dfcc8", "c5dfcc8+dirty" or "unknown".
const char* Revision();
// "PROGRAM 0.1.0 (revision c5dfcc8)": what --version prints.
std::string VersionLine(std::string_view program);

}  // namespace sluice

#endif  // SLUICE_COMMON_BASE_VERSION_H_

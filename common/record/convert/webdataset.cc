// WebDataset input (see convert.h): tars whose members are grouped into samples
// by key.

#include <archive.h>
#include <archive_entry.h>

#include <cerrno>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/record/convert/converters.h"

namespace sluice::record {
namespace {

bool IsTarName(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(std::string(name));
  return absl::EndsWith(lower, ".tar") || absl::EndsWith(lower, ".tar.gz") ||
         absl::EndsWith(lower, ".tgz");
}

bool IsImageExtension(std::string_view ext) {
  return ext == "jpg" || ext == "jpeg" || ext == "png";
}

// Splits a member path into WebDataset's (key, extension). False for members
// that belong to no sample: no '.' in the last component, or a hidden last
// component (".x", "._x.jpg").
bool SplitMemberPath(std::string_view path, std::string_view* key, std::string_view* ext) {
  const size_t slash = path.rfind('/');
  const size_t base = slash == std::string_view::npos ? 0 : slash + 1;
  const size_t dot = path.find('.', base);
  if (dot == std::string_view::npos || dot == base) return false;
  *key = path.substr(0, dot);
  *ext = path.substr(dot + 1);
  return true;
}

// Reads one tar's samples, in tar order. Not thread-safe; one per source run.
class TarReader {
 public:
  TarReader(std::string path, const SampleSink& sink) : path_(std::move(path)), sink_(sink) {}
  ~TarReader() {
    if (archive_ != nullptr) archive_read_free(archive_);
  }

  absl::Status Run() {
    archive_ = archive_read_new();
    if (archive_ == nullptr) return absl::ResourceExhaustedError("archive_read_new failed");
    archive_read_support_filter_all(archive_);
    archive_read_support_format_tar(archive_);
    if (archive_read_open_filename(archive_, path_.c_str(), 1 << 20) != ARCHIVE_OK) {
      const int err = archive_errno(archive_);
      return absl::ErrnoToStatus(err > 0 ? err : EINVAL,
                                 absl::StrCat("cannot open tar ", path_, ": ", Error()));
    }
    for (uint64_t members = 0;; ++members) {
      archive_entry* entry = nullptr;
      const int r = archive_read_next_header(archive_, &entry);
      if (r == ARCHIVE_EOF) break;
      if (r < ARCHIVE_WARN) {
        // A bad first header means this is no tar at all; a later one, a
        // damaged tar.
        if (members == 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("tar ", path_, " is not a readable tar archive: ", Error()));
        }
        return absl::DataLossError(
            absl::StrCat("tar ", path_, ": corrupt after member ", members, ": ", Error()));
      }
      if (archive_entry_filetype(entry) != AE_IFREG) continue;
      const char* raw_path = archive_entry_pathname(entry);
      if (raw_path == nullptr) continue;
      std::string_view member(raw_path);
      if (member.starts_with("./")) member.remove_prefix(2);
      std::string_view key, ext;
      if (!SplitMemberPath(member, &key, &ext)) continue;
      RETURN_IF_ERROR(AddMember(std::string(member), std::string(key),
                                absl::AsciiStrToLower(std::string(ext))));
    }
    return Flush();
  }

 private:
  std::string Error() const {
    const char* message = archive_error_string(archive_);
    return message != nullptr ? message : "unknown libarchive error";
  }

  absl::Status AddMember(const std::string& member, std::string key, const std::string& ext) {
    if (key != key_) {
      RETURN_IF_ERROR(Flush());
      if (!seen_.insert(key).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("tar ", path_, ": the members of sample \"", key,
                         "\" are not contiguous; WebDataset needs each "
                         "sample's files together"));
      }
      key_ = std::move(key);
    }
    if (IsImageExtension(ext)) {
      if (!image_member_.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("tar ", path_, ": sample \"", key_,
                                                       "\" has two images, ", image_member_,
                                                       " and ", member));
      }
      image_member_ = member;
      ASSIGN_OR_RETURN(image_, ReadData(member));
      if (!HasImageSignature(image_)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tar ", path_, ": member ", member, " of sample \"", key_, "\" is not a JPEG or PNG"));
      }
    } else if (ext == "cls") {
      ASSIGN_OR_RETURN(const std::string text, ReadData(member));
      int64_t label;
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &label)) {
        return absl::InvalidArgumentError(
            absl::StrCat("tar ", path_, ": member ", member, " of sample \"", key_,
                         "\" must hold an integer class label, holds \"",
                         absl::CHexEscape(text.substr(0, 32)), text.size() > 32 ? "...\"" : "\""));
      }
      label_ = label;
    }
    return absl::OkStatus();
  }

  // Hands the pending sample (if any) to the sink.
  absl::Status Flush() {
    if (key_.empty()) return absl::OkStatus();
    if (image_member_.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tar ", path_, ": sample \"", key_, "\" has no image (.jpg, .jpeg or .png member)"));
    }
    if (!label_.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tar ", path_, ": sample \"", key_, "\" has no label (.cls member)"));
    }
    RETURN_IF_ERROR(sink_(Sample{std::move(image_), *label_, key_}));
    key_.clear();
    image_.clear();
    image_member_.clear();
    label_.reset();
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> ReadData(const std::string& member) {
    std::string data;
    char buffer[1 << 16];
    for (;;) {
      const la_ssize_t got = archive_read_data(archive_, buffer, sizeof buffer);
      if (got == 0) return data;
      if (got < 0) {
        return absl::DataLossError(
            absl::StrCat("tar ", path_, ": cannot read member ", member, ": ", Error()));
      }
      data.append(buffer, static_cast<size_t>(got));
    }
  }

  const std::string path_;
  const SampleSink& sink_;
  archive* archive_ = nullptr;
  absl::flat_hash_set<std::string> seen_;
  // The sample being assembled.
  std::string key_;
  std::string image_member_;
  std::string image_;
  std::optional<int64_t> label_;
};

}  // namespace

absl::StatusOr<ConversionPlan> PlanWebDataset(const std::string& input) {
  ASSIGN_OR_RETURN(std::vector<std::string> tars, ListInputFiles(input, IsTarName));
  if (tars.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("input folder ", input, " holds no .tar, .tar.gz or .tgz files"));
  }
  ConversionPlan plan;
  for (std::string& tar : tars) {
    plan.sources.push_back(
        [tar = std::move(tar)](const SampleSink& sink) { return TarReader(tar, sink).Run(); });
  }
  return plan;
}

}  // namespace sluice::record

// sluice datagen --output DIR --images N [--classes K] [--seed S] [--threads T]
#include <thread>

#include "tools/cli/command.h"
#include "tools/cli/progress.h"
#include "tools/datagen/datagen.h"

namespace sluice::cli {

void AddDatagenCommand(CLI::App& app) {
  auto options = std::make_shared<tools::DatagenOptions>();
  options->threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  CLI::App* cmd = app.add_subcommand("datagen",
                                     "Write an ImageFolder tree of synthetic "
                                     "ImageNet-like JPEGs (class_*/img_*.jpg)");
  cmd->add_option("--output", options->output, "Folder to create (must not exist or be empty)")
      ->required();
  cmd->add_option("--images", options->images, "Number of images")->required();
  cmd->add_option("--classes", options->classes, "Number of classes")->capture_default_str();
  cmd->add_option("--seed", options->seed, "Seed; the same seed gives the same bytes")
      ->capture_default_str();
  cmd->add_option("--threads", options->threads, "Encoder threads")->capture_default_str();
  cmd->callback([options] {
    ProgressBar bar("datagen", options->images);
    options->progress = [&bar](uint64_t done, uint64_t total) { bar.Update(done, total); };
    const absl::Status status = tools::GenerateImageFolder(*options);
    options->progress = nullptr;
    if (status.ok()) bar.Done();
    Finish(status);
  });
}

}  // namespace sluice::cli

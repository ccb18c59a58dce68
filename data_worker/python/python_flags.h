// The python op's flags, defined once for sluice-worker, `sluice pipeline run`
// and `sluice local` (which hands them to its workers): docs/python.md.
//
//   PythonOptions python;
//   AddPythonFlags(app, &python);
//   CLI11_PARSE(app, argc, argv);
//   ConfigurePython(python);
#ifndef SLUICE_DATA_WORKER_PYTHON_PYTHON_FLAGS_H_
#define SLUICE_DATA_WORKER_PYTHON_PYTHON_FLAGS_H_

#include <filesystem>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/base/duration_flag.h"
#include "data_worker/python/python_pool.h"

namespace sluice::data_worker::python {

inline void AddPythonFlags(CLI::App& app, PythonOptions* options) {
  app.add_flag("--allow-python-ops", options->allow,
               "Run pipelines' python ops (user functions named by module and function, "
               "imported from the worker's image or --python-path; never code sent by a "
               "client). Off: such pipelines are refused");
  app.add_option("--python-path", options->python_path,
                 "Folder searched for the python ops' modules, before the image's packages "
                 "(repeatable)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--python-modules", options->modules,
                 "The only modules python ops may name, each with its submodules "
                 "(comma-separated or repeated; default: any module the worker can import, "
                 "the standard library's included)")
      ->delimiter(',');
  AddDurationOption(app, "--python-op-timeout", &options->timeout,
                    "A python op call that takes longer is killed and redone on a fresh "
                    "process, like a crash (0: no limit)");
}

// The sluice-worker flags that give a worker `options` (sluice local's workers).
inline std::vector<std::string> PythonWorkerFlags(const PythonOptions& options) {
  std::vector<std::string> flags;
  if (options.allow) flags.push_back("--allow-python-ops");
  for (const std::string& path : options.python_path) {
    flags.insert(flags.end(), {"--python-path", std::filesystem::absolute(path).string()});
  }
  if (!options.modules.empty()) {
    flags.insert(flags.end(), {"--python-modules", absl::StrJoin(options.modules, ",")});
  }
  flags.insert(flags.end(), {"--python-op-timeout", absl::FormatDuration(options.timeout)});
  return flags;
}

}  // namespace sluice::data_worker::python

#endif  // SLUICE_DATA_WORKER_PYTHON_PYTHON_FLAGS_H_

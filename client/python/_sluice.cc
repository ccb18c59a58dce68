// sluice._sluice: the pybind11 extension under the Python package `sluice`
// (client/python/sluice, docs/python.md). It is thin on purpose: it turns
// Python arguments into ClientOptions/JobOptions, absl::Status into the
// sluice.Error subclass of its code (sluice/errors.py), and batches into numpy
// arrays over the C++ buffers. The public API (types, docstrings, state dicts,
// the pipeline builder) is Python.
//
// Zero copy: each numeric column becomes an ndarray whose data pointer is the
// column's bytes and whose base is a PyCapsule holding a heap copy of the
// column's owner (a std::shared_ptr<void>), so the C++ buffer lives exactly as
// long as the last array (or torch tensor made by torch.from_numpy) over it.
//
// GIL: released while the client connects, while GetNext() waits for a batch,
// and while an iterator is closed (its destructor joins its threads).
//
// Warnings: the C++ client's warnings and errors (a job that had already read
// all its epochs, a failed heartbeat, ...) go to Python's logging, logger
// "sluice". The client logs from its own threads, which must not take the GIL,
// so they are kept in a ClientWarnings sink and handed to Python after open()
// and after each next().
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <spdlog/logger.h>
#include <spdlog/sinks/base_sink.h>

#include <cstdint>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/pipeline_spec/parse.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"
#include "proto/ops.pb.h"
#include "sluice/client.h"

namespace py = pybind11;

namespace sluice::python {
namespace {

// Raises the sluice.Error subclass of status.code() with status.message().
// REQUIRES: the GIL is held; !status.ok().
[[noreturn]] void ThrowStatus(const absl::Status& status) {
  py::object error =
      py::module_::import("sluice.errors")
          .attr("from_status")(static_cast<int>(status.code()), std::string(status.message()));
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  throw py::error_already_set();
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> result) {
  if (!result.ok()) ThrowStatus(result.status());
  return *std::move(result);
}

// YAML/JSON text (or a file holding it) → Pipeline; `data`, when not empty,
// replaces the source with that Unirecord dataset folder.
absl::StatusOr<proto::Pipeline> ToPipeline(const std::string& spec, bool is_file,
                                           const std::string& data) {
  absl::StatusOr<proto::Pipeline> pipeline = is_file
                                                 ? sluice::pipeline_spec::LoadPipelineSpecFile(spec)
                                                 : sluice::pipeline_spec::ParsePipelineSpec(spec);
  if (!pipeline.ok()) return pipeline.status();
  if (!data.empty()) {
    std::error_code ec;
    std::filesystem::path path = std::filesystem::absolute(data, ec);
    if (ec) return absl::InvalidArgumentError("data: bad path '" + data + "'");
    pipeline->mutable_source()->mutable_dataset()->set_path(path.string());
  }
  return pipeline;
}

// The numpy dtype of a numeric column, or nullopt for bytes/string columns.
std::optional<py::dtype> NumpyDType(DType dtype) {
  switch (dtype) {
    case DType::kUint8:
      return py::dtype::of<uint8_t>();
    case DType::kInt32:
      return py::dtype::of<int32_t>();
    case DType::kInt64:
      return py::dtype::of<int64_t>();
    case DType::kFloat16:
      return py::dtype("float16");
    case DType::kFloat32:
      return py::dtype::of<float>();
    case DType::kBytes:
    case DType::kString:
      return std::nullopt;
  }
  return std::nullopt;
}

void DeleteOwner(void* owner) { delete static_cast<std::shared_ptr<void>*>(owner); }

// A batch taken from the C++ iterator, ready to become Python objects.
struct HeldColumn {
  std::string name;
  std::optional<py::dtype> dtype;  // nullopt: bytes/string
  bool is_string = false;
  std::vector<int64_t> shape;
  uint8_t* data = nullptr;
  size_t size = 0;
  std::shared_ptr<void> owner;
};

// Batch → columns over buffers that their `owner`s keep alive.
std::vector<HeldColumn> HoldColumns(Batch batch) {
  std::vector<HeldColumn> held;
  held.reserve(batch.columns.size());
  for (Column& c : batch.columns) {
    held.push_back({.name = std::move(c.name),
                    .dtype = NumpyDType(c.dtype),
                    .is_string = c.dtype == DType::kString,
                    .shape = std::move(c.shape),
                    .data = c.data,
                    .size = c.size,
                    .owner = std::move(c.owner)});
  }
  return held;
}

// One column as a Python object: an ndarray over the C++ bytes for numeric
// columns, `bytes`/`str` (copied) for the opaque ones.
py::object ColumnToPython(const HeldColumn& c) {
  if (!c.dtype) {
    const char* p = reinterpret_cast<const char*>(c.data);
    if (c.is_string) return py::str(p, c.size);
    return py::bytes(p, c.size);
  }
  size_t elements = 1;
  for (int64_t d : c.shape) {
    if (d < 0) {
      ThrowStatus(
          absl::DataLossError(absl::StrCat("column '", c.name, "': negative dimension in shape [",
                                           absl::StrJoin(c.shape, ", "), "]")));
    }
    elements *= static_cast<size_t>(d);
  }
  const size_t itemsize = static_cast<size_t>(c.dtype->itemsize());
  if (elements * itemsize != c.size) {
    ThrowStatus(absl::DataLossError(absl::StrCat("column '", c.name, "': ", c.size,
                                                 " bytes for shape [", absl::StrJoin(c.shape, ", "),
                                                 "] of ", itemsize, "-byte elements")));
  }
  py::capsule base(new std::shared_ptr<void>(c.owner), &DeleteOwner);
  return py::array(*c.dtype, c.shape, c.data, base);
}

// ClientOptions gains TLS fields (tls_ca, tls_cert, tls_key, auth_token_file);
// until then a `tls` argument is Unimplemented. Compiles with and without them.
template <typename O>
absl::Status SetTls(O& options, const py::dict& tls) {
  auto get = [&](const char* key) {
    return tls.contains(key) && !tls[key].is_none() ? tls[key].cast<std::string>() : std::string();
  };
  if constexpr (requires {
                  options.tls_ca;
                  options.tls_cert;
                  options.tls_key;
                  options.auth_token_file;
                }) {
    options.tls_ca = get("ca");
    options.tls_cert = get("cert");
    options.tls_key = get("key");
    options.auth_token_file = get("token_file");
    if constexpr (requires { options.tls_server_name; }) {
      options.tls_server_name = get("server_name");
    }
    return absl::OkStatus();
  } else {
    (void)get;
    return absl::UnimplementedError(
        "this build's C++ client has no TLS support (ClientOptions::tls_*)");
  }
}

// The client's log lines at warn and above, kept until a Python call can hand
// them to logging.getLogger("sluice"). At most kMostKept wait; older ones are
// dropped and counted in the next line handed over.
class ClientWarnings : public spdlog::sinks::base_sink<std::mutex> {
 public:
  static constexpr size_t kMostKept = 100;

  // Logs what is kept at WARNING (warn) or ERROR (err and above). Needs the GIL.
  // Never raises: a logging filter or handler that raises is reported as
  // unraisable (sys.unraisablehook), so the batch beside the warnings is kept.
  void HandToPython() {
    std::deque<std::pair<spdlog::level::level_enum, std::string>> kept;
    size_t dropped;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      kept.swap(kept_);
      dropped = std::exchange(dropped_, 0);
    }
    if (kept.empty()) return;
    try {
      py::object logger = py::module_::import("logging").attr("getLogger")("sluice");
      if (dropped > 0) {
        logger.attr("warning")(absl::StrCat("sluice client: ", dropped,
                                            " earlier warnings were dropped (more than ", kMostKept,
                                            " between two calls)"));
      }
      for (auto& [level, message] : kept) {
        logger.attr(level >= spdlog::level::err ? "error" : "warning")(message);
      }
    } catch (py::error_already_set& e) {
      e.discard_as_unraisable("sluice: logging the client's warnings");
    }
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (kept_.size() == kMostKept) {
      kept_.pop_front();
      ++dropped_;
    }
    kept_.emplace_back(msg.level, std::string(msg.payload.data(), msg.payload.size()));
  }
  void flush_() override {}

 private:
  std::deque<std::pair<spdlog::level::level_enum, std::string>> kept_;
  size_t dropped_ = 0;
};

// Python's sluice._sluice.Client: one DataServiceClient, shared by the
// iterators it opened (they keep it alive).
class PyClient {
 public:
  PyClient(std::shared_ptr<DataServiceClient> client, std::shared_ptr<ClientWarnings> warnings)
      : client_(std::move(client)), warnings_(std::move(warnings)) {}
  const std::shared_ptr<DataServiceClient>& client() const { return client_; }
  const std::shared_ptr<ClientWarnings>& warnings() const { return warnings_; }

 private:
  std::shared_ptr<DataServiceClient> client_;
  std::shared_ptr<ClientWarnings> warnings_;
};

// Python's sluice._sluice.Iterator. Not thread-safe (like the Python iterator
// protocol): one thread calls next() at a time.
class PyIterator {
 public:
  PyIterator(std::shared_ptr<DataServiceClient> client, std::shared_ptr<ClientWarnings> warnings,
             std::unique_ptr<BatchIterator> it)
      : client_(std::move(client)), warnings_(std::move(warnings)), it_(std::move(it)) {}
  ~PyIterator() { Close(); }

  // dict {column: array, "index": int64 array}, or None when all epochs are
  // done.
  py::object Next() {
    BatchIterator* it = Live();
    absl::StatusOr<std::optional<Batch>> next;
    {
      py::gil_scoped_release release;
      next = it->GetNext();
    }
    warnings_->HandToPython();
    if (!next.ok()) ThrowStatus(next.status());
    if (!next->has_value()) return py::none();
    Batch& batch = **next;
    epoch_ = batch.epoch;
    position_ = batch.position;
    split_id_ = batch.split_id;
    batch_index_ = batch.batch_index;
    py::array_t<int64_t> index(static_cast<py::ssize_t>(batch.global_indices.size()));
    int64_t* out = index.mutable_data();
    for (size_t i = 0; i < batch.global_indices.size(); ++i) {
      out[i] = static_cast<int64_t>(batch.global_indices[i]);
    }
    std::vector<HeldColumn> columns = HoldColumns(std::move(batch));
    py::dict result;
    last_addresses_ = py::dict();
    for (const HeldColumn& c : columns) {
      result[py::str(c.name)] = ColumnToPython(c);
      last_addresses_[py::str(c.name)] = py::int_(reinterpret_cast<uintptr_t>(c.data));
    }
    result["index"] = std::move(index);
    return result;
  }

  py::bytes SaveState() {
    BatchIterator* it = Live();
    absl::StatusOr<std::string> state;
    {
      py::gil_scoped_release release;
      state = it->SaveState();
    }
    return py::bytes(ValueOrThrow(std::move(state)));
  }

  void Close() {
    if (it_ == nullptr) return;
    std::unique_ptr<BatchIterator> it = std::move(it_);
    if (PyGILState_Check()) {
      py::gil_scoped_release release;
      it.reset();
    } else {
      it.reset();
    }
  }

  uint64_t epoch() { return Live()->epoch(); }
  double wait_seconds() { return Live()->wait_seconds(); }
  int buffered_batches() { return Live()->buffered_batches(); }
  uint64_t duplicate_batches() { return Live()->duplicate_batches(); }
  uint64_t job_id() { return Live()->job_id(); }
  py::dict last_batch_info() const {
    py::dict info;
    info["epoch"] = epoch_;
    info["position"] = position_;
    info["split_id"] = split_id_;
    info["batch_index"] = batch_index_;
    return info;
  }
  py::dict last_addresses() const { return last_addresses_; }

 private:
  BatchIterator* Live() {
    if (it_ == nullptr) {
      ThrowStatus(absl::FailedPreconditionError("the iterator is closed"));
    }
    return it_.get();
  }

  std::shared_ptr<DataServiceClient> client_;
  std::shared_ptr<ClientWarnings> warnings_;
  std::unique_ptr<BatchIterator> it_;
  uint64_t epoch_ = 0, position_ = 0, split_id_ = 0, batch_index_ = 0;
  py::dict last_addresses_;
};

std::unique_ptr<PyClient> CreateClient(const std::string& dispatcher, double timeout_seconds,
                                       const py::dict& tls, double dispatcher_lost_timeout_seconds,
                                       uint64_t shared_memory_mb) {
  ClientOptions options;
  options.dispatcher_address = dispatcher;
  options.shared_memory_bytes = shared_memory_mb << 20;
  if (timeout_seconds <= 0) {
    ThrowStatus(absl::InvalidArgumentError(
        absl::StrCat("timeout must be > 0 seconds, got ", timeout_seconds)));
  }
  if (dispatcher_lost_timeout_seconds <= 0) {
    ThrowStatus(absl::InvalidArgumentError(absl::StrCat(
        "dispatcher_lost_timeout must be > 0 seconds, got ", dispatcher_lost_timeout_seconds)));
  }
  options.dispatcher_lost_timeout = absl::Seconds(dispatcher_lost_timeout_seconds);
  options.rpc_timeout = absl::Seconds(timeout_seconds);
  options.connect_timeout = absl::Seconds(timeout_seconds);
  if (!tls.empty()) {
    absl::Status status = SetTls(options, tls);
    if (!status.ok()) ThrowStatus(status);
  }
  auto warnings = std::make_shared<ClientWarnings>();
  options.logger = std::make_shared<spdlog::logger>("sluice", warnings);
  options.logger->set_level(spdlog::level::warn);
  absl::StatusOr<std::unique_ptr<DataServiceClient>> client;
  {
    py::gil_scoped_release release;
    client = DataServiceClient::Create(std::move(options));
  }
  warnings->HandToPython();
  return std::make_unique<PyClient>(
      std::shared_ptr<DataServiceClient>(ValueOrThrow(std::move(client))), std::move(warnings));
}

std::unique_ptr<PyIterator> Open(PyClient& client, const std::string& spec, bool spec_is_file,
                                 const std::string& data, const std::string& job, uint64_t epochs,
                                 uint64_t seed, uint32_t consumer_index, uint32_t num_consumers,
                                 bool deterministic, bool drop_remainder, uint64_t split_size,
                                 const std::optional<py::bytes>& restore, const std::string& finish,
                                 int32_t priority, uint32_t min_workers,
                                 const std::vector<py::bytes>& restore_states,
                                 const std::string& sharing, const std::string& cache) {
  if (num_consumers == 0 || consumer_index >= num_consumers) {
    ThrowStatus(absl::InvalidArgumentError(absl::StrCat("consumer_index ", consumer_index,
                                                        " must be < num_consumers ", num_consumers,
                                                        " (and num_consumers > 0)")));
  }
  JobOptions options;
  options.job_name = job;
  options.pipeline = ValueOrThrow(ToPipeline(spec, spec_is_file, data));
  if (!finish.empty()) options.pipeline.set_finish(finish);
  options.seed = seed;
  options.num_epochs = epochs;
  options.num_consumers = num_consumers;
  options.consumer_index = consumer_index;
  options.deterministic = deterministic;
  options.drop_remainder = drop_remainder;
  options.split_size = split_size;
  options.priority = priority;
  options.min_workers = min_workers;
  options.sharing = sharing;
  options.cache = cache;
  if (restore.has_value()) {
    options.restore_state = std::string(*restore);
  }
  for (const py::bytes& state : restore_states)
    options.restore_states.push_back(std::string(state));
  absl::StatusOr<std::unique_ptr<BatchIterator>> it;
  {
    py::gil_scoped_release release;
    it = client.client()->Open(options);
  }
  client.warnings()->HandToPython();
  return std::make_unique<PyIterator>(client.client(), client.warnings(),
                                      ValueOrThrow(std::move(it)));
}

// The parsed pipeline as protobuf JSON (what the service receives).
std::string PipelineJson(const std::string& spec, bool is_file, const std::string& data) {
  proto::Pipeline pipeline = ValueOrThrow(ToPipeline(spec, is_file, data));
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  const auto status = google::protobuf::util::MessageToJsonString(pipeline, &json, options);
  if (!status.ok()) {
    ThrowStatus(absl::InternalError(
        absl::StrCat("cannot print the pipeline as JSON: ",
                     std::string(status.message().data(), status.message().size()))));
  }
  return json;
}

}  // namespace
}  // namespace sluice::python

PYBIND11_MODULE(_sluice, m) {
  using namespace sluice::python;
  m.doc() =
      "The C++ half of the sluice package; use `sluice` (sluice.Client), not "
      "this module.";
  py::class_<PyClient>(m, "Client")
      .def(py::init(&CreateClient), py::arg("dispatcher"), py::arg("timeout"), py::arg("tls"),
           py::arg("dispatcher_lost_timeout") =
               absl::ToDoubleSeconds(sluice::ClientOptions().dispatcher_lost_timeout),
           py::arg("shared_memory_mb") = sluice::ClientOptions().shared_memory_bytes >> 20)
      .def("open", &Open, py::arg("spec"), py::arg("spec_is_file"), py::arg("data"), py::arg("job"),
           py::arg("epochs"), py::arg("seed"), py::arg("consumer_index"), py::arg("num_consumers"),
           py::arg("deterministic"), py::arg("drop_remainder"), py::arg("split_size"),
           py::arg("restore_state"), py::arg("finish") = "", py::arg("priority") = 0,
           py::arg("min_workers") = 0, py::arg("restore_states") = std::vector<py::bytes>{},
           py::arg("sharing") = "", py::arg("cache") = "");
  py::class_<PyIterator>(m, "Iterator")
      .def("next", &PyIterator::Next)
      .def("save_state", &PyIterator::SaveState)
      .def("close", &PyIterator::Close)
      .def_property_readonly("epoch", &PyIterator::epoch)
      .def_property_readonly("wait_seconds", &PyIterator::wait_seconds)
      .def_property_readonly("buffered_batches", &PyIterator::buffered_batches)
      .def_property_readonly("duplicate_batches", &PyIterator::duplicate_batches)
      .def_property_readonly("job_id", &PyIterator::job_id)
      .def("last_batch_info", &PyIterator::last_batch_info)
      .def("last_addresses", &PyIterator::last_addresses);
  m.def("pipeline_json", &PipelineJson, py::arg("spec"), py::arg("is_file"), py::arg("data") = "");
  m.def(
      "op_fields",
      [] {
        std::vector<std::string> fields;
        const google::protobuf::OneofDescriptor* op =
            sluice::proto::OpSpec::descriptor()->FindOneofByName("op");
        for (int i = 0; i < op->field_count(); ++i) {
          fields.push_back(op->field(i)->name());
        }
        return fields;
      },
      "The spec name of every op (the cases of proto/ops.proto's OpSpec; "
      "the worker's op registry has one row for each).");
  m.def(
      "raise_status",
      [](int code, const std::string& message) {
        ThrowStatus(absl::Status(static_cast<absl::StatusCode>(code), message));
      },
      py::arg("code"), py::arg("message"),
      "Raises the sluice.Error of an absl status code (for tests).");
}

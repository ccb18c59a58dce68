#!/usr/bin/env bash
# Writes the checked-in seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/) from text:
# protos through `protoc --encode`, images from tests/fuzz/seed_images/. Rerun after a proto
# change and commit the result:  tests/fuzz/make_seeds.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="$root/tests/fuzz/corpus"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
enc() { protoc -I"$root/proto" --encode="sluice.$1" "$root/proto/$2"; }
# u8 call | u16le length | bytes, as dispatcher_fuzzer.cc reads them.
frame() {
  local call=$1 file=$2 n
  n=$(stat -c %s "$file")
  printf "\\x$(printf %02x "$call")\\x$(printf %02x $((n & 255)))\\x$(printf %02x $((n >> 8)))"
  cat "$file"
}
mkdir -p "$out"/{pipeline_spec,worker_pipeline,filter,decode,tfrecord,webdataset,dispatcher,batch}_fuzzer

# Pipelines, as YAML and JSON (pipeline_spec) and as the worker receives them (worker_pipeline).
cat >"$out/pipeline_spec_fuzzer/train.yaml" <<'Y'
seed: 3
on_error: skip
source: {synthetic: {num_records: 16, height: 24, width: 20}, columns: [image, label]}
nodes:
  - shuffle: {seed: 5}
  - map:
      input_columns: [image]
      ops:
        - decode: {}
        - random_resized_crop: {size: 16}
        - random_horizontal_flip: {}
        - normalize: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}
        - hwc2chw: {}
      num_parallel_workers: AUTOTUNE
  - filter: {predicate: "label in [1, 3]"}
  - batch: {size: 8, drop_remainder: true}
  - prefetch: {buffer_size: 4}
Y
cat >"$out/pipeline_spec_fuzzer/eval.json" <<'J'
{"source": {"synthetic": {"num_records": 8}, "columns": ["image", "label"]},
 "nodes": [{"map": {"input_columns": ["image"],
                    "ops": [{"decode": {}}, {"resize": {"size": 20}}, {"center_crop": {"size": 16}}]}},
           {"batch": {"size": 4}}]}
J
cat >"$tmp/p.txt" <<'T'
seed: 3
source { synthetic { num_records: 16 height: 24 width: 20 } columns: "image" columns: "label" }
nodes { map { input_columns: "image" ops { decode {} } ops { center_crop { size: 16 } } } }
nodes { batch { size: 4 } }
T
enc proto.Pipeline pipeline.proto <"$tmp/p.txt" >"$out/worker_pipeline_fuzzer/synthetic.pb"
cp "$out/worker_pipeline_fuzzer/synthetic.pb" "$tmp/pipeline.pb"

printf 'label == 3' >"$out/filter_fuzzer/eq"
printf 'label in [1, 4]' >"$out/filter_fuzzer/in"
printf 'score >= 0.5' >"$out/filter_fuzzer/float"
printf 'big != -9007199254740993' >"$out/filter_fuzzer/big"

# decode: 8 plan bytes, then the image. The images are CPython's test images (Lib/test/
# imghdrdata, PSF license), small and valid; python.bmp and python.webp are python.png scaled to
# 24x16 and saved by PIL (every format the decoder accepts has a seed).
cp "$root/tests/fuzz/seed_images/python.jpg" "$tmp/a.jpg"
cp "$root/tests/fuzz/seed_images/python.png" "$tmp/c.png"
cp "$root/tests/fuzz/seed_images/python.bmp" "$tmp/b.bmp"
cp "$root/tests/fuzz/seed_images/python.webp" "$tmp/d.webp"
for f in a.jpg c.png b.bmp d.webp; do
  { printf '\x01\x02\x05\x07\x08\x06\x01\x03'; cat "$tmp/$f"; } >"$out/decode_fuzzer/$f"
done

# tfrecord: mode byte 1 (frame the records), then u16le length | tf.train.Example.
for label in 3 7; do
  {
    printf 'features { feature { key: "image/encoded" value { bytes_list { value: "'
    od -An -v -tx1 "$tmp/a.jpg" | tr -d ' \n' | sed 's/../\\x&/g'
    printf '" } } } feature { key: "image/class/label" value { int64_list { value: %s } } } }\n' "$label"
  } | enc tf.Example tf_example.proto >"$tmp/ex$label.pb"
done
{
  printf '\x01'
  for label in 3 7; do
    n=$(stat -c %s "$tmp/ex$label.pb")
    printf "\\x$(printf %02x $((n & 255)))\\x$(printf %02x $((n >> 8)))"
    cat "$tmp/ex$label.pb"
  done
} >"$out/tfrecord_fuzzer/two_examples"

# webdataset: a tar of two samples (jpg + cls).
mkdir -p "$tmp/wds"
cp "$tmp/a.jpg" "$tmp/wds/s000.jpg"; printf 3 >"$tmp/wds/s000.cls"
cp "$tmp/c.png" "$tmp/wds/s001.png"; printf 7 >"$tmp/wds/s001.cls"
tar -C "$tmp/wds" --format=ustar --owner=0 --group=0 --mtime=@0 \
  -cf "$out/webdataset_fuzzer/two_samples.tar" s000.jpg s000.cls s001.png s001.cls

# dispatcher: register a dataset, a job, a worker; heartbeats; a tick.
{
  printf 'shard_record_counts: [10, 6] batch_size: 2 pipeline: "'
  od -An -v -tx1 "$tmp/pipeline.pb" | tr -d ' \n' | sed 's/../\\x&/g'
  printf '"\n'
} | enc proto.RegisterDatasetRequest dispatcher.proto >"$tmp/d0"
echo 'job_name: "j" dataset_id: 1 config { num_consumers: 2 split_size: 4 num_epochs: 2 }' |
  enc proto.GetOrCreateJobRequest dispatcher.proto >"$tmp/d1"
echo 'job_id: 1 consumer_index: 0' | enc proto.ClientHeartbeatRequest dispatcher.proto >"$tmp/d2"
echo 'address: "w:1" capacity: 4' | enc proto.WorkerRegisterRequest worker.proto >"$tmp/d3"
echo 'worker_id: 1 known_job_ids: 1' | enc proto.WorkerHeartbeatRequest worker.proto >"$tmp/d4"
echo 'worker_id: 1 splits { key { job_id: 1 consumer_index: 0 epoch: 0 position: 0 } produced_batches: 2 finished_producing: true }' |
  enc proto.WorkerHeartbeatRequest worker.proto >"$tmp/d4b"
echo 'job_id: 1' | enc proto.GetJobStateRequest dispatcher.proto >"$tmp/d7"
printf '\x0b' >"$tmp/d8"
{
  frame 0 "$tmp/d0"; frame 1 "$tmp/d1"; frame 2 "$tmp/d2"; frame 3 "$tmp/d3"; frame 4 "$tmp/d4"
  frame 4 "$tmp/d4b"; frame 7 "$tmp/d7"; frame 8 "$tmp/d8"; frame 4 "$tmp/d4"
} >"$out/dispatcher_fuzzer/job_and_worker"
echo 'address: "w:2"' | enc proto.WorkerRegisterRequest worker.proto >"$tmp/d3b"
echo 'worker_id: 1' | enc proto.DrainWorkerRequest dispatcher.proto >"$tmp/d6"
echo 'worker_id: 1' | enc proto.WorkerUnregisterRequest dispatcher.proto >"$tmp/d5"
{ frame 3 "$tmp/d3"; frame 3 "$tmp/d3b"; frame 6 "$tmp/d6"; frame 5 "$tmp/d5"; frame 8 "$tmp/d8"; } \
  >"$out/dispatcher_fuzzer/workers"

# batch: frames (common/service/batch_codec.h) of a data batch of 2 elements and of an
# end-of-split marker; the fuzzer's first byte picks the slice length (here 8).
batch_frame() {  # header file, column bytes (printf format) -> stdout
  local n; n=$(stat -c %s "$1")
  printf '\x07'
  printf "\\x$(printf %02x $((n & 255)))\\x$(printf %02x $((n >> 8 & 255)))\\x00\\x00"
  cat "$1"
  printf "$2"
}
cat >"$tmp/b.txt" <<'T'
key { job_id: 1 consumer_index: 0 epoch: 0 position: 3 } split_id: 4 batch_index: 1
columns { name: "image" dtype: TENSOR_DTYPE_UINT8 shape: [2, 2, 1] data_length: 4 }
columns { name: "label" dtype: TENSOR_DTYPE_INT64 shape: [2] data_length: 16 }
global_indices: [12, 5]
T
enc proto.Batch worker_service.proto <"$tmp/b.txt" >"$tmp/b.bin"
batch_frame "$tmp/b.bin" '\001\002\003\004\003\000\000\000\000\000\000\000\007\000\000\000\000\000\000\000' \
  >"$out/batch_fuzzer/two_elements"
# ... and one whose uint8 [2, 2, 2, 3] image column the client finishes (normalize + hwc2chw).
cat >"$tmp/f.txt" <<'T'
key { job_id: 1 position: 3 } split_id: 4 batch_index: 0
columns { name: "image" dtype: TENSOR_DTYPE_UINT8 shape: [2, 2, 2, 3] data_length: 24 }
global_indices: [1, 2]
finish { column: 0 ops { normalize { mean: [0.5, 0.4, 0.3] std: [0.2, 0.2, 0.2] } } ops { hwc2chw {} } }
T
enc proto.Batch worker_service.proto <"$tmp/f.txt" >"$tmp/f.bin"
batch_frame "$tmp/f.bin" '\001\002\003\004\005\006\007\010\011\012\013\014\015\016\017\020\021\022\023\024\025\026\027\030' \
  >"$out/batch_fuzzer/finish_normalize"
echo 'split_id: 4 batch_index: 2 end_of_split: true' | enc proto.Batch worker_service.proto >"$tmp/m.bin"
batch_frame "$tmp/m.bin" '' >"$out/batch_fuzzer/end_of_split"
# journal: u16le length | bytes records, as journal_fuzzer.cc reads them: the snapshot (empty:
# none), then proto::Update records (a dataset, a job over it, a worker and an assignment).
rec() { local n; n=$(stat -c %s "$1"); printf "\\x$(printf %02x $((n & 255)))\\x$(printf %02x $((n >> 8)))"; cat "$1"; }
mkdir -p "$out/journal_fuzzer"
: >"$tmp/j0"
echo 'register_dataset { dataset_id: 1 fingerprint: 7 pipeline: "p" shard_record_counts: 60 shard_record_counts: 40 batch_size: 10 }' |
  enc proto.Update dispatcher.proto >"$tmp/j1"
echo 'create_job { job_id: 1 job_name: "alice/train" dataset_id: 1 config { mode: PROCESSING_MODE_DISTRIBUTED_EPOCH remainder: REMAINDER_MODE_PAD num_consumers: 2 split_size: 20 num_epochs: 2 } }' |
  enc proto.Update dispatcher.proto >"$tmp/j2"
echo 'register_worker { worker_id: 1 address: "w:1" capacity: 2 }' | enc proto.Update dispatcher.proto >"$tmp/j3"
echo 'assign_split { key { job_id: 1 consumer_index: 0 epoch: 0 position: 0 } worker_id: 1 }' |
  enc proto.Update dispatcher.proto >"$tmp/j4"
{ rec "$tmp/j0"; rec "$tmp/j1"; rec "$tmp/j2"; rec "$tmp/j3"; rec "$tmp/j4"; } >"$out/journal_fuzzer/job_and_worker"

# Saved iterator states (restore_state_fuzzer): mid-epoch with returned and complete slots, and
# at an epoch boundary.
mkdir -p "$out"/{restore_state,get_batches,image_folder}_fuzzer
echo 'version: 1 job_id: 3 job_name: "fuzz" consumer_index: 1 num_consumers: 2 epoch: 1
  splits { epoch: 1 position: 0 delivered_batches: 2 complete: true }
  splits { epoch: 1 position: 3 delivered_batches: 1 } job_fingerprint: 24301' |
  enc proto.ConsumerCheckpoint dispatcher.proto >"$out/restore_state_fuzzer/mid_epoch"
echo 'version: 1 job_id: 3 job_name: "fuzz" consumer_index: 0 num_consumers: 4 epoch: 2' |
  enc proto.ConsumerCheckpoint dispatcher.proto >"$out/restore_state_fuzzer/epoch_boundary"
# GetBatches requests (get_batches_fuzzer): a consumer of job 1 holding splits.
echo 'protocol_version: 3 job_id: 1 consumer_index: 1
  held { key { job_id: 1 consumer_index: 1 epoch: 0 position: 2 } batches: 3 }
  held { key { job_id: 1 consumer_index: 1 epoch: 0 position: 5 } batches: 1 complete: true }' |
  enc proto.GetBatchesRequest worker_service.proto >"$out/get_batches_fuzzer/held_splits"
echo 'protocol_version: 3 job_id: 2' | enc proto.GetBatchesRequest worker_service.proto \
  >"$out/get_batches_fuzzer/development_job"
# Image folders (image_folder_fuzzer.cc's format): kind | name length | name | (file) u16le size
# | bytes, (symlink) target length | target.
entry_file() {
  local name=$1 file=$2 n
  n=$(stat -c %s "$file")
  printf "\\x00\\x$(printf %02x ${#name})%s\\x$(printf %02x $((n & 255)))\\x$(printf %02x $((n >> 8)))" "$name"
  cat "$file"
}
entry_link() {
  printf "\\x02\\x$(printf %02x ${#1})%s\\x$(printf %02x ${#2})%s" "$1" "$2"
}
{ entry_file cat/a.jpg "$root/tests/fuzz/seed_images/python.jpg"
  entry_file dog/sub/b.png "$root/tests/fuzz/seed_images/python.png"
  entry_link cat/c.jpg a.jpg; } >"$out/image_folder_fuzzer/two_classes_and_a_link"
{ entry_file cat/a.jpg "$root/tests/fuzz/seed_images/python.jpg"
  entry_link cat/out.jpg ../../../outside/secret.jpg
  entry_link cat/loop.jpg loop.jpg
  entry_link dog dog; } >"$out/image_folder_fuzzer/links_out_and_loops"

echo "seeds in $out"

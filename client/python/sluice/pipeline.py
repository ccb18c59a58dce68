"""Building a pipeline in Python: the mirror of the C++ PipelineBuilder (sluice/pipeline_builder.h).

A pipeline is the same thing whether it is written as YAML, JSON or built here: the builder
produces the JSON form of the sluice.proto.Pipeline message, which the C++ spec parser reads::

    from sluice import AUTOTUNE, IMAGENET_MEAN, IMAGENET_STD, Pipeline, ops

    train = (Pipeline()
             .dataset("/data/imagenet-train")
             .columns(["image", "label"])
             .shuffle(seed=0)
             .map(["image"], [ops.decode(), ops.random_resized_crop(224),
                              ops.random_horizontal_flip(),
                              ops.normalize(IMAGENET_MEAN, IMAGENET_STD), ops.hwc2chw()])
             .batch(64)
             .prefetch(AUTOTUNE))
    client.open(train, job="run3")

Validation happens where the pipeline is parsed and run, with errors naming the node
(``map[0].ops[1] ...``), raised as sluice.InvalidArgument.
"""
from __future__ import annotations

import copy
import json
from typing import Any, Dict, List, Optional, Sequence

#: Let the autotuner choose (num_parallel_workers, buffer_size).
AUTOTUNE = -1
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

Op = Dict[str, Dict[str, Any]]


class Pipeline:
    """A pipeline spec built node by node, in the order written. Methods return self.

    Not thread-safe; ``copy()`` before branching. ``to_json()`` gives the spec text that
    ``Client.open`` and ``sluice pipeline run --spec`` accept.
    """

    def __init__(self) -> None:
        self._spec: Dict[str, Any] = {"source": {}, "nodes": []}

    # --- Source (one of) ---
    def dataset(self, path: str) -> "Pipeline":
        """Reads a Unirecord dataset folder (`sluice record convert` writes one)."""
        self._set_source("dataset", {"path": str(path)})
        return self

    def image_folder(self, path: str) -> "Pipeline":
        """Reads an ImageFolder tree directly (in-process runs; the service reads Unirecord)."""
        self._set_source("image_folder", {"path": str(path)})
        return self

    def synthetic(self, num_records: int, height: int = 256, width: int = 256,
                  num_classes: int = 10) -> "Pipeline":
        """Generates random images in memory (benchmarks, tests)."""
        self._set_source("synthetic", {"num_records": num_records, "height": height,
                                       "width": width, "num_classes": num_classes})
        return self

    def columns(self, columns: Sequence[str]) -> "Pipeline":
        """Source columns to emit (default: all)."""
        self._spec["source"].setdefault("columns", []).extend(columns)
        return self

    def source_workers(self, n: int) -> "Pipeline":
        self._spec["source"]["num_parallel_workers"] = n
        return self

    def seed(self, seed: int) -> "Pipeline":
        """Seed of the random ops (the job's seed is given to Client.open)."""
        self._spec["seed"] = seed
        return self

    def on_error(self, policy: str) -> "Pipeline":
        """"fail" (default: a corrupt record stops the epoch) or "skip" (drop and count)."""
        self._spec["on_error"] = policy
        return self

    def finish(self, where: str) -> "Pipeline":
        """Where normalize [, hwc2chw] [, cast to float32] before the batch runs when served:
        "auto" (default), "worker" or "client" (the arrays are the same either way)."""
        self._spec["finish"] = where
        return self

    # --- Nodes ---
    def shuffle(self, seed: int = 0) -> "Pipeline":
        self._spec["nodes"].append({"shuffle": {"seed": seed}})
        return self

    def map(self, input_columns: Sequence[str], ops: Sequence[Op],
            output_columns: Optional[Sequence[str]] = None,
            num_parallel_workers: int = AUTOTUNE) -> "Pipeline":
        """Runs `ops` (from sluice.ops) on `input_columns`, in order."""
        node: Dict[str, Any] = {"input_columns": list(input_columns),
                                "ops": [copy.deepcopy(op) for op in ops],
                                "num_parallel_workers": num_parallel_workers}
        if output_columns:
            node["output_columns"] = list(output_columns)
        self._spec["nodes"].append({"map": node})
        return self

    def filter(self, predicate: str) -> "Pipeline":
        """Keeps elements matching e.g. ``"label in [1, 4]"``."""
        self._spec["nodes"].append({"filter": {"predicate": predicate}})
        return self

    def cache(self, name: str) -> "Pipeline":
        """Adds a cache node (docs/cache.md): the first epoch writes the elements reaching it,
        later epochs and jobs with the same prefix read them. Returns this pipeline."""
        self._spec["nodes"].append({"cache": {"name": name}})
        return self

    def batch(self, size: int, drop_remainder: bool = False) -> "Pipeline":
        self._spec["nodes"].append({"batch": {"size": size, "drop_remainder": drop_remainder}})
        return self

    def prefetch(self, buffer_size: int = AUTOTUNE) -> "Pipeline":
        self._spec["nodes"].append({"prefetch": {"buffer_size": buffer_size}})
        return self

    # --- Output ---
    def to_dict(self) -> Dict[str, Any]:
        """The spec as a dict in the YAML/JSON layout (a deep copy)."""
        return copy.deepcopy(self._spec)

    def to_json(self) -> str:
        """The spec as JSON text: what Client.open sends to the parser."""
        return json.dumps(self._spec)

    def copy(self) -> "Pipeline":
        other = Pipeline()
        other._spec = self.to_dict()
        return other

    def __repr__(self) -> str:
        return "sluice.Pipeline(%s)" % self.to_json()

    def _set_source(self, kind: str, value: Dict[str, Any]) -> None:
        source = self._spec["source"]
        for other in ("dataset", "image_folder", "synthetic"):
            source.pop(other, None)
        source[kind] = value


class ops:  # noqa: N801 (a namespace, like the C++ free functions)
    """The ops of a map node (proto/ops.proto documents each; unset fields take torchvision's
    defaults). Each returns the op's spec, e.g. ``{"resize": {"size": 256}}``.

    ``interpolation`` is "nearest", "bilinear", "bicubic" or "area".
    """

    @staticmethod
    def decode(*, idct: Optional[str] = None, fast_upsampling: Optional[bool] = None) -> Op:
        """Encoded JPEG/PNG/BMP/WebP bytes → uint8 HWC RGB image.

        The defaults decode JPEGs as accurately as libjpeg can (as PIL does). ``idct`` "fast" or
        "float" and ``fast_upsampling=True`` trade a little fidelity for speed (docs/BENCHMARKS.md
        measures both: a few percent at most).
        """
        return {"decode": _fields(idct=None if idct is None else "IDCT_" + idct.upper(),
                                  fast_upsampling=fast_upsampling)}

    @staticmethod
    def resize(size: Optional[int] = None, *, height: Optional[int] = None,
               width: Optional[int] = None, interpolation: Optional[str] = None) -> Op:
        """Shorter side to `size` (aspect kept), or exactly height x width."""
        return {"resize": _fields(size=size, height=height, width=width,
                                  interpolation=_interp(interpolation))}

    @staticmethod
    def center_crop(size: Optional[int] = None, *, height: Optional[int] = None,
                    width: Optional[int] = None) -> Op:
        return {"center_crop": _fields(size=size, height=height, width=width)}

    @staticmethod
    def random_resized_crop(size: Optional[int] = None, *, height: Optional[int] = None,
                            width: Optional[int] = None,
                            scale: Optional[Sequence[float]] = None,
                            ratio: Optional[Sequence[float]] = None,
                            interpolation: Optional[str] = None) -> Op:
        f = _fields(size=size, height=height, width=width, interpolation=_interp(interpolation))
        if scale is not None:
            f["scale_min"], f["scale_max"] = scale
        if ratio is not None:
            f["ratio_min"], f["ratio_max"] = ratio
        return {"random_resized_crop": f}

    @staticmethod
    def random_crop(size: Optional[int] = None, *, padding: int = 0,
                    height: Optional[int] = None, width: Optional[int] = None,
                    pad_if_needed: bool = False) -> Op:
        return {"random_crop": _fields(size=size, height=height, width=width,
                                       padding=padding or None,
                                       pad_if_needed=pad_if_needed or None)}

    @staticmethod
    def random_horizontal_flip(p: Optional[float] = None) -> Op:
        return {"random_horizontal_flip": _fields(p=p)}

    @staticmethod
    def random_rotation(degrees: float, *, interpolation: Optional[str] = None,
                        fill: Optional[float] = None) -> Op:
        return {"random_rotation": _fields(degrees=degrees, interpolation=_interp(interpolation),
                                           fill=fill)}

    @staticmethod
    def color_jitter(brightness: float = 0, contrast: float = 0, saturation: float = 0,
                     hue: float = 0) -> Op:
        return {"color_jitter": {"brightness": brightness, "contrast": contrast,
                                 "saturation": saturation, "hue": hue}}

    @staticmethod
    def normalize(mean: Sequence[float], std: Sequence[float]) -> Op:
        """uint8 or float image → float32 (x/255 - mean) / std, per channel."""
        return {"normalize": {"mean": list(mean), "std": list(std)}}

    @staticmethod
    def hwc2chw() -> Op:
        return {"hwc2chw": {}}

    @staticmethod
    def cast(dtype: str, scale: bool = False) -> Op:
        """To "uint8", "int32", "int64", "float16" or "float32" (scale: uint8 ↔ [0, 1])."""
        return {"cast": {"dtype": dtype, "scale": scale}}

    @staticmethod
    def one_hot(num_classes: int) -> Op:
        return {"one_hot": {"num_classes": num_classes}}

    @staticmethod
    def spin(cpu_micros: int) -> Op:
        """Burns CPU (benchmarks)."""
        return {"spin": {"cpu_micros": cpu_micros}}

    @staticmethod
    def sleep(micros: int) -> Op:
        """Sleeps (tests, benchmarks)."""
        return {"sleep": {"micros": micros}}

    @staticmethod
    def python(module: str, function: str,
               output_dtypes: Optional[Sequence[str]] = None,
               group: Optional[int] = None) -> Op:
        """A user function run in the workers' Python processes (docs/python.md).

        The worker imports ``module`` (from its image or ``--python-path``; it refuses the op
        unless started with ``--allow-python-ops``) and calls
        ``function(*columns, rng=numpy.random.Generator)`` with the map's input columns as
        numpy arrays; it returns one array or a tuple, one per column. Only the two names are
        sent, never code. ``output_dtypes``: one per column (default: each input's dtype).
        ``group``: elements handed to a Python process per request (default 8; 1 = one
        element per request); the function is still called once per element.
        Returns the op as a dict.
        """
        if isinstance(output_dtypes, str):  # list() would make one dtype per letter
            raise ValueError("output_dtypes: a list with one dtype per column, got the string "
                             "%r (write [%r])" % (output_dtypes, output_dtypes))
        fields: Dict[str, Any] = {"module": module, "function": function}
        if output_dtypes:
            fields["output_dtypes"] = list(output_dtypes)
        if group is not None:
            fields["group"] = group
        return {"python": fields}


def _fields(**kwargs: Any) -> Dict[str, Any]:
    return {k: v for k, v in kwargs.items() if v is not None}


def _interp(name: Optional[str]) -> Optional[str]:
    return None if name is None else "INTERPOLATION_" + name.upper()


__all__: List[str] = ["AUTOTUNE", "IMAGENET_MEAN", "IMAGENET_STD", "Pipeline", "ops"]

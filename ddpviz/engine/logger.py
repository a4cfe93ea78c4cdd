"""DDP's logging data: the dict torch's `_get_ddp_logging_data()` returns, kept the same way.

Construction data is set once; runtime stats are sampled when a synced forward starts (the first
10 iterations, then every 100th), so, as in torch, what a backward did shows up at the next
forward. Timings are host wall-clock nanoseconds.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ddpviz.engine.reducer import Reducer

SAMPLE_RATE = 100  # torch's kDDPRuntimeLoggingSampleRate

# caffe2 TypeMeta names, which is what torch's logger prints for dtypes.
_TYPE_NAMES = {
    torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16", torch.int64: "long int", torch.int32: "int",
    torch.int16: "short int", torch.int8: "signed char", torch.uint8: "unsigned char",
    torch.bool: "bool", torch.complex64: "c10::complex<float>",
    torch.complex128: "c10::complex<double>",
}

_ENV_STRS = (("MASTER_ADDR", "master_addr"), ("MASTER_PORT", "master_port"),
             ("TORCH_DISTRIBUTED_DEBUG", "torch_distributed_debug"),
             ("CUDA_VISIBLE_DEVICES", "cuda_visible_devices"),
             ("GLOO_SOCKET_IFNAME", "gloo_socket_ifname"),
             ("GLOO_DEVICE_TRANSPORT", "gloo_device_transport"))

_TIMES = ("forward_compute_time", "backward_compute_time", "backward_comm_time",
          "backward_compute_comm_overlap_time")


class DDPLogger:
    """Collects what torch's c10d Logger collects, for `DistributedDataParallel.logging_data`."""

    def __init__(self, reducer: Reducer) -> None:
        self.reducer = reducer
        self.strs: dict[str, str] = {}
        self.ints: dict[str, int] = {}
        self.sample_rate = SAMPLE_RATE
        self._samples = 0
        self._sums = dict.fromkeys(_TIMES, 0)
        # Timestamps (ns) of the iteration being measured.
        self.forward_start = 0
        self.backward_compute_start = 0
        self.backward_compute_end = 0
        self.backward_comm_start = 0
        self.backward_comm_end = 0

    def set_construction_data(self, *, module_name: str, device_ids: list[int],
                              output_device: int, broadcast_buffers: bool, has_sync_bn: bool,
                              static_graph: bool, backend_name: str, world_size: int,
                              rank: int, bucket_cap_bytes: int, find_unused_parameters: bool,
                              gradient_as_bucket_view: bool) -> None:
        params = self.reducer.params
        for env, key in _ENV_STRS:
            self.strs[key] = os.environ.get(env, "N/A")
        self.strs["backend_name"] = backend_name
        self.strs["module_name"] = module_name
        self.strs["device_ids"] = ", ".join(str(d) for d in device_ids)
        self.strs["dtypes"] = ", ".join(sorted({_TYPE_NAMES.get(p.dtype, str(p.dtype))
                                                 for p in params}))
        self.strs["bucket_sizes"] = ", ".join(str(s) for s in self.bucket_sizes())
        self.ints.update(
            world_size=world_size, rank=rank, iteration=0,
            num_parameter_tensors=len(params),
            total_parameter_size_bytes=sum(p.numel() * p.element_size() for p in params),
            is_multi_device_module=int(len({p.device for p in params}) > 1),
            output_device=output_device, broadcast_buffers=int(broadcast_buffers),
            has_sync_bn=int(has_sync_bn), bucket_cap_bytes=bucket_cap_bytes,
            find_unused_parameters=int(find_unused_parameters),
            gradient_as_bucket_view=int(gradient_as_bucket_view))
        if static_graph:
            self.ints["static_graph"] = 1

    def bucket_sizes(self) -> list[int]:
        return [sum(p.numel() * p.element_size() for p in b.params)
                for b in self.reducer.buckets]

    def should_collect(self) -> bool:
        n = self.reducer.num_iterations
        return n > 0 and (n <= 10 or n % self.sample_rate == 0)

    def set_runtime_stats(self) -> None:
        """Called as a synced forward starts, before the rebuild (torch's order)."""
        if not self.should_collect():
            return
        r = self.reducer
        self.ints["iteration"] = r.num_iterations
        if r.find_unused_parameters or r.unused_parameters:
            self.ints["unused_parameter_size"] = sum(
                r.params[i].numel() * r.params[i].element_size() for i in r.unused_parameters)
        else:
            self.ints.setdefault("unused_parameter_size", 0)
        if self.ints.get("has_rebuilt_buckets") != int(r.has_rebuilt_bucket):
            self.ints["has_rebuilt_buckets"] = int(r.has_rebuilt_bucket)
            if r.has_rebuilt_bucket:
                self.strs["rebuilt_bucket_sizes"] = ", ".join(str(s) for s in
                                                               self.bucket_sizes())
                self.strs["rebuilt_per_bucket_param_indices"] = ", ".join(
                    " ".join(str(i) for i in b) for b in r.bucket_indices())
        if r.grad_ready_order:
            self.strs["prev_iteration_grad_ready_order_indices"] = ", ".join(
                str(i) for i in r.grad_ready_order)
        self.ints["num_buckets_reduced"] = r.num_buckets_reduced
        if self.backward_comm_end:
            self._record_times()

    def _record_times(self) -> None:
        t = {
            "forward_compute_time": self.backward_compute_start - self.forward_start,
            "backward_compute_time": self.backward_compute_end - self.backward_compute_start,
            "backward_comm_time": self.backward_comm_end - self.backward_comm_start,
            "backward_compute_comm_overlap_time":
                max(0, self.backward_compute_end - self.backward_comm_start),
        }
        self._samples += 1
        for k, v in t.items():
            self.ints[k] = v
            self._sums[k] += v
            self.ints["avg_" + k] = self._sums[k] // self._samples
        self.ints.update(forward_compute_time_start=self.forward_start,
                         backward_compute_time_start=self.backward_compute_start,
                         backward_compute_time_end=self.backward_compute_end,
                         backward_comm_time_start=self.backward_comm_start,
                         backward_comm_time_end=self.backward_comm_end)
        self.backward_comm_end = 0

    def set_error(self, message: str) -> None:
        """torch's `set_error_and_log`: the error that stopped training, in the logging data."""
        self.ints["has_error"] = 1
        self.strs["error"] = message

    @staticmethod
    def now() -> int:
        return time.time_ns()

    def data(self) -> dict[str, Any]:
        return {**self.strs, **self.ints}

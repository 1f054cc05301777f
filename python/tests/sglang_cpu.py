"""SGLang 0.5.23's CPU-runnable classes, imported once for the tests that
drive kvtier.sglang with them (test_sglang_real.py, test_sglang.py), and
its host pools built on the CPU.

torchvision: see kvtier._sglang_cpu (a stand-in for SGLang's imports only,
when no working torchvision imports)."""
from __future__ import annotations

import sys

import torch

from kvtier._sglang_cpu import torchvision_for_sglang

torchvision_for_sglang()

import torch.distributed as dist  # noqa: E402
from sglang.srt.managers.cache_controller import HiCacheController  # noqa: E402
from sglang.srt.mem_cache import hicache_storage as hs  # noqa: E402
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402
from sglang.srt.mem_cache.utils import get_storage_hash_str  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402


import torch.distributed as dist  # noqa: E402,F401
from sglang.srt.managers.cache_controller import HiCacheController  # noqa: E402,F401
from sglang.srt.mem_cache import hicache_storage as hs  # noqa: E402,F401
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402,F401
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController  # noqa: E402,F401
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402,F401
from sglang.srt.mem_cache.utils import get_storage_hash_str  # noqa: E402,F401
from sglang.srt.runtime_context import get_parallel  # noqa: E402,F401

for _name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
    if type(sys.modules[_name]).__name__ == "Module":  # the stand-in: later probes find nothing, as is true
        del sys.modules[_name]


def host_pool(kind: str, layout: str, device_tokens: int, page_size: int = 4, layers: int = 3,
              dtype=torch.bfloat16, head_num: int = 2, head_dim: int = 8):
    """SGLang's device pool on the CPU and the host pool SGLang builds from
    it (twice the device's tokens, unpinned memory), its pages zeroed."""
    if kind == "mha":
        dev = MHATokenToKVPool(size=device_tokens, page_size=page_size, dtype=dtype, head_num=head_num,
                               head_dim=head_dim, layer_num=layers, device="cpu", enable_memory_saver=False,
                               enable_alt_stream=False)
        host = MHATokenToKVPoolHost(dev._mha_buffer_info(), 2.0, 0, page_size, layout, pin_memory=False,
                                    device="cpu", device_capacity_tokens=device_tokens, start_layer=0,
                                    end_layer=layers)
    else:
        rope = head_dim // 2
        dev = MLATokenToKVPool(size=device_tokens, page_size=page_size, dtype=dtype,
                               kv_lora_rank=head_dim - rope, qk_rope_head_dim=rope, layer_num=layers,
                               device="cpu", enable_memory_saver=False)
        host = MLATokenToKVPoolHost(dev._mla_buffer_info(), 2.0, 0, page_size, layout, pin_memory=False,
                                    device="cpu", device_capacity_tokens=device_tokens, start_layer=0,
                                    end_layer=layers, target_layer_num=layers)
    assert not host.kv_buffer.is_pinned()
    host.kv_buffer.zero_()
    return dev, host

"""dsv4_decode: a latency-specialized decode step for DeepSeek-V4.1 (and V4) on NVIDIA GPUs."""

__version__ = "0.1.0"

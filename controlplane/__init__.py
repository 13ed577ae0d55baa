"""controlplane: safe, fast model updates for NVIDIA Triton Inference Server."""

__version__ = "0.1.0"

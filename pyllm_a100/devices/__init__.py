"""The GPUs this machine has (gpus, through NVML) and how a model is split across them (splits)."""

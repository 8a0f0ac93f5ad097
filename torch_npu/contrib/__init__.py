"""torch_npu.contrib: ``from torch_npu.contrib import transfer_to_npu`` runs CUDA scripts on npu."""

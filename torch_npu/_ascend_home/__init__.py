"""The directory npusim gives as ``ASCEND_HOME_PATH`` / ``ASCEND_TOOLKIT_HOME`` when unset.

On an Ascend machine these name the CANN toolkit's install directory; libraries read them at
start-up (DeepSpeed's NPU accelerator and op builder: ``os.environ["ASCEND_HOME_PATH"]``, a
KeyError when unset). npusim has no CANN: ``import torch_npu`` sets both to this directory when
they are unset (docs/torch.md, "The Ascend environment"). It holds no toolkit, so a library that
compiles against CANN here fails at that compile, naming the missing headers.
"""

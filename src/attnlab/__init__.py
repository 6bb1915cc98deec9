"""attnlab: the helper package of the attention-kernel book.

One registry of kernels (`attnlab.registry`), their launcher (`attention`), the references they
are checked against, the timer, the records of GPU runs and the figures drawn from them.
"""
from .contract import AttentionInputError
from .launch import attention
from .registry import KERNELS, get
from .shapes import MISSION, Shape

__all__ = ["AttentionInputError", "KERNELS", "MISSION", "Shape", "attention", "get"]

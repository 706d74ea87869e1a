"""attnmatrix: an evidence-backed compatibility matrix of attention kernels, and what it generates."""

__version__ = "0.1.0"

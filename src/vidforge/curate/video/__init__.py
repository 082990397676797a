"""Video I/O shared by the curation stages: opening a source (PyAV or NVDEC), its display geometry, and
H.264 encoding of a run of its frames."""

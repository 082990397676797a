"""`vidforge caption`'s parts: the captioners, the input checks, the stages on the executors, the
per-clip annotator (caption, clean, score) and the embedding store a caption run writes."""

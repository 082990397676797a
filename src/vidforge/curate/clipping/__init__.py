"""`vidforge clip`'s stages on a source: one decode that finds shots and static frames (and records shots as
it goes), stitching, the duration policy, the per-clip plan and the transcode that writes each clip."""

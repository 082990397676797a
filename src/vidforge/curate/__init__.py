"""Curation: raw videos to clips (`vidforge clip`): decode, shot detection, stitching, filters, transcode,
embeddings, and the executors that run these stages."""

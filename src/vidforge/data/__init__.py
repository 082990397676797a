"""Data between stages: manifests, resumable units, shards, the training loader."""
